"""The noisy draws of randomized smoothing and the class counts over them (Cohen, Rosenfeld & Kolter,
ICML 2019): what CERTIFY, PREDICT, the pA report and the certified-accuracy gate all evaluate.

Units. ``sigma`` (noise standard deviation) is in the space of the tensors the model receives:
noise is added to the data exactly as given, without clipping. Keep the normalization inside the
model and it stays in pixel units (sigma = 0.25 on [0, 1] images is Cohen's setting).

Noise. Draw t of input i is x_i + sigma * eps, where eps is row t % BLOCK of block t // BLOCK of
input i's stream, seeded with ``stream_seed(seed, "smoothing", i, t // BLOCK)``. Every procedure
reads draws from these streams in order, so per-input numbers depend on (seed, device, dtype) only,
never on batch size, packing or the other inputs. Batches mix draws of many inputs; there is no
Python loop per draw.

Host reads. On a GPU every read of a device value by the host stalls the stream, and so does
every copy from pageable host memory to the device. Each rank's inputs and labels are copied to
the device once (``Shard``) and the noise is drawn there, so no batch uploads anything. The
fixed-size class counts (``class_counts``) stay on the device and are read once, at the end.

Base classifier. f(x) is the unique argmax of the logits; a tie counts as no class (never as the
true class), as everywhere in pytest-robust. This only lowers p_A, so certificates stay valid.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from pytest_robust.engine.forward import Forward
from pytest_robust.engine.run import Run
from pytest_robust.engine.streams import stream_seed

#: Draws per random-stream block (the unit in which noise is generated and inputs are packed).
BLOCK = 64


@functools.cache
def _generator(device: str) -> torch.Generator:
    """One generator per device, re-seeded for every block (``Noise``): building a generator per
    block is avoidable work on the hot path."""
    return torch.Generator(device=device)


class Noise:
    """The standard normal draws eps of the inputs' streams (module docstring), written into the
    rows of batches: ``write(index, start, stop, out)`` puts draws start..stop-1 of input ``index``
    into ``out``. A block the rows cover whole is drawn straight into them; a block they cover in
    part is drawn once and kept, for the next rows of the same input to take the rest (the next
    phase's first draws, or the next batch's)."""

    def __init__(self, shape: tuple, dtype: torch.dtype, seed: int, device):
        self.seed, self.device = seed, torch.device(device)
        self.generator = _generator(str(self.device))
        self.kept = torch.empty((BLOCK, *shape), device=self.device, dtype=dtype)
        self.kept_block: tuple | None = None  # (input, block) whose draws ``kept`` holds

    def write(self, index: int, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        for block in range(start // BLOCK, (stop - 1) // BLOCK + 1):
            lo, hi = max(start, block * BLOCK), min(stop, (block + 1) * BLOCK)
            rows = out[lo - start:hi - start]
            if hi - lo == BLOCK:
                self._draw(index, block, rows)
                continue
            if self.kept_block != (index, block):
                self._draw(index, block, self.kept)
                self.kept_block = (index, block)
            rows.copy_(self.kept[lo - block * BLOCK:hi - block * BLOCK])
        return out

    def _draw(self, index: int, block: int, out: torch.Tensor) -> None:
        self.generator.manual_seed(stream_seed(self.seed, "smoothing", index, block))
        torch.randn(out.shape, generator=self.generator, out=out)


#: Batches of draws between two reads of the logits' finiteness flag (a model that returns NaN
#: is named within this many batches, and the device does not wait for the host between them).
CHECK_EVERY = 64


def draw_noisy(x_i: torch.Tensor, sigma: float, noise: Noise, index: int, start: int, stop: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Draws start..stop-1 of input ``index`` (row ``x_i``): x_i + sigma * eps, eps from ``noise``;
    written into ``out`` (stop - start rows) when given."""
    eps = noise.write(index, start, stop, torch.empty((stop - start, *x_i.shape), device=x_i.device,
                                                      dtype=x_i.dtype) if out is None else out)
    return eps.mul_(sigma).add_(x_i)  # sigma * eps + x_i: the same rounding as x_i + sigma * eps


