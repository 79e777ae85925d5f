"""Cancelling a run: SIGTERM is handled like Ctrl-C.

CI systems cancel a job with SIGTERM (GitLab, GitHub Actions, Kubernetes, ``timeout``), whose
default action ends the process at once, before pytest writes any report. While pytest runs
(``install`` at configure, ``restore`` at unconfigure) the first SIGTERM raises ``Terminated``, a
``KeyboardInterrupt``, in the main thread: pytest then stops as on Ctrl-C, writes every report for
the checks that finished, the check that was running is recorded as "interrupted"
(``recording.evaluate``, ``session.ResultCollector``), and the exit code is pytest's "interrupted"
(2). A second SIGTERM ends the process at once, as without pytest-robust.

Left alone: a SIGTERM handler someone else installed, a process that is not the main thread,
pytest-xdist workers (the controller stops them, and marks their tests under way as interrupted;
a worker killed on its own is reported as crashed) and torchrun
ranks (a rank that stopped on its own would leave the others waiting in a collective).
"""

from __future__ import annotations

import os
import signal
import threading


class Terminated(KeyboardInterrupt):
    """The run received SIGTERM; pytest handles it as Ctrl-C."""


def cause(interrupt: BaseException) -> str:
    """What stopped the run, for messages: "SIGTERM" or "Ctrl-C (SIGINT)"."""
    return "SIGTERM" if isinstance(interrupt, Terminated) else "Ctrl-C (SIGINT)"


def _terminate(_signum, _frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated("SIGTERM: the run was cancelled; reports are written for the checks that finished")


def install(xdist_worker: bool):
    """Handle SIGTERM like Ctrl-C in this process (module docstring); returns the handler to
    ``restore``, or None where it is left alone."""
    if (xdist_worker or int(os.environ.get("WORLD_SIZE", "1")) > 1 or not hasattr(signal, "SIGTERM")
            or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return None
    return signal.signal(signal.SIGTERM, _terminate)


def restore(previous) -> None:
    """Put back the SIGTERM handler ``install`` replaced (nothing when it left SIGTERM alone)."""
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
