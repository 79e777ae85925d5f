"""The shared run of every check: everything around a metric's own evaluation, written once.

A metric module writes only its plan, its evaluation and its statistics; a ``Run`` owns the rest:

- the common arguments (threshold, confidence, budget, seed, batch size), validated once;
- the data (``engine.load_data``: finite, in a seed-independent order), the device
  (``engine.resolve_device``) and the working dtype: the model's floating dtype; data of another
  float dtype is converted, with a note in details; with the check's perturbation, the inputs are
  checked against its box, its size and its use of the generator (``inspection.inspect_inputs``);
- the guarded model (``engine.guarded``: eval mode, no parameter gradients, state and global RNG
  restored, in-place changes detected) and the one forward wrapper (``engine.Forward``) through
  which every model call goes: it counts model evaluations per phase, caps them at the budget and
  halves the batch on out-of-memory;
- distribution over torch.distributed ranks (``shard`` / ``gather`` for per-input work; per-draw
  work shards blocks with ``engine.gather_blocks``);
- timing and the ``Result``, with the verdict from ``results.decide``.

Budget unit, for every check: model evaluations (one input row through the model, with or
without a backward pass). ``Result.forward_passes`` is what was spent (summed over ranks),
``Result.budget`` the cap, and ``details["evaluations"]`` splits the spending by phase.

Usage::

    with Run("my_metric", model, data, threshold=..., confidence=..., budget=..., seed=...,
             batch_size=..., device=...) as run:
        with run.forward.phase("gate"):
            hits = correct_predictions(run.forward.logits(x), y)
    return run.result(estimate=..., lower=..., upper=..., draws=..., perturbation=...)
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from .engine import Forward, guarded, load_data, resolve_device, sum_over_ranks, world
from .inspection import check_model, inspect_inputs
from .results import Result, decide
from .validation import check_run_args


def model_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating parameter or buffer (None when it has none)."""
    for t in list(model.parameters()) + list(model.buffers()):
        if t.dtype.is_floating_point:
            return t.dtype
    return None


