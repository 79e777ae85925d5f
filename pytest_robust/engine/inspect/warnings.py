"""RobustWarnings where the user reads them: attributed to the user's test line
(``warning_site``, ``user_site``), captured while a check runs (``captured_warnings``) and listed
in its Result (``records_warnings``)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import warnings

from pytest_robust.errors import RobustWarning

#: Where the pytest layer says a check's warnings belong: (file, line) of the test that declared it.
WARNING_SITE: contextvars.ContextVar = contextvars.ContextVar("robust_warning_site", default=None)


@contextlib.contextmanager
def warning_site(path, line: int):
    """Within the block, warnings of checks that run from pytest's own machinery (a marker or a
    YAML check) point at ``path``:``line``, the test that declared them."""
    token = WARNING_SITE.set((str(path), line))
    try:
        yield
    finally:
        WARNING_SITE.reset(token)


def user_site() -> tuple[str, int] | None:
    """Where a check's warnings point: the first frame outside pytest-robust (the user's test
    body or script); when that frame is pytest's own machinery, the declaring test's site
    (``warning_site``); None when neither is known."""
    frame, name = sys._getframe(1), ""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("pytest_robust") or name in ("contextlib", "functools")):
            break
        frame = frame.f_back
    if frame is None or name.startswith(("_pytest", "pluggy", "pytest")):
        return WARNING_SITE.get()
    return frame.f_code.co_filename, frame.f_lineno


@contextlib.contextmanager
def captured_warnings():
    """Capture every warning of the block into the list it yields; on exit, also when the block
    raises, re-issue each at the user's site (``user_site``), so pytest shows it with the test
    that asked for the check, not inside pytest-robust."""
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        site = user_site()
        for w in caught:
            filename, lineno = site or (w.filename, w.lineno)
            warnings.warn_explicit(w.message, w.category, filename, lineno)


def robust_messages(caught: list, earlier: list) -> list:
    """``earlier`` messages followed by the RobustWarning messages of ``caught``, each once, in order."""
    return list(dict.fromkeys(earlier + [str(w.message) for w in caught if issubclass(w.category, RobustWarning)]))


def records_warnings(fn):
    """Decorate a metric function: RobustWarnings issued while it runs still reach the caller
    (pytest shows them with the test) and are listed, in order, in ``details["warnings"]`` of
    the Result it returns. Every built-in metric function carries it, so it also gives them the
    keywords ``normalize=`` and ``logits=`` (``interface.accepts_interface``)."""
    from pytest_robust.engine.interface import accepts_interface

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with captured_warnings() as caught:
            result = fn(*args, **kwargs)
        messages = robust_messages(caught, [])
        if messages and hasattr(result, "details"):
            result.details["warnings"] = robust_messages(caught, result.details.get("warnings", []))
        return result

    return accepts_interface(wrapper)
