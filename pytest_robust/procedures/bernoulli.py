"""The Bernoulli-stream procedure: i.i.d. draws (input, perturbation) -> an anytime-valid gate.

Each draw picks an input uniformly at random (with replacement) and one fresh perturbation of it;
whether the model is correct is a Bernoulli(p) outcome, i.i.d. across draws, where

    p = P_{(X, Y) ~ data, X' ~ perturbation(. | X)} ( argmax f(X') = Y )     (a tie is an error).

The gate "p >= threshold" is the anytime-valid betting test of ``stats.SequentialGate`` at level
alpha = 1 - confidence: it stops as soon as pass or fail is proven, and a stream that reaches the
budget undecided is inconclusive. The bounds reported are the anytime-valid confidence sequence,
which agrees with the gate's decision exactly, and so do the p-values of its two claims
(``details["p_values"]``: 1 / the largest capital of each side's betting test); a stream that goes
on past its decision (``at_least``) reports bounds over every draw (``summary``), and the bounds
always hold the estimate. One draw costs one model evaluation; the batch in which the decision
falls is evaluated whole, so evaluations can exceed draws by less than one batch.

``accuracy(run, perturbation)`` is a whole check: TSRM, corruption accuracy and any metric declared
as "a perturbation + a declaration" end their body with it. ``bernoulli_stream`` is the loop
itself (NPPR gates its learned distribution with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from pytest_robust.engine import collective
from pytest_robust.engine.data import TensorData
from pytest_robust.engine.ranking import score
from pytest_robust.engine.run import Run
from pytest_robust.perturbations.base import Perturbation
from pytest_robust.procedures.columns import Column
from pytest_robust.results import Result
from pytest_robust.stats import SequentialGate, clopper_pearson_lower, clopper_pearson_upper, confidence_sequence

#: Draws generated from one random stream (a *block*) for inputs of up to BLOCK_BYTES / BLOCK
#: bytes; a size fixed by the inputs' shape, so results do not depend on batch size.
BLOCK = 256
#: The most bytes of perturbed inputs one block holds (``block_size``).
BLOCK_BYTES = 16 * 2**20


def block_size(x: torch.Tensor) -> int:
    """Draws per block for inputs like the rows of ``x``: ``BLOCK``, or for inputs larger than
    BLOCK_BYTES / BLOCK bytes the largest power of two b with b * (bytes of one input) <=
    ``BLOCK_BYTES`` (at least 1). A step holds its blocks' perturbed inputs (and the perturbation's
    temporaries of the same size), so host and device memory stay bounded by the batch size and a
    few MiB whatever the image size: 3 x 512 x 512 float32 inputs (3 MiB each) get blocks of 4.
    The size depends on the inputs' shape and dtype only, never on the batch size or the device."""
    row = max(1, math.prod(x.shape[1:]) * x.element_size()) if x.shape[0] else 1
    return min(BLOCK, 1 << (max(1, BLOCK_BYTES // row).bit_length() - 1))


@dataclass
class Stream:
    """The outcomes of a Bernoulli stream (correct or not per draw), the inputs drawn, the gate's
    decision (None: undecided or ungated) and its p-values ({"pass": p, "fail": p}, the gate's
    anytime-valid ones, ``SequentialGate.p_values``; None when ungated)."""

    outcomes: np.ndarray
    indices: np.ndarray
    decision: object
    p_values: dict | None = None
    at_least: int = 0

    @property
    def used(self) -> int:
        """Draws the estimate and bounds rest on: up to the decision, else all; with ``at_least``,
        up to the later of the decision and ``at_least`` (the same number on any count of ranks,
        whose steps may overshoot differently)."""
        if self.decision is None:
            return len(self.outcomes)
        return min(len(self.outcomes), max(self.decision.at, self.at_least))


def _indices(n_inputs: int, run: Run, name: str, index: int, block: int, out: torch.Tensor | None = None
             ) -> torch.Tensor:
    """Input indices of block ``index`` (of ``block`` draws) of the draw stream (uniform, with
    replacement), drawn on the run's device (on the CPU they are the same numbers on any host),
    into ``out`` when given."""
    return torch.randint(n_inputs, (block,), generator=run.stream("index", index, namespace=name), device=run.device,
                         out=out)


def looks_ahead(run: Run) -> bool:
    """Whether a stream launches its next step before reading the last (``bernoulli_stream``): on
    CUDA, where the device then works while the host reads and decides; elsewhere the launch
    itself computes, so looking ahead could only spend evaluations."""
    return run.device.type == "cuda"


def noise_generator(run: Run, name: str, block: int) -> torch.Generator:
    """The generator that perturbs the draws of block ``block`` of stream ``name``: a metric that
    mixes perturbations can recover which one each draw got."""
    return run.stream("noise", block, namespace=name)


class Steps:
    """What every step of one stream shares, worked out once (``launch``): the runs whose models
    it evaluates (``runs``: the stream's run, then the paired procedure's reference) and their
    ``Forward``s, the data ``ds``, the perturbation, the stream namespace ``name``, the block size
    ``blk`` (``block_size``) and this process's (rank, ranks)."""

    def __init__(self, run: Run, ds: TensorData, perturbation: Perturbation, name: str, references: tuple = ()):
        self.run, self.ds, self.perturbation, self.name = run, ds, perturbation, name
        self.runs = (run, *references)
        self.models = tuple(r.forward for r in self.runs)
        self.blk, self.world = block_size(ds.x), collective.world()


@dataclass
class Launched:
    """A step in flight (``launch``): its outcomes and input indices on their way to the host
    (``host``, complete once ``event`` has passed: a CUDA event, or None when it is already
    there), and what ``read`` needs to take them apart: in a single process ``host`` holds each
    model's outcomes, then each model's finiteness flag (``shape`` None); across ranks the
    gathered table of ``_table`` (``shape`` its shape); then the step's input indices."""

    host: torch.Tensor
    event: object
    shape: tuple | None
    models: tuple
    blk: int
    limit: int
    consumed: int


def launch(steps: Steps, first: int, limit: int, most: int) -> Launched:
    """Draw, perturb and evaluate the next step of the stream ``steps``, and start its copy to the
    host (``Launched``); ``read`` waits for it. The outcomes have one row per model: the run's,
    then those of its references (the paired procedure's reference), each evaluated on the same
    perturbed draws (in its own working dtype).

    A step is ``ceil(batch_size / b)`` blocks of b = ``block_size(ds.x)`` draws per process, fewer
    when the remaining draws (``limit``) need fewer or when ``most`` (blocks in all) is smaller;
    under torch.distributed rank r evaluates blocks first + r, first + r + W, ... and the outcomes
    are gathered in block order, so every rank sees the same stream as a single process would.
    Only the first ``limit`` draws of the step are evaluated, by a single process or across the
    ranks; a rank whose blocks all lie past the limit evaluates nothing and still joins the
    gather. The batch size is the ranks' smallest: each rank sends its batch size with its
    outcomes, so an out-of-memory error on one rank shrinks every rank's next step alike; in a
    single process an out-of-memory error while perturbing halves the batch too and draws fewer
    blocks (``Forward.back_off``). One collective and one host read per step: the outcomes, the
    finiteness of the logits (``ranking.score``), the batch sizes and the input indices come
    back together, on CUDA as a non-blocking copy into pinned memory.
    """
    (rank, size), blk, models = steps.world, steps.blk, steps.models
    per_rank, needed, idx, x, labels = _draw(steps, first, limit, most)
    correct, finite = _outcomes(steps.runs, models, x, labels)
    if size == 1:
        indices, payload, shape = idx, [correct.reshape(-1), finite], None
    else:  # other ranks' indices are regenerated, not sent
        run, n = steps.run, len(steps.ds)
        indices = torch.cat([_indices(n, run, steps.name, b, blk) if (b - first) % size != rank
                             else idx[(b - first) // size * blk:][:blk] for b in range(first, first + per_rank * size)])
        gathered = collective.gather_blocks(_table(correct, finite, needed, per_rank, blk, models))
        payload, shape = [gathered.reshape(-1)], tuple(gathered.shape)
    flat = torch.cat([*payload, indices])  # one tensor, one copy (integers: the outcomes promote)
    event = None
    if flat.device.type == "cuda":  # the copy overlaps whatever the device does next
        flat = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True).copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
    else:
        flat = flat.cpu()
    return Launched(flat, event, shape, models, blk, limit, per_rank * size)


def read(launched: Launched):
    """(outcomes, input indices, blocks consumed) of a launched step: its one host read (module
    docstring of ``launch``); a non-finite logit raises here, and across ranks each model takes
    the ranks' smallest batch size for its next step."""
    if launched.event is not None:
        launched.event.synchronize()
    host, models, limit = launched.host.numpy(), launched.models, launched.limit
    drawn = launched.consumed * launched.blk  # the input indices: the step's whole blocks, at the end
    host, indices = host[:-drawn], host[-drawn:][:limit]
    if launched.shape is None:  # one process: each model's outcomes (within the limit), then the flags
        outcomes, flags = host[:-len(models)].reshape(len(models), -1), host[-len(models):]
    else:
        (rows, width_all), blk = launched.shape, launched.blk
        table, width = host.reshape(rows, width_all), len(models) * blk
        *flags, batch = table[:, width:].min(axis=0).tolist()
        for forward in models:
            forward.batch_size = min(forward.batch_size, batch)  # a later launch may have halved it
        outcomes = table[:, :width].reshape(-1, len(models), blk).transpose(1, 0, 2).reshape(len(models), -1)
        outcomes = outcomes[:, :limit]
    for forward, flag in zip(models, flags):
        forward.check_flag(flag)
    return outcomes.astype(bool), indices, launched.consumed


def _draw(steps: Steps, first: int, limit: int, most: int) -> tuple:
    """This rank's part of the step (``launch``, whose arguments these are): (blocks per rank, the
    rows of each of its blocks within the limit, the input indices of its blocks (whole), the
    perturbed inputs and their labels (within the limit)). An out-of-memory error while
    perturbing halves the batch, as in the model call, and the step draws fewer blocks (a single
    process only: ranks must draw the same blocks, or the gather would break)."""
    run, ds, name, blk, (rank, size), models = steps.run, steps.ds, steps.name, steps.blk, steps.world, steps.models
    while True:
        batch = min(f.batch_size for f in models)
        per_rank = max(1, min(-(-batch // blk), -(-limit // (blk * size)), -(-most // size)))
        mine = range(first + rank, first + per_rank * size, size)
        needed = [min(max(limit - (b - first) * blk, 0), blk) for b in mine]  # rows of each block within the limit
        rows = torch.empty(len(mine) * blk, dtype=torch.long, device=run.device)
        for j, b in enumerate(mine):  # each block's indices written in place: no concatenation
            _indices(len(ds), run, name, b, blk, out=rows[j * blk:(j + 1) * blk])
        try:  # index_select: the rows of ds[rows], a sixth of advanced indexing's time on a CPU
            labels = _on(ds.y.index_select(0, _on(rows, ds.y.device)), run.device)
            x = steps.perturbation.draw_blocks(_on(ds.x.index_select(0, _on(rows, ds.x.device)), run.device),
                                               [noise_generator(run, name, b) for b in mine], rows, labels)
            if any(k < blk for k in needed):
                x, labels = (torch.cat([t[j * blk: j * blk + k] for j, k in enumerate(needed)]) for t in (x, labels))
            return per_rank, needed, rows, x, labels
        except (torch.OutOfMemoryError, RuntimeError, MemoryError) as err:
            if size > 1:
                raise
            run.forward.batch_size = batch
            run.forward.back_off(err)
            for forward in models:
                forward.batch_size = run.forward.batch_size


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` (itself when it is there: no dispatch, a microsecond less per call)."""
    return t if t.device == device else t.to(device)


def _outcomes(runs: tuple, models: tuple, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's outcomes on the perturbed inputs ``x`` (in its own working dtype), a boolean
    tensor of shape (models, rows), and whether each model's logits were all finite, shape
    (models,), scored together (``ranking.score``) and kept on the device until the step's one
    host read."""
    logits = [forward.logits(x if x.dtype == each.dtype or not x.dtype.is_floating_point else x.to(each.dtype),
                             raw=True) for forward, each in zip(models, runs)]  # token ids stay as they are
    return score(models, logits, y)


def _table(correct: torch.Tensor, finite: torch.Tensor, needed: list, per_rank: int, blk: int,
           models: tuple) -> torch.Tensor:
    """This rank's table of the step for the gather across ranks, one row per block: each model's
    outcomes, then each model's finiteness flag and the batch size."""
    width = len(models) * blk
    local = torch.zeros((per_rank, width + len(models) + 1), dtype=torch.long, device=finite.device)
    for m, (hits, flag) in enumerate(zip(correct, finite)):
        local[:, width + m] = flag
        if sum(needed) == per_rank * blk:  # whole blocks: one copy
            local[:, m * blk: (m + 1) * blk] = hits.view(per_rank, blk)
        else:
            for j, part in enumerate(hits.split(needed)):
                local[j, m * blk: m * blk + len(part)] = part
    local[:, -1] = min(f.batch_size for f in models)
    return local


def bernoulli_stream(run: Run, perturbation: Perturbation, draws: int, threshold: float | None = None,
                     ds: TensorData | None = None, label: str = "", name: str | None = None,
                     at_least: int = 0) -> Stream:
    """Draw (input, perturbation) pairs of ``ds`` (default: the run's data) and record whether the
    model is correct, until the sequential gate at ``threshold`` decides or ``draws`` draws are made.
    With ``at_least`` the stream goes on to that many draws (rounded up to whole blocks,
    ``block_size``, within ``draws``) after a decision, and every one of them counts in the estimate and
    bounds (the anytime-valid bounds hold at any time; ``summary`` explains the verdict).

    The random streams are the run's "<name>-index" and "<name>-noise" (``Run.stream``), with
    ``name`` the check's stream namespace by default. ``label`` names the
    stream in progress reports (default: the check's name). Evaluations are charged to the run's
    current phase.
    """
    ds, name = run.ds if ds is None else ds, name or run.streams
    steps = Steps(run, ds, perturbation, name)
    blk = steps.blk
    at_least = -(-at_least // blk) * blk
    gate = SequentialGate(threshold, run.alpha) if threshold is not None else None
    outcomes, indices, drawn, block = Column(bool), Column(np.int64), 0, 0

    def going(drawn: int) -> bool:  # whether the stream takes another step after ``drawn`` draws
        return drawn < draws and (_undecided(gate) or drawn < at_least)

    def next_step(drawn: int, block: int) -> Launched:
        # a gate may decide at any draw: steps grow 1, 1, 2, 4, ... blocks up to the batch size,
        # so a gate that decides early never pays for a huge batch
        most = max(1, block) if gate is not None else block + draws
        limit = draws - drawn if _undecided(gate) else min(draws, at_least) - drawn  # decided: on to at_least
        return launch(steps, block, limit, most)

    pending = next_step(0, 0) if going(0) else None
    while pending is not None:
        # the look-ahead: the next step is launched before this one is read, as if the gate stays
        # undecided; where it decides, that step is dropped (its evaluations are spent, its draws unused)
        size = min(pending.limit, pending.consumed * blk)
        ahead = looks_ahead(run) and drawn + size < draws and _undecided(gate)
        following = next_step(drawn + size, block + pending.consumed) if ahead else None
        hits, idx, consumed = read(pending)
        hits = hits[0]
        block += consumed
        outcomes.extend(hits)
        indices.extend(idx)
        drawn += len(hits)
        if gate is not None and gate.decision is None:
            gate.update(hits)
        _progress(run, label or run.title, outcomes, drawn, draws)
        # the time limit (``Run.clock``) stops the stream between steps: the bounds are
        # anytime-valid, so they hold wherever it stops
        if not going(drawn) or run.clock.expired():
            pending = None
        elif following is not None and _undecided(gate):
            pending = following
        else:
            pending = next_step(drawn, block)
    return Stream(outcomes.values, indices.values,
                  gate.decision if gate is not None else None, gate.p_values() if gate is not None else None,
                  at_least)


def _undecided(gate: SequentialGate | None) -> bool:
    """Whether a stream has no gate, or one that has not decided."""
    return gate is None or gate.decision is None


def _progress(run: Run, label: str, outcomes: Column, drawn: int, draws: int) -> None:
    """After a step: the time limit's pace and the progress line (its bounds computed only when shown)."""
    run.clock.pace(label, drawn, draws, "draws")
    run.forward.report_progress(metric=label, draws=drawn, budget=draws, forward_passes=run.forward.passes,
                                bounds=lambda: confidence_sequence(outcomes.values, run.alpha))


def summary(stream: Stream, alpha: float, threshold: float | None) -> tuple[float, float, float, dict]:
    """(estimate, lower, upper, details) of a stream: the anytime-valid confidence sequence, for
    reference fixed-sample Clopper-Pearson bounds, and with a threshold the gate's anytime-valid
    p-values of its two claims (``details["p_values"]``). Always lower <= estimate <= upper.

    When the numbers rest on the gate's own draws (``used`` is the decision's draw), the bounds
    start from the gate's threshold on its decided side, so they agree with its decision exactly.
    When the stream went on past its decision (``at_least``: NPPR), estimate and bounds rest on
    every draw, and so does the verdict (``results.decide`` on these bounds): the sequence over all
    draws is valid at that stopping time on its own, while joining it to the gate's earlier claim
    could give bounds that exclude the estimate, or even cross, when the later draws contradict it.
    A betting sequence can exclude the sample mean (rejections are kept from earlier looks); the
    shown bounds are widened to hold it (conservative: a wider interval keeps its coverage)."""
    used, decision = stream.used, stream.decision
    outcomes = stream.outcomes[:used]
    correct = int(outcomes.sum())
    own = decision is not None and used <= decision.at  # the numbers rest on the gate's draws only
    lower, upper = confidence_sequence(
        outcomes, alpha,
        lower_at_least=threshold if own and decision.verdict == "pass" else 0.0,
        upper_at_most=threshold if own and decision.verdict == "fail" else 1.0,
    )
    lower, upper = min(lower, correct / used), max(upper, correct / used)
    gated = {"p_values": stream.p_values} if threshold is not None and stream.p_values is not None else {}
    return correct / used, lower, upper, {
        **gated,
        "correct": correct,
        "cp_lower": clopper_pearson_lower(correct, used, alpha),
        "cp_upper": clopper_pearson_upper(correct, used, alpha),
        "cp_note": "Clopper-Pearson bounds are valid for a fixed number of draws only",
        "test": f"anytime-valid betting test (Waudby-Smith & Ramdas 2024), one-sided, alpha={alpha:g}",
        "inputs_seen": int(np.count_nonzero(np.bincount(stream.indices[:used]))),
    }


def accuracy(run: Run, perturbation: Perturbation, details: dict | None = None) -> Result:
    """The whole check "accuracy under ``perturbation`` >= threshold": draws until the gate
    decides or the budget is spent (exactly the budget without a threshold); ``details`` are
    added to the stream's."""
    stream = bernoulli_stream(run, perturbation, run.remaining(), run.args.threshold)
    estimate, lower, upper, info = summary(stream, run.alpha, run.args.threshold)
    return run.result(estimate=estimate, lower=lower, upper=upper, draws=stream.used,
                      perturbation=repr(perturbation), details={**info, "procedure": "bernoulli", **(details or {})})
