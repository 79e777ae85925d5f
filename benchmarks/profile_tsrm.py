"""Where an estimate-only TSRM run spends its time, line by line in pytest_robust.

Run from the repository root:

    python benchmarks/profile_tsrm.py [--batch 1024] [--draws 65536] [--device cpu|cuda] [--threads N]

Runs ``tsrm(standard digits model, test digits, UniformLinf(eps=0.3), budget=draws)`` once under a
small line tracer, then the bare loop ``with torch.inference_mode(): model(x)`` over the same number
of pre-built noisy inputs, and prints the lines of pytest_robust that took the most wall time
(milliseconds, and percent of the whole traced call). A line's time includes everything it calls
outside pytest_robust (torch, numpy) but not the pytest_robust functions it calls (they have lines
of their own), so the model's forward passes land on the line in
engine.py that calls the model. Pure-Python numeric helpers in stats.py (betainc and friends)
are not traced line by line: their time lands on the line that calls them. The tracer itself
adds about a microsecond per traced line, which inflates Python-heavy lines a little.
"""

from __future__ import annotations

import linecache
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench_tsrm import bare_batches, bare_rate, engine_rate

# importing common first puts the repository root and examples/digits on sys.path
from common import ROOT, digits, header, load, load_average, markdown_table, parse_args, sync

from pytest_robust import UniformLinf, tsrm

PACKAGE = str(ROOT / "pytest_robust")
OPAQUE = {"_betacf", "betainc", "betaincinv"}


class LineTimer:
    """Wall time between consecutive trace events in pytest_robust frames, charged to the current line.

    A line's time excludes traced pytest_robust functions it calls (they are charged their own
    lines) and includes everything untraced it calls (torch, numpy, the model).
    """

    def __init__(self):
        self.seconds = defaultdict(float)
        self.hits = defaultdict(int)
        self.stack = []
        self.last = None
        self.t = 0.0

    def _charge(self):
        now = time.perf_counter()
        if self.last is not None:
            self.seconds[self.last] += now - self.t
        self.t = now

    def _global(self, frame, event, arg):
        code = frame.f_code
        if code.co_filename.startswith(PACKAGE) and code.co_name not in OPAQUE:
            self._charge()
            self.stack.append(self.last)
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event == "line":
            self._charge()
            self.last = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            self.hits[self.last] += 1
        elif event == "return":
            self._charge()
            self.last = self.stack.pop() if self.stack else None
        return self._local

    def run(self, fn):
        """Call fn() under the tracer; returns (its result, wall seconds)."""
        start = self.t = time.perf_counter()
        sys.settrace(self._global)
        try:
            result = fn()
        finally:
            sys.settrace(None)
        self._charge()
        return result, time.perf_counter() - start


def main(argv=None) -> None:
    args = parse_args(__doc__, argv=argv, extra={
        "--batch": dict(type=int, default=1024),
        "--draws": dict(type=int, default=65_536),
        "--top": dict(type=int, default=15),
    })
    device = args.device
    started_load = load_average()
    model = load("standard", device)
    data = digits()[1]
    noise = UniformLinf(eps=0.3)
    batches = bare_batches(data[0], noise, args.draws, args.batch, 0, device)
    engine_rate(model, data, noise, 4 * args.batch, args.batch, 0, device)  # warm-up
    bare_rate(model, batches[:4], device)

    timer = LineTimer()
    run = lambda: tsrm(model, data, perturbation=noise, budget=args.draws, batch_size=args.batch, seed=0, device=device)  # noqa: E731
    _, wall = timer.run(lambda: (run(), sync(device)))
    bare = args.draws / bare_rate(model, batches, device)[0]

    facts = f"batch={args.batch}", f"draws={args.draws}", f"perturbation={noise!r}"
    print(header(device, *facts, load_avg=started_load), end="")
    print(f"traced engine call: {wall * 1e3:.1f} ms; bare forward loop (untraced): {bare * 1e3:.1f} ms\n")
    traced = sum(timer.seconds.values())
    by_function = defaultdict(float)
    for (path, _, func), sec in timer.seconds.items():
        by_function[(path, func)] += sec
    top_functions = sorted(by_function.items(), key=lambda kv: -kv[1])[: args.top]
    print("By function (self time of its lines):\n")
    print(markdown_table(["ms", "% of call", "function"], [
        [f"{sec * 1e3:.1f}", f"{100 * sec / wall:.1f}", f"`{Path(path).relative_to(ROOT)}:{func}`"]
        for (path, func), sec in top_functions
    ], "rrl"))
    top_lines = sorted(timer.seconds.items(), key=lambda kv: -kv[1])[: args.top]
    print("\nBy line:\n")
    print(markdown_table(["ms", "% of call", "hits", "line"], [
        *([f"{sec * 1e3:.1f}", f"{100 * sec / wall:.1f}", timer.hits[key],
           f"`{Path(key[0]).relative_to(ROOT)}:{key[1]}` `{linecache.getline(key[0], key[1]).strip()}`"]
          for key, sec in top_lines),
        [f"{(wall - traced) * 1e3:.1f}", f"{100 * (wall - traced) / wall:.1f}", "", "(time outside traced lines)"],
    ], "rrrl"))


if __name__ == "__main__":
    main()
