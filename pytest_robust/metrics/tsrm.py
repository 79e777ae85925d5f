"""Total statistical robustness metric (TSRM; Wang, Webb & Rainforth, eq. 5), in its accuracy form.

    TSRM(f) = P_{(X, Y) ~ data, X' ~ p(. | X)} ( argmax f(X') = Y )     (a tie counts as an error)

with the data distribution taken to be the uniform distribution over the given inputs. Each draw
picks an input uniformly at random (with replacement) and one fresh perturbation of it, so the
correct/incorrect outcomes form an i.i.d. Bernoulli(TSRM) stream. The gate "TSRM >= threshold" is
the anytime-valid betting test of ``stats.SequentialGate`` at level alpha = 1 - confidence: it
stops as soon as pass or fail is proven and returns "inconclusive" when the draw budget runs out.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..engine import (
    Forward,
    correct_predictions,
    gather_blocks,
    guarded,
    load_data,
    report_progress,
    resolve_device,
    stream_generator,
    sum_over_ranks,
    world,
)
from ..perturbations import as_perturbation
from ..results import Result
from ..stats import SequentialGate, clopper_pearson_lower, clopper_pearson_upper, confidence_sequence
from ..validation import check_run_args

#: Draws generated from one random stream; a fixed size, so results do not depend on batch size.
BLOCK = 256


def _indices(n_inputs: int, seed: int, index: int) -> torch.Tensor:
    """Input indices of block ``index`` of the draw stream (uniform, with replacement)."""
    return torch.randint(n_inputs, (BLOCK,), generator=stream_generator(seed, "tsrm-index", index))


def noise_generator(seed: int, block: int, device) -> torch.Generator:
    """The generator that perturbs the draws of block ``block`` (one per block, on ``device``)."""
    return stream_generator(seed, "tsrm-noise", block, device=device)


def _step(forward: Forward, ds, perturbation, seed: int, first: int, device, limit: int):
    """(outcomes, input indices, blocks consumed) of the next step, in block order, at most ``limit``.

    A step is ``ceil(batch_size / BLOCK)`` blocks per process; under torch.distributed rank r
    evaluates blocks first + r, first + r + W, ... and the outcomes are gathered in block order,
    so every rank sees the same stream as a single process would. A single process evaluates
    only the first ``limit`` draws (ranks evaluate whole blocks; the surplus is dropped).
    """
    rank, size = world()
    per_rank = -(-forward.batch_size // BLOCK)
    mine = range(first + rank, first + per_rank * size, size)
    drawn = {b: _indices(len(ds), seed, b) for b in mine}
    idx = list(drawn.values())
    x = torch.cat([
        perturbation(ds.x[i.to(ds.x.device)].to(device), noise_generator(seed, b, device))
        for b, i in zip(mine, idx)
    ])
    y = ds.y[torch.cat(idx).to(ds.y.device)].to(device)
    if size == 1:
        hits = correct_predictions(forward.logits(x[:limit]), y[:limit])
    else:
        hits = gather_blocks(correct_predictions(forward.logits(x), y).reshape(per_rank, BLOCK)).reshape(-1)
    blocks = range(first, first + per_rank * size)  # other ranks' indices are regenerated, not sent
    indices = torch.cat([drawn[b] if b in drawn else _indices(len(ds), seed, b) for b in blocks])
    return hits[:limit].cpu().numpy(), indices[:limit].numpy(), per_rank * size


def tsrm(
    model: torch.nn.Module,
    data,
    perturbation,
    threshold: float | None = None,
    *,
    confidence: float = 0.95,
    budget: int = 100_000,
    seed: int = 0,
    batch_size: int = 1024,
    device=None,
) -> Result:
    """Estimate the TSRM accuracy of ``model`` on ``data`` under ``perturbation`` and gate it.

    With ``threshold`` set, draws continue until the sequential test proves TSRM >= threshold
    ("pass") or TSRM < threshold ("fail"), each with error probability <= 1 - confidence, or
    until ``budget`` draws ("inconclusive"). Without a threshold exactly ``budget`` draws are made.
    ``lower``/``upper`` of the result form an anytime-valid confidence sequence at that level;
    ``details`` adds the fixed-sample Clopper–Pearson bounds and bookkeeping.
    """
    return tsrm_stream(model, data, perturbation, threshold, confidence=confidence, budget=budget, seed=seed,
                       batch_size=batch_size, device=device)[0]


def tsrm_stream(model: torch.nn.Module, data, perturbation, threshold: float | None = None, *,
                confidence: float = 0.95, budget: int = 100_000, seed: int = 0, batch_size: int = 1024,
                device=None) -> tuple[Result, np.ndarray]:
    """``tsrm`` and the outcome stream its verdict rests on (bool per draw, in draw order). Draw
    i perturbed its input with the generator ``noise_generator(seed, i // BLOCK, device)``, so a
    metric that mixes perturbations can recover which one each draw got."""
    args = check_run_args(threshold=threshold, confidence=confidence, budget=budget, seed=seed, batch_size=batch_size)
    perturbation = as_perturbation(perturbation)
    ds = load_data(data)
    device = resolve_device(device, model)
    started = time.perf_counter()
    gate = SequentialGate(args.threshold, args.alpha) if args.threshold is not None else None
    outcomes, indices = [], []
    drawn = 0
    with guarded(model, device) as info:
        forward = Forward(model, args.batch_size, max_label=int(ds.y.max()))
        block = 0
        while drawn < args.budget and (gate is None or gate.decision is None):
            hits, idx, consumed = _step(forward, ds, perturbation, args.seed, block, device, args.budget - drawn)
            block += consumed
            outcomes.append(hits)
            indices.append(idx)
            drawn += len(hits)
            if gate is not None:
                gate.update(hits)
            report_progress(
                metric="TSRM", draws=drawn, budget=args.budget, forward_passes=forward.passes,
                bounds=lambda: confidence_sequence(np.concatenate(outcomes), args.alpha),
            )
    decision = gate.decision if gate is not None else None
    used = decision.at if decision is not None else drawn
    stream = np.concatenate(outcomes)[:used]
    correct = int(stream.sum())
    lower, upper = confidence_sequence(
        stream,
        args.alpha,
        lower_at_least=args.threshold if decision and decision.verdict == "pass" else 0.0,
        upper_at_most=args.threshold if decision and decision.verdict == "fail" else 1.0,
    )
    verdict = "estimate" if gate is None else (decision.verdict if decision else "inconclusive")
    result = Result(
        metric="tsrm",
        estimate=correct / used,
        lower=lower,
        upper=upper,
        threshold=args.threshold,
        confidence=args.confidence,
        verdict=verdict,
        n_inputs=len(ds),
        draws=used,
        forward_passes=sum_over_ranks(forward.passes),
        seconds=time.perf_counter() - started,
        device=str(device),
        seed=args.seed,
        perturbation=repr(perturbation),
        budget=args.budget,
        details={
            "correct": correct,
            "cp_lower": clopper_pearson_lower(correct, used, args.alpha),
            "cp_upper": clopper_pearson_upper(correct, used, args.alpha),
            "cp_note": "Clopper-Pearson bounds are valid for a fixed number of draws only",
            "test": f"anytime-valid betting test (Waudby-Smith & Ramdas 2024), one-sided, alpha={args.alpha:g}",
            "inputs_seen": int(len(np.unique(np.concatenate(indices)[:used]))),
            "batch_size": forward.batch_size,
            "oom_halvings": forward.halvings,
            "model_was_training": info["model_was_training"],
        },
    )
    return result, stream
