"""RobustWarnings where the user reads them: attributed to the user's test line (``user_site``),
captured while a check runs (``captured_warnings``) and listed in its Result (``robust_messages``)."""

from __future__ import annotations

import contextlib
import sys
import warnings

from pytest_robust.errors import RobustWarning


def user_site(declared: tuple[str, int] | None = None) -> tuple[str, int] | None:
    """Where a check's warnings point: the first frame outside pytest-robust (the user's test
    body or script); when that frame is pytest's own machinery, ``declared``, the (file, line) of
    the test that declared the check (``context.RunContext.warning_site``); None when neither is known."""
    frame, name = sys._getframe(1), ""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("pytest_robust") or name in ("contextlib", "functools")):
            break
        frame = frame.f_back
    if frame is None or name.startswith(("_pytest", "pluggy", "pytest")):
        return declared
    return frame.f_code.co_filename, frame.f_lineno


@contextlib.contextmanager
def captured_warnings(declared: tuple[str, int] | None = None):
    """Capture every warning of the block into the list it yields; on exit, also when the block
    raises, re-issue each at the user's site (``user_site``; ``declared``: the declaring test's), so
    pytest shows it with the test that asked for the check, not inside pytest-robust."""
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        site = user_site(declared)
        for w in caught:
            filename, lineno = site or (w.filename, w.lineno)
            warnings.warn_explicit(w.message, w.category, filename, lineno)


def robust_messages(caught: list, earlier: list) -> list:
    """``earlier`` messages followed by the RobustWarning messages of ``caught``, each once, in order."""
    return list(dict.fromkeys(earlier + [str(w.message) for w in caught if issubclass(w.category, RobustWarning)]))
