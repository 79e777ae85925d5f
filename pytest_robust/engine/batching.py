"""The batch size a check runs with: a number of inputs per forward pass, or ``"auto"``.

``"auto"`` (the default) means, on a CUDA device, the batch that ``probe`` finds: the model is
timed on batches of the check's own clean inputs (repeated to fill a batch), FIRST rows and then
twice as many each time, and the probe stops at the first doubling that raises throughput (rows
per second, each size timed over REPEATS passes after a warm-up pass) by less than GAIN, at an
out-of-memory error, or at LARGEST rows; the batch chosen is the fastest one timed (under
torch.distributed the ranks' smallest choice, so that every rank plans its work alike). Off CUDA,
``"auto"`` is DEFAULT: a CPU's throughput stops rising within a few hundred rows and its memory is
plentiful, so a probe would only spend time.

Whatever the size, out-of-memory errors still halve the batch during the check
(``Forward.back_off``): the probe runs forward passes without gradients, and a check that
takes gradients (adversarial accuracy, q's HMC) may need a smaller batch. No number of a check
depends on its batch size (the random streams are drawn in fixed blocks, ``Run.stream``), so a
probe changes how fast a check runs, never what it reports. Its passes are not charged to the
check's budget (they evaluate clean inputs only, like the label probe); ``Probe.evaluations``
counts them, and the results record the probe (``details["batch_size_probe"]``) and the batch size
at the end (``details["batch_size"]``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from pytest_robust.engine import collective
from pytest_robust.engine.forward import Forward, is_oom

AUTO = "auto"
#: The batch size of ``"auto"`` off CUDA.
DEFAULT = 1024
#: The probe's first batch size, and its largest.
FIRST, LARGEST = 256, 16384
#: A doubling of the batch that raises throughput by less than this share ends the probe.
GAIN = 0.10
#: Timed passes per batch size, after one warm-up pass.
REPEATS = 2


@dataclass
class Probe:
    """What a probe found: the batch size ``chosen``, each size ``tried`` with its throughput
    (rows per second; 0.0 where it ran out of memory) and the model evaluations it spent."""

    chosen: int
    tried: list = field(default_factory=list)
    evaluations: int = 0

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "tried": [[size, round(rate, 1)] for size, rate in self.tried],
                "evaluations": self.evaluations}


def probe(call: Callable[[torch.Tensor], object], rows: Callable[[int], torch.Tensor],
          sync: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter) -> Probe:
    """The batch size of ``"auto"`` (module docstring): ``call(batch)`` runs the model on a batch,
    ``rows(n)`` gives a batch of n inputs, ``sync()`` waits for the device before a clock reading."""
    found, size, best = Probe(FIRST), FIRST, None
    while size <= LARGEST:
        batch = rows(size)
        try:
            call(batch)
            sync()
            start = clock()
            for _ in range(REPEATS):
                call(batch)
            sync()
            rate = REPEATS * size / max(clock() - start, 1e-9)
        except (torch.OutOfMemoryError, RuntimeError, MemoryError) as err:
            if not is_oom(err):
                raise
            found.tried.append((size, 0.0))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            break
        found.evaluations += (1 + REPEATS) * size
        found.tried.append((size, rate))
        rising = best is None or rate >= best[1] * (1.0 + GAIN)
        if best is None or rate > best[1]:
            best = (size, rate)
        if not rising:
            break
        size *= 2
    found.chosen = best[0] if best is not None else FIRST  # none fits: the check's back-off halves FIRST
    return found


def initial(setting) -> int:
    """The batch size before any probe: the setting's number, or DEFAULT for ``"auto"``."""
    return DEFAULT if setting == AUTO else setting


def resolve(setting, device: torch.device, forward: Forward, x: torch.Tensor, details: dict) -> int:
    """The batch size for the ``batch_size`` setting, also made ``forward``'s: a number as it is;
    ``"auto"`` probed on CUDA with the check's model call (``Forward.called``: normalization,
    dtype, autocast) on its clean inputs ``x`` (the probe recorded in ``details["batch_size_probe"]``),
    else DEFAULT."""
    if setting != AUTO or device.type != "cuda" or not len(x):
        forward.batch_size = initial(setting)
        return forward.batch_size

    def call(batch):
        with torch.no_grad():
            forward.called(batch)

    def rows(n: int) -> torch.Tensor:
        return x[torch.arange(n, device=x.device) % len(x)].to(device)

    found = probe(call, rows, sync=lambda: torch.cuda.synchronize(device))
    found.chosen = min(collective.gather_objects(found.chosen))  # ranks plan alike: the smallest choice
    details["batch_size_probe"] = found.to_dict()
    forward.batch_size = found.chosen
    return found.chosen
