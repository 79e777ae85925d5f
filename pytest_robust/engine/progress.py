"""Live progress of a running check: a context-local sink (``progress_sink``) that the pytest
layer installs and the procedures feed (``report_progress``); a no-op without a sink."""

from __future__ import annotations

import contextlib
import contextvars

_PROGRESS: contextvars.ContextVar = contextvars.ContextVar("robust_progress", default=None)


@contextlib.contextmanager
def progress_sink(callback):
    """Route ``report_progress`` calls made inside the block to ``callback(fields: dict)``."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def report_progress(**fields) -> None:
    """Tell the current progress sink (if any) how a long check is doing; values may be callables
    that are evaluated only when the sink decides to show them (e.g. a confidence bound)."""
    callback = _PROGRESS.get()
    if callback is not None:
        callback(fields)
