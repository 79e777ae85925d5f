"""Progress of long checks on the terminal, throttled so CI logs are not flooded.

Written through pytest's terminal reporter with output capturing suspended for the line, so it
shows without ``-s``: after FIRST_AFTER seconds of a check, at most one line every INTERVAL_TTY
seconds on a terminal (rewritten in place) or every INTERVAL_PLAIN seconds in a log (new lines),
with the draws, the bounds and the time left at the pace so far if the whole budget is spent,

    left = elapsed * (budget - draws) / draws     (seconds; a gate may decide sooner).

Bounds are computed only when a line is shown.
"""

from __future__ import annotations

import contextlib
import time

FIRST_AFTER = 10.0
INTERVAL_TTY = 1.0
INTERVAL_PLAIN = 30.0


class Progress:
    """A progress line for ``context.RunContext.progress``: fields -> an occasional status line, written
    with ``capture`` (pytest's capture manager, None: not capturing) suspended."""

    def __init__(self, terminal, label: str, capture=None):
        self.terminal = terminal
        self.label = label
        self.capture = capture
        self.tty = bool(terminal.isatty)  # pytest exposes a callable bool
        self.started = time.monotonic()
        self.shown_at: float | None = None

    def __call__(self, fields: dict) -> None:
        now = time.monotonic()
        interval = INTERVAL_TTY if self.tty else INTERVAL_PLAIN
        if now - self.started < FIRST_AFTER or (self.shown_at is not None and now - self.shown_at < interval):
            return
        self.shown_at = now
        values = {k: v() if callable(v) else v for k, v in fields.items()}
        metric = values.pop("metric", "check")
        parts = []
        if "draws" in values:
            draws, budget = values.pop("draws"), values.pop("budget", None)
            parts.append(f"{draws}/{budget if budget is not None else '?'} draws")
            if budget and draws:
                parts.append(f"~{(now - self.started) * (budget - draws) / draws:.0f} s left if it spends the budget")
        if "inputs_done" in values:
            parts.append(f"{values.pop('inputs_done')}/{values.pop('inputs', '?')} inputs")
        if "forward_passes" in values:
            parts.append(f"{values.pop('forward_passes')} forward passes")
        if "bounds" in values:
            lower, upper = values.pop("bounds")
            parts.append(f"bounds [{lower:.4f}, {upper:.4f}]")
        parts += [f"{k} {v}" for k, v in values.items()]
        line = f"robust progress {self.label}: {metric} " + ", ".join(parts) + f" ({now - self.started:.0f} s)"
        suspended = self.capture.global_and_fixture_disabled() if self.capture else contextlib.nullcontext()
        with suspended:
            if self.tty:
                self.terminal.rewrite(line, erase=True)
            else:
                self.terminal.write_line(line)