class Run:
    """One check's evaluation context (see the module docstring). Use as a context manager."""

    def __init__(self, metric: str, model, data, *, threshold=None, confidence=0.95, budget=100_000,
                 seed=0, batch_size=1024, device=None, direction: str = ">=", perturbation=None):
        check_model(model)
        self.metric, self.model, self.direction = metric, model, direction
        self.args = check_run_args(threshold=threshold, confidence=confidence, budget=budget, seed=seed,
                                   batch_size=batch_size, direction=direction)
        self.device = resolve_device(device, model)
        self.ds = load_data(data)
        if perturbation is not None:
            inspect_inputs(self.ds, perturbation)
        self.details: dict = {}
        self.dtype = model_dtype(model) or self.ds.x.dtype
        if self.ds.x.dtype != self.dtype:
            self.details["dtype_note"] = (
                f"the data ({self.ds.x.dtype}) was converted to the model's dtype {self.dtype}"
            )
            self.ds = type(self.ds)(self.ds.x.to(self.dtype), self.ds.y)
        self.forward = Forward(model, self.args.batch_size, max_label=int(self.ds.y.max()), budget=self.args.budget)
        self.started = time.perf_counter()
        self._stack = contextlib.ExitStack()
        self.info: dict = {}

    # -- the guarded model ----------------------------------------------------------------------

    def __enter__(self) -> "Run":
        self.info = self._stack.enter_context(guarded(self.model, self.device))
        return self

    def __exit__(self, *exc) -> bool:
        return self._stack.__exit__(*exc)

    @property
    def seed(self) -> int:
        return self.args.seed

    @property
    def alpha(self) -> float:
        return self.args.alpha

    def remaining(self) -> int:
        """Model evaluations left under the budget, counting every rank's spending."""
        return self.args.budget - sum_over_ranks(self.forward.passes)

    # -- ranks ------------------------------------------------------------------------------------

    @staticmethod
    def shard(n: int) -> np.ndarray:
        """The items of [0, n) this rank evaluates: r, r + W, r + 2W, ... (all of them in one process)."""
        rank, size = world()
        return np.arange(rank, n, size)

    @staticmethod
    def gather(local: list, n: int) -> list:
        """Per-item results computed for ``shard(n)`` on every rank (a list in shard order),
        reassembled as the list of all n items in item order, the same on every rank. With one
        process it is ``local`` itself. Items can be any picklable object (arrays, dicts)."""
        rank, size = world()
        if size == 1:
            return list(local)
        parts = [None] * size
        torch.distributed.all_gather_object(parts, list(local))
        out = [None] * n
        for r, part in enumerate(parts):
            out[r::size] = part
        return out

    @staticmethod
    def span(n: int) -> slice:
        """The contiguous rows of [0, n) this rank evaluates when work is split by rows (a rank's
        share differs from the others' by at most one row)."""
        rank, size = world()
        return slice(rank * n // size, (rank + 1) * n // size)

    @staticmethod
    def gather_rows(local: torch.Tensor) -> torch.Tensor:
        """The rows each rank computed for its ``span``, concatenated in rank order (so in row
        order), on every rank; ``local`` itself with one process."""
        rank, size = world()
        if size == 1:
            return local
        parts = [None] * size
        torch.distributed.all_gather_object(parts, local.cpu())
        return torch.cat(parts).to(local.device)

    # -- the result -------------------------------------------------------------------------------

    def spent(self) -> dict:
        """Model evaluations by phase, summed over ranks."""
        return {phase: sum_over_ranks(self.forward.by_phase.get(phase, 0)) for phase in self._phases()}

    def _phases(self) -> list[str]:
        """The phases any rank spent evaluations in (a rank may have had no work in one)."""
        phases = sorted(self.forward.by_phase)
        if world()[1] == 1:
            return phases
        everyone = [None] * world()[1]
        torch.distributed.all_gather_object(everyone, phases)
        return sorted({p for ranks in everyone for p in ranks})

    def per_rank(self) -> list[int]:
        """Model evaluations of each rank (one entry with one process)."""
        rank, size = world()
        if size == 1:
            return [self.forward.passes]
        counts = [None] * size
        torch.distributed.all_gather_object(counts, self.forward.passes)
        return counts

    def result(self, *, estimate: float, lower: float, upper: float, draws: int, perturbation: str,
               details: dict | None = None, note: str = "", healthy: bool = True, estimate_only: bool = False,
               n_inputs: int | None = None, metric: str | None = None) -> Result:
        """The check's ``Result``: verdict by ``results.decide`` (or "estimate" with
        ``estimate_only`` or no threshold), spending and common facts filled in."""
        threshold = None if estimate_only else self.args.threshold
        evaluations = self.spent()
        return Result(
            metric=metric or self.metric,
            estimate=float(estimate),
            lower=float(lower),
            upper=float(upper),
            threshold=threshold,
            confidence=self.args.confidence,
            verdict=decide(threshold, lower, upper, self.direction, healthy),
            n_inputs=len(self.ds) if n_inputs is None else n_inputs,
            draws=int(draws),
            forward_passes=sum(evaluations.values()),
            seconds=time.perf_counter() - self.started,
            device=str(self.device),
            seed=self.args.seed,
            perturbation=perturbation,
            budget=sum(evaluations.values()) if self.args.budget is None else self.args.budget,
            direction=self.direction,
            note=note,
            details={
                **(details or {}),
                **self.details,
                "budget_unit": "model evaluations",
                "evaluations": evaluations,
                "evaluations_per_rank": self.per_rank(),
                "backward_passes": sum_over_ranks(self.forward.backward_passes),
                "batch_size": self.forward.batch_size,
                "oom_halvings": self.forward.halvings,
                "dtype": str(self.dtype).removeprefix("torch."),
                "model_was_training": self.info.get("model_was_training", False),
            },
        )
