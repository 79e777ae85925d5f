"""The time a check may take (the ``time_limit`` setting, seconds per check) and the time it is
projected to take.

Each ``Run`` starts a ``Clock`` from the limit of its ``context.RunContext`` (a library call's
``time_limit=``, the ``time_limit`` setting under pytest).
The procedures ask ``Clock.expired`` where they can stop with valid evidence: between steps of the
Bernoulli stream (anytime-valid bounds hold at any stopping time), between rounds of the
per-input sequential tests (undecided inputs count against the check), between looks of the q
check (inputs not evaluated count against it), between chunks of inputs of the adversarial check
(a seeded random subset of the inputs). A check the limit stopped is inconclusive unless
its bounds already decide, and says so (``Clock.annotate``). ``Clock.pace`` measures throughput
on the first steps and warns once when the whole budget would take longer than the limit (or,
without one, than ``SLOW_CHECK`` seconds).
"""

from __future__ import annotations

import time
import warnings

from pytest_robust.engine import collective
from pytest_robust.errors import RobustWarning

#: Without a time limit, a check whose budget is projected to take longer than this (seconds) warns.
SLOW_CHECK = 600.0


class Clock:
    """A check's elapsed time against its limit (``limit`` seconds, the check's ``time_limit``;
    None: none), from ``started`` (``time.perf_counter``)."""

    def __init__(self, limit: float | None = None):
        self.limit = limit
        self.started = time.perf_counter()
        self.stopped = False  # the limit stopped the check
        self._first: tuple[float, int] | None = None  # (time, work done) at the first pace point
        self._warned = False

    def elapsed(self) -> float:
        """Seconds since the check started."""
        return time.perf_counter() - self.started

    def expired(self) -> bool:
        """Whether the limit has passed (then ``stopped`` is set). Under torch.distributed the
        ranks agree (one collective, made only when a limit is set): all stop, or none."""
        if self.limit is None:
            return False
        over = collective.sum_int(int(self.elapsed() >= self.limit)) > 0
        self.stopped = self.stopped or over
        return over

    def pace(self, title: str, done: int, total: int, unit: str = "model evaluations") -> None:
        """Throughput from the first call to a later one (so the first batch's warm-up is not
        counted); warns once when the remaining ``total - done`` units at that rate would take
        the check past its limit, or past ``SLOW_CHECK`` seconds without one:

            projected = elapsed + (total - done) / rate,   rate = (done - done_0) / (t - t_0).
        """
        now = time.perf_counter()
        if self._first is None or done < self._first[1]:  # a check's next stream starts its count again
            self._first = (now, done)
            return
        t0, d0 = self._first
        if self._warned or done <= d0 or now <= t0:
            return
        rate = (done - d0) / (now - t0)
        projected = now - self.started + (total - done) / rate
        bound = self.limit if self.limit is not None else SLOW_CHECK
        if projected <= bound:
            return
        self._warned = True
        advice = ("the time limit will stop it first" if self.limit is not None
                  else "set time_limit= (--robust-time-limit) to stop it with the evidence gathered, or lower budget=")
        warnings.warn(
            f"{title}: its budget of {total:,} {unit} would take about {projected:,.0f} s at the measured "
            f"{rate:,.0f} per second (longer than {bound:g} s) if it does not decide earlier: {advice}",
            RobustWarning, stacklevel=3)

    def annotate(self, verdict: str, details: dict) -> str:
        """For a check the limit stopped: ``details["time_limit"]``, and when it ended inconclusive
        ``details["inconclusive_reason"]`` (which its message states); else the note it returns
        says so ("" for a check the limit did not stop)."""
        if not self.stopped:
            return ""
        details["time_limit"] = {"seconds": self.limit, "elapsed": round(self.elapsed(), 3), "stopped": True}
        said = f"the time limit of {self.limit:g} s stopped it after {self.elapsed():.1f} s"
        if verdict == "inconclusive":
            details["inconclusive_reason"] = (
                f"{said}, before the evidence decided: the estimate and bounds are those of the evaluations made; "
                "raise time_limit= (--robust-time-limit), or use a faster device or a larger batch_size")
            return ""
        return said
