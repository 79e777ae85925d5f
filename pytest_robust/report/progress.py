"""Progress of long checks on the terminal, throttled so CI logs are not flooded.

Shown only when pytest does not capture output (``-s``): after FIRST_AFTER seconds of a check,
at most one line every INTERVAL_TTY seconds on a terminal (rewritten in place) or every
INTERVAL_PLAIN seconds in a log (new lines). Bounds are computed only when a line is shown.
"""

from __future__ import annotations

import time

FIRST_AFTER = 5.0
INTERVAL_TTY = 1.0
INTERVAL_PLAIN = 30.0


class Progress:
    """A progress sink for ``engine.progress_sink``: fields -> an occasional status line."""

    def __init__(self, terminal, label: str):
        self.terminal = terminal
        self.label = label
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
            parts.append(f"{values.pop('draws')}/{values.pop('budget', '?')} draws")
        if "inputs_done" in values:
            parts.append(f"{values.pop('inputs_done')}/{values.pop('inputs', '?')} inputs")
        if "forward_passes" in values:
            parts.append(f"{values.pop('forward_passes')} forward passes")
        if "bounds" in values:
            lower, upper = values.pop("bounds")
            parts.append(f"bounds [{lower:.4f}, {upper:.4f}]")
        parts += [f"{k} {v}" for k, v in values.items()]
        line = f"robust progress {self.label}: {metric} " + ", ".join(parts) + f" ({now - self.started:.0f} s)"
        if self.tty:
            self.terminal.rewrite(line, erase=True)
        else:
            self.terminal.write_line(line)