@dataclass(frozen=True)
class Shard:
    """This rank's inputs (``Run.shard``) on the device: ``index`` their positions in the data,
    ``x`` and ``y`` their rows and labels (row k is input ``index[k]``), copied from the host once."""

    index: np.ndarray
    x: torch.Tensor
    y: torch.Tensor

    @classmethod
    def of(cls, run: Run) -> "Shard":
        """This rank's share of ``run``'s data, on ``run.device``."""
        index = run.shard(len(run.ds))
        rows = torch.as_tensor(index)
        return cls(index, run.ds.x[rows].to(run.device), run.ds.y[rows].to(run.device))

    @functools.cached_property
    def row(self) -> dict[int, int]:
        """Input (position in the data) -> its row in ``x`` and ``y``."""
        return {int(i): k for k, i in enumerate(self.index)}


def _batches(x: torch.Tensor, index, sigma: float, phases, seed: int, device, batch_size: int):
    """(noisy rows, tags) in batches of exactly ``batch_size`` rows (the last may be shorter): every
    input's draws of each phase, inputs one after another, so batches are packed across inputs.
    Row i of x is input ``index[i]`` of the data (its noise stream); a row's tag is
    i * len(phases) + phase. The noise is written straight into one reused batch buffer, scaled
    and shifted by each row's input in one step per batch: each batch must be consumed before
    the next is requested."""
    rows = torch.empty((batch_size,) + tuple(x.shape[1:]), device=device, dtype=x.dtype)
    tags = torch.empty(batch_size, dtype=torch.long, device=device)
    noise = Noise(tuple(x.shape[1:]), x.dtype, seed, device)
    filled = 0
    for i in range(len(x)):
        for p, (start, stop) in enumerate(phases):
            at = start
            while at < stop:
                take = min(stop - at, batch_size - filled)
                noise.write(int(index[i]), at, at + take, rows[filled: filled + take])
                tags[filled: filled + take] = i * len(phases) + p
                filled, at = filled + take, at + take
                if filled == batch_size:
                    yield _shifted(rows, x, tags, sigma, len(phases)), tags
                    filled = 0
    if filled:
        yield _shifted(rows[:filled], x, tags[:filled], sigma, len(phases)), tags[:filled]


def _shifted(eps: torch.Tensor, x: torch.Tensor, tags: torch.Tensor, sigma: float, phases: int) -> torch.Tensor:
    """sigma * eps + x_i for each row (its input i = tag // phases), in eps's memory."""
    return eps.mul_(sigma).add_(x[tags // phases])


def class_counts(run: Run, sigma: float, phases, metric: str) -> np.ndarray:
    """Counts of f(x_i + eps) over the draws of each phase: array (inputs, phases, classes).

    ``phases`` are draw ranges [start, stop) of every input's stream (disjoint ranges are
    independent samples). A tie between logits counts in no class. ``metric`` names the
    procedure in progress reports. Under torch.distributed each rank counts its share of the
    inputs (``Run.shard``) and the counts are gathered, identical to one process.
    """
    shard = Shard.of(run)
    local = _counts(run.forward, shard.x, shard.index, sigma, phases, run.seed, run.device, metric)
    return np.stack(run.gather(list(local), len(run.ds)))


def _counts(forward: Forward, x: torch.Tensor, index, sigma: float, phases, seed: int, device,
            metric: str) -> np.ndarray:
    """``class_counts`` for the rows x (on the device), which are inputs ``index`` of the data.

    The counts stay on the device, flat: cell tag * (classes + 1) + class, where class = classes
    stands for a tie. ``index_add_`` asserts its indices on the device, where
    ``index_put_(accumulate=True)`` reads their range to the host in some PyTorch releases; so the
    host reads are the final one and the logits' finiteness flag (``Forward.deferring``) every
    ``CHECK_EVERY`` batches.
    """
    counts = None
    total = len(x) * sum(stop - start for start, stop in phases)
    with forward.deferring():  # finiteness read every CHECK_EVERY batches, not at each
        for k, (rows, tags) in enumerate(_batches(x, index, sigma, phases, seed, device, forward.batch_size)):
            classes, alone = forward.ranked(rows)
            width = forward.n_classes + 1
            pred = torch.where(alone, classes, width - 1)
            if counts is None:
                counts = torch.zeros(len(x) * len(phases) * width, dtype=torch.long, device=device)
            counts.index_add_(0, tags * width + pred, torch.ones_like(pred))
            forward.report_progress(metric=metric, draws=forward.passes, budget=total)
            if k % CHECK_EVERY == CHECK_EVERY - 1:
                forward.check_flag(int(forward.finite))
        forward.check_flag(int(forward.finite))
    if counts is None:  # no inputs on this rank
        return np.zeros((0, len(phases), 0), dtype=np.int64)
    return counts.view(len(x), len(phases), width)[:, :, :-1].numpy(force=True)
