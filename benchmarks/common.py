"""Set-up shared by the benchmark scripts in this folder.

Every script prints the same kind of report: a title, one or more markdown tables each preceded
by a line describing the machine and the settings the numbers depend on, and the total time. This
module holds the parts they share, so each script keeps only what it measures:

- ``parse_args``: the common command line (``--quick``, ``--device``, ``--threads``) plus
  script-specific options; applies ``--threads``.
- ``load`` and ``digits``: the digits example's checkpoints and data
  (``examples/digits/digits_model.py``; nothing is downloaded).
- ``machine``, ``load_average`` and ``header``: the environment line above each table.
- ``sync``, ``timed``, ``timed_cpu``, ``forward_loop`` and ``interleaved``: wall-clock (and
  process CPU) timing that waits for CUDA, the bare forward loop engines are compared with, and
  engine/bare runs that alternate so that load drift hits both alike.
- ``markdown_table``: a table as text.
- ``report``: the title, the sections and the total time.

The scripts import it as ``common`` (``python benchmarks/<script>.py`` puts this folder on
``sys.path``). Importing it puts the repository root and ``examples/digits`` on ``sys.path``, so
the checked-out ``pytest_robust`` and the digits example are the ones used.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "digits"))

from digits_model import digits_split, load_model  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


def parse_args(
    doc: str,
    quick: str | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
    argv: Sequence[str] | None = None,
) -> argparse.Namespace:
    """Parse the common options and apply ``--threads``.

    ``doc`` is the script's docstring; its first paragraph is the ``--help`` description.
    ``quick`` is the help text of ``--quick`` (``None``: the script has no ``--quick``).
    ``extra`` maps further option names to ``add_argument`` keyword arguments, in order.

    Returns the parsed options with ``device`` as a ``torch.device`` and ``mode`` set to
    ``"quick"`` or ``"full"``. With ``--threads N``, ``torch.set_num_threads(N)`` is called.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    for name, options in (extra or {}).items():
        parser.add_argument(name, **options)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.device = torch.device(args.device)
    args.mode = "quick" if getattr(args, "quick", False) else "full"
    return args


# ----------------------------------------------------------------------------------------------
# Digits example
# ----------------------------------------------------------------------------------------------


def load(name: str, device: torch.device) -> torch.nn.Module:
    """The digits checkpoint ``examples/digits/checkpoints/<name>.pt`` (e.g. "standard", "noise",
    "pgd", "gaussian_0.25"), in eval mode, on ``device``."""
    return load_model(name).to(device)


def digits() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The digits example's fixed split: ``(train, test)``, each ``(x, y)``; train has 1438 digits,
    test the 359 held-out ones. Inputs are (n, 1, 8, 8) floats in [0, 1]."""
    return digits_split()


# ----------------------------------------------------------------------------------------------
# Environment line
# ----------------------------------------------------------------------------------------------


def machine(device: torch.device) -> str:
    """A short description of the device the benchmark runs on."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"cpu ({os.cpu_count()} cores, {name})"


def load_average() -> str:
    """The 1-minute load average now, formatted ("n/a" where the platform has none)."""
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def header(device: torch.device, *facts: str, title: str | None = None, load_avg: str | None = None) -> str:
    """The line above a table: everything the numbers depend on.

    ``device=<machine> | torch=<version> | threads=<torch threads> | <fact> | ... |
    1-min load average at start=<load>``, ending in a newline; with ``title``, preceded by a
    ``### title`` heading and a blank line. ``facts`` are preformatted ("seed=0"). ``load_avg`` is
    a load average read earlier with ``load_average()`` (default: read now), for tables whose line
    is written after the runs.
    """
    fields = [f"device={machine(device)}", f"torch={torch.__version__}", f"threads={torch.get_num_threads()}",
              *facts, f"1-min load average at start={load_avg if load_avg is not None else load_average()}"]
    line = " | ".join(fields) + "\n"
    return f"### {title}\n\n{line}" if title is not None else line


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------


def sync(device: torch.device | None) -> None:
    """Wait for queued CUDA work on ``device`` (nothing to do for the CPU or ``None``)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device | None = None) -> tuple[Any, float]:
    """``(fn(), wall seconds)``; with a CUDA ``device``, synchronized before and after."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def timed_cpu(fn: Callable[[], Any], device: torch.device | None = None) -> tuple[Any, float, float]:
    """``(fn(), wall seconds, CPU seconds of this process)``, synchronized like ``timed``.

    CPU seconds (``time.process_time``) add up all threads of this process: other processes
    disturb them less than wall time, but threads spinning while they wait count too.
    """
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    sync(device)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def forward_loop(model: torch.nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """The bare loop engines are compared with: ``model(b)`` for every batch under
    ``torch.inference_mode()``, nothing else (time it with ``timed`` or ``timed_cpu``)."""
    with torch.inference_mode():
        for b in batches:
            model(b)


def interleaved(runs: int, engine: Callable[[], Any], bare: Callable[[], Any]) -> tuple[list, list]:
    """``runs`` results of each of ``engine()`` and ``bare()``, alternating: engine first in even
    runs, bare first in odd ones, so that load drift affects both alike. Returns the two lists."""
    engine_out, bare_out = [], []
    for run in range(runs):
        order = ((engine, engine_out), (bare, bare_out))
        for fn, out in (order if run % 2 == 0 else reversed(order)):
            out.append(fn())
    return engine_out, bare_out


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A markdown table: a header row, an alignment row and one line per row (cells as ``str()``).

    ``align`` has one letter per column, "l" (left, ``---``) or "r" (right, ``---:``);
    default all left.
    """
    align = align or "l" * len(columns)
    assert len(align) == len(columns), (align, columns)
    rule = "|" + "|".join({"l": "---", "r": "---:"}[a] for a in align) + "|"

    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(map(str, cells)) + " |"

    return "\n".join([line(columns), rule, *map(line, rows)])


def report(title: str, *sections: Callable[[], str]) -> None:
    """Print ``# title``, then each section's text (``section()`` runs the benchmark), separated
    by blank lines, then the total wall time of the sections."""
    started = time.perf_counter()
    print(f"# {title}\n")
    for i, section in enumerate(sections):
        if i:
            print()
        print(section())
    print(f"\nTotal time: {time.perf_counter() - started:.0f} s")
