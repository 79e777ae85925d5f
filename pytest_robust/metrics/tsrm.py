"""Total statistical robustness metric (TSRM; Wang, Webb & Rainforth, eq. 5), in its accuracy form.

    TSRM(f) = P_{(X, Y) ~ data, X' ~ p(. | X)} ( argmax f(X') = Y )     (a tie counts as an error)

with the data distribution taken to be the uniform distribution over the given inputs. Each draw
picks an input uniformly at random (with replacement) and one fresh perturbation of it, so the
correct/incorrect outcomes form an i.i.d. Bernoulli(TSRM) stream. The gate "TSRM >= threshold" is
the anytime-valid betting test of ``stats.SequentialGate`` at level alpha = 1 - confidence: it
stops as soon as pass or fail is proven and returns "inconclusive" when the budget runs out.

The stream (``bernoulli_stream``) is shared with every check that gates an accuracy under random
draws (NPPR's learned distribution, its context noises): it runs inside a ``run.Run`` and spends
that run's budget. One draw costs one model evaluation; the batch in which the decision falls is
evaluated whole, so evaluations can exceed draws by less than one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import collective
from ..engine import TensorData, correct_predictions, report_progress, stream_generator
from ..inspection import records_warnings
from ..perturbations import Perturbation, as_perturbation
from ..results import Result
from ..run import Run
from ..stats import SequentialGate, clopper_pearson_lower, clopper_pearson_upper, confidence_sequence

#: Draws generated from one random stream; a fixed size, so results do not depend on batch size.
BLOCK = 256


@dataclass
class Stream:
    """The outcomes of a Bernoulli stream (correct or not per draw), the inputs drawn, and the
    gate's decision (None: undecided or ungated)."""

    outcomes: np.ndarray
    indices: np.ndarray
    decision: object

    @property
    def used(self) -> int:
        """Draws the verdict rests on: up to the decision, else all."""
        return self.decision.at if self.decision is not None else len(self.outcomes)


def _indices(n_inputs: int, seed: int, name: str, index: int, device) -> torch.Tensor:
    """Input indices of block ``index`` of the draw stream (uniform, with replacement), drawn on
    ``device`` (on the CPU they are the same numbers on any host)."""
    return torch.randint(n_inputs, (BLOCK,), generator=stream_generator(seed, f"{name}-index", index, device=device),
                         device=device)


def noise_generator(seed: int, name: str, block: int, device) -> torch.Generator:
    """The generator that perturbs the draws of block ``block`` of stream ``name`` (on ``device``):
    a metric that mixes perturbations can recover which one each draw got."""
    return stream_generator(seed, f"{name}-noise", block, device=device)


def _step(run: Run, ds: TensorData, perturbation: Perturbation, name: str, first: int, limit: int, most: int):
    """(outcomes, input indices, blocks consumed) of the next step, in block order, at most ``limit``.

    A step is ``ceil(batch_size / BLOCK)`` blocks per process, fewer when the remaining draws
    (``limit``) need fewer or when ``most`` (blocks in all) is smaller; under torch.distributed rank r
    evaluates blocks first + r, first + r + W, ... and the outcomes are gathered in block order,
    so every rank sees the same stream as a single process would. Only the first ``limit`` draws
    of the step are evaluated, by a single process or across the ranks; a rank whose blocks all
    lie past the limit evaluates nothing and still joins the gather. The batch size is the ranks'
    smallest: each rank sends its batch size with its outcomes, so an out-of-memory error on one
    rank shrinks every rank's next step alike. One collective and one host read per step: the
    outcomes, the finiteness of the logits (``Forward.deferring``), the batch sizes and the input
    indices come back together.
    """
    rank, size = collective.world()
    batch = run.forward.batch_size
    per_rank = max(1, min(-(-batch // BLOCK), -(-limit // (BLOCK * size)), -(-most // size)))
    mine = range(first + rank, first + per_rank * size, size)
    dev = run.device
    needed = [min(max(limit - (b - first) * BLOCK, 0), BLOCK) for b in mine]  # rows of each block within the limit
    idx = [_indices(len(ds), run.seed, name, b, dev) for b in mine]
    x = torch.cat([
        perturbation.draw(ds.x[i].to(dev), noise_generator(run.seed, name, b, dev), i, ds.y[i])[:k]
        for b, i, k in zip(mine, idx, needed)
    ])
    with run.forward.deferring():
        hits = correct_predictions(run.forward.logits(x), ds.y[torch.cat([i[:k] for i, k in zip(idx, needed)])])
        # per block: its outcomes, then this rank's finiteness flag and batch size
        local = torch.zeros((per_rank, BLOCK + 2), dtype=torch.long, device=dev)
        for j, part in enumerate(hits.split(needed)):
            local[j, : len(part)] = part
        local[:, BLOCK] = run.forward.finite_flag(dev)
        local[:, BLOCK + 1] = run.forward.batch_size
    blocks = range(first, first + per_rank * size)  # other ranks' indices are regenerated, not sent
    indices = torch.cat([_indices(len(ds), run.seed, name, b, dev) if (b - first) % size != rank
                         else idx[(b - first) // size] for b in blocks])
    gathered = collective.gather_blocks(local)
    host = torch.cat([gathered.reshape(-1), indices]).cpu().numpy()
    table, indices = host[: gathered.numel()].reshape(gathered.shape), host[gathered.numel():]
    run.forward.check_flag(int(table[:, BLOCK].min()))
    run.forward.batch_size = int(table[:, BLOCK + 1].min())
    return table[:, :BLOCK].reshape(-1)[:limit].astype(bool), indices[:limit], per_rank * size


def bernoulli_stream(run: Run, perturbation: Perturbation, draws: int, threshold: float | None = None,
                     ds: TensorData | None = None, name: str = "tsrm", label: str = "TSRM") -> Stream:
    """Draw (input, perturbation) pairs of ``ds`` (default: the run's data) and record whether the
    model is correct, until the sequential gate at ``threshold`` decides or ``draws`` draws are made.

    ``name`` keys the random streams (a different name gives independent draws), ``label`` names
    the stream in progress reports. Evaluations are charged to the run's current phase.
    """
    ds = run.ds if ds is None else ds
    gate = SequentialGate(threshold, run.alpha) if threshold is not None else None
    outcomes, indices, drawn, block = [], [], 0, 0
    while drawn < draws and (gate is None or gate.decision is None):
        # a gate may decide at any draw: steps grow 1, 1, 2, 4, ... blocks up to the batch size,
        # so a gate that decides early never pays for a huge batch
        most = max(1, block) if gate is not None else block + draws
        hits, idx, consumed = _step(run, ds, perturbation, name, block, draws - drawn, most)
        block += consumed
        outcomes.append(hits)
        indices.append(idx)
        drawn += len(hits)
        if gate is not None:
            gate.update(hits)
        report_progress(
            metric=label, draws=drawn, budget=draws, forward_passes=run.forward.passes,
            bounds=lambda: confidence_sequence(np.concatenate(outcomes), run.alpha),
        )
    return Stream(np.concatenate(outcomes), np.concatenate(indices),
                  gate.decision if gate is not None else None)


def summary(stream: Stream, alpha: float, threshold: float | None) -> tuple[float, float, float, dict]:
    """(estimate, lower, upper, details) of a stream: the anytime-valid confidence sequence (agreeing
    with the gate's decision exactly) and, for reference, fixed-sample Clopper-Pearson bounds."""
    used, decision = stream.used, stream.decision
    outcomes = stream.outcomes[:used]
    correct = int(outcomes.sum())
    lower, upper = confidence_sequence(
        outcomes, alpha,
        lower_at_least=threshold if decision and decision.verdict == "pass" else 0.0,
        upper_at_most=threshold if decision and decision.verdict == "fail" else 1.0,
    )
    return correct / used, lower, upper, {
        "correct": correct,
        "cp_lower": clopper_pearson_lower(correct, used, alpha),
        "cp_upper": clopper_pearson_upper(correct, used, alpha),
        "cp_note": "Clopper-Pearson bounds are valid for a fixed number of draws only",
        "test": f"anytime-valid betting test (Waudby-Smith & Ramdas 2024), one-sided, alpha={alpha:g}",
        "inputs_seen": int(len(np.unique(stream.indices[:used]))),
    }


@records_warnings
def tsrm(
    model: torch.nn.Module, data, perturbation, threshold: float | None = None, *, confidence: float = 0.95,
    budget: int = 100_000, seed: int = 0, batch_size: int = 1024, device=None,
) -> Result:
    """Estimate the TSRM accuracy of ``model`` on ``data`` under ``perturbation`` and gate it.

    With ``threshold`` set, draws continue until the sequential test proves TSRM >= threshold
    ("pass") or TSRM < threshold ("fail"), each with error probability <= 1 - confidence, or
    until ``budget`` model evaluations ("inconclusive"). Without a threshold exactly ``budget``
    draws are made. ``lower``/``upper`` of the result form an anytime-valid confidence sequence at
    that level; ``details`` adds the fixed-sample Clopper–Pearson bounds and bookkeeping.
    """
    perturbation = as_perturbation(perturbation)
    with Run("tsrm", model, data, threshold=threshold, confidence=confidence, budget=budget, seed=seed,
             batch_size=batch_size, device=device, perturbation=perturbation) as run:
        stream = bernoulli_stream(run, perturbation, run.args.budget, run.args.threshold)
    estimate, lower, upper, details = summary(stream, run.alpha, run.args.threshold)
    return run.result(estimate=estimate, lower=lower, upper=upper, draws=stream.used,
                      perturbation=repr(perturbation), details=details)
