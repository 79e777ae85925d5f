"""Certified robustness by randomized smoothing (Cohen, Rosenfeld & Kolter, ICML 2019), reported
the way Sun, Mao, Mueller & Vechev (ICML 2025) recommend: certified accuracy at fixed radii and the
empirical distribution of p_A, not the average certified radius (ACR).

Units. ``sigma`` (noise standard deviation) and ``radius`` (L2) are in the space of the tensors
the model receives: noise is added to the data exactly as given, without clipping. Keep the
normalisation inside the model and both stay in pixel units (sigma = 0.25 on [0, 1] images is
Cohen's setting); normalising outside the model puts them in normalised units.

Noise. Draw t of input i is x_i + sigma * eps, where eps is row t % BLOCK of block t // BLOCK of
input i's stream, ``stream_generator(seed, "smoothing", i, t // BLOCK)``. Every function here reads
draws from these streams in order, so per-input numbers depend on (seed, device, dtype) only, never
on batch size, packing or the other inputs. Batches mix draws of many inputs; there is no Python
loop per draw.

Base classifier. f(x) is the unique argmax of the logits; a tie counts as no class (never as the
true class), as everywhere in pytest-robust. This only lowers p_A, so certificates stay valid.

Entry points:
- ``certify`` / ``predict``: Cohen's CERTIFY and PREDICT with fixed sample sizes.
- ``certified_accuracy``: the gate "certified accuracy at radius r >= threshold" with per-input
  sequential tests that stop as soon as each input is decided.
- ``pa_report``: per-input p_A estimates, their survival curve, certified accuracy against radius
  and its conversion to other budgets (the seed's appendix B).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from .. import smoothing, validation
from ..engine import (
    Forward,
    correct_predictions,
    guarded,
    load_data,
    report_progress,
    resolve_device,
    stream_generator,
)
from ..inspection import records_warnings
from ..results import Result
from ..stats import SequentialGate, clopper_pearson_lower, clopper_pearson_upper
from ..validation import SettingError, check_run_args

#: Draws per random-stream block (the unit in which noise is generated and inputs are packed).
BLOCK = 64
#: An input may take at most drawn / GROWTH more draws in one step (bounds the draws a decision
#: mid-chunk wastes to about 1/GROWTH), and never less than one block.
GROWTH = 4
#: Draws of one input generated at a time by the fixed-size procedures (a multiple of BLOCK).
PIECE = 16 * BLOCK
#: Prediction code of an abstention in ``certify`` and ``predict``.
ABSTAIN = -1

ACR_WARNING = (
    "ACR (average certified radius) is shown for comparison with older papers only. It is a poor "
    "metric (Sun et al., ICML 2025): a constant classifier reaches any ACR given enough draws, an "
    "input already near p_A = 1 adds far more to it than a hard input, and the ranking of models "
    "by ACR changes with the budget n. Compare models by certified accuracy at fixed radii and by "
    "the distribution of p_A."
)


def _noisy(x_i: torch.Tensor, sigma: float, seed: int, index: int, start: int, stop: int, device) -> torch.Tensor:
    """Draws start..stop-1 of input ``index``: x_i + sigma * eps from the input's stream blocks."""
    first, last = start // BLOCK, (stop - 1) // BLOCK
    noise = torch.cat([
        torch.randn(
            (BLOCK,) + tuple(x_i.shape),
            generator=stream_generator(seed, "smoothing", index, block, device=device),
            device=device,
            dtype=x_i.dtype,
        )
        for block in range(first, last + 1)
    ])
    offset = first * BLOCK
    return x_i + sigma * noise[start - offset : stop - offset]


# ----------------------------------------------------------------------------------------------
# Fixed sample sizes: class counts per input (CERTIFY, PREDICT, the pA report)
# ----------------------------------------------------------------------------------------------


def _pieces(x: torch.Tensor, sigma: float, phases, seed: int, device):
    """(noisy rows, tags) of every input's draws in each phase, inputs one after another, cut at
    multiples of PIECE; a row's tag is input * len(phases) + phase."""
    for i in range(len(x)):
        for p, (start, stop) in enumerate(phases):
            edges = [start, *range((start // PIECE + 1) * PIECE, stop, PIECE), stop]
            for a, b in zip(edges, edges[1:]):
                tags = torch.full((b - a,), i * len(phases) + p, dtype=torch.long, device=device)
                yield _noisy(x[i], sigma, seed, i, a, b, device), tags


def _full_batches(pieces, forward: Forward):
    """Re-cut a stream of (rows, tags) into batches of exactly ``forward.batch_size`` rows (the last
    may be shorter), so that the device always evaluates full batches."""
    rows, tags, count = [], [], 0
    for piece_rows, piece_tags in pieces:
        rows.append(piece_rows)
        tags.append(piece_tags)
        count += len(piece_tags)
        if count >= forward.batch_size:
            all_rows, all_tags = torch.cat(rows), torch.cat(tags)
            full = count - count % forward.batch_size
            yield all_rows[:full], all_tags[:full]
            rows, tags, count = [all_rows[full:]], [all_tags[full:]], count - full
    if count:
        yield torch.cat(rows), torch.cat(tags)


def _class_counts(forward: Forward, x: torch.Tensor, sigma: float, phases, seed: int, device,
                  metric: str) -> np.ndarray:
    """Counts of f(x_i + eps) over the draws of each phase: array (inputs, phases, classes).

    ``phases`` are draw ranges [start, stop) of every input's stream (disjoint ranges are
    independent samples). A tie between logits counts in no class. ``metric`` names the
    procedure in progress reports.
    """
    counts = None
    total = len(x) * sum(stop - start for start, stop in phases)
    for rows, tags in _full_batches(_pieces(x, sigma, phases, seed, device), forward):
        logits = forward.logits(rows)
        n_classes = logits.shape[1]
        top = logits.topk(2, dim=1).values
        pred = torch.where(top[:, 0] > top[:, 1], logits.argmax(dim=1), n_classes)
        if counts is None:
            counts = torch.zeros(len(x) * len(phases), n_classes + 1, dtype=torch.long, device=device)
        counts.index_put_((tags, pred), torch.ones_like(pred), accumulate=True)
        report_progress(metric=metric, draws=forward.passes, budget=total)
    return counts[:, :-1].reshape(len(x), len(phases), -1).cpu().numpy()


def _validate_fixed(sigma, alpha, seed, batch_size, **sizes) -> tuple[float, float]:
    sigma = validation.positive_float("sigma", sigma)
    alpha = validation.open_unit("alpha", alpha)
    validation.non_negative_int("seed", seed)
    validation.positive_int("batch_size", batch_size)
    for key, value in sizes.items():
        validation.positive_int(key, value)
    return sigma, alpha


@dataclass
class Certification:
    """Per-input outcome of Cohen's CERTIFY; every array is indexed like the data.

    ``prediction`` is the certified class or ABSTAIN (-1); ``count`` is how many of the n
    estimation draws fell in the class chosen from the n0 selection draws, ``pa_estimate`` =
    count / n and ``pa_lower`` its one-sided (1 - alpha) Clopper-Pearson lower bound; ``radius``
    = sigma Phi^-1(pa_lower) (0 when abstaining); ``correct`` = not abstained and prediction ==
    label; ``draws`` = n0 + n per input. With probability >= 1 - alpha per input, the smoothed
    classifier returns ``prediction`` everywhere within ``radius`` (L2, in input units).
    """

    sigma: float
    n0: int
    n: int
    alpha: float
    seed: int
    device: str
    seconds: float
    forward_passes: int
    label: np.ndarray
    prediction: np.ndarray
    count: np.ndarray
    pa_estimate: np.ndarray
    pa_lower: np.ndarray
    radius: np.ndarray
    correct: np.ndarray
    draws: np.ndarray

    def certified(self, radius: float) -> np.ndarray:
        """Boolean per input: correct and certified at L2 radius ``radius`` (input units)."""
        radius = validation.non_negative_float("radius", radius)
        return self.correct & (self.radius >= radius)

    def certified_accuracy(self, radius: float) -> float:
        """Fraction of inputs certified correct at ``radius`` (abstentions never count)."""
        return float(np.mean(self.certified(radius)))

    def to_result(self, confidence: float = 0.95) -> Result:
        """A report-ready summary (metric "certify", verdict "estimate"): the smoothed classifier's
        certified-correct fraction at radius 0 with Clopper-Pearson bounds over inputs, and the
        certified-accuracy-against-radius curve (a PNG in the report directory)."""
        n_in, k = len(self.label), int(self.certified(0.0).sum())
        alpha_over_inputs = 1.0 - confidence
        radii = sorted({0.0, *np.round(self.radius[self.correct], 4).tolist()})
        return Result(
            metric="certify", estimate=k / n_in,
            lower=clopper_pearson_lower(k, n_in, alpha_over_inputs),
            upper=clopper_pearson_upper(k, n_in, alpha_over_inputs),
            threshold=None, confidence=confidence, verdict="estimate", n_inputs=n_in,
            draws=int(self.draws.sum()), forward_passes=self.forward_passes, seconds=self.seconds,
            device=self.device, seed=self.seed,
            perturbation=f"Gaussian smoothing sigma={self.sigma:g}, CERTIFY n0={self.n0}, n={self.n}, alpha={self.alpha:g}",
            budget=int(self.draws.sum()),
            note=f"{int((self.prediction == ABSTAIN).sum())} of {n_in} inputs abstained; per-input results are "
                 "in the Certification object",
            details={
                "curves": {"certified_accuracy": {
                    "title": f"CERTIFY: certified accuracy against radius (sigma={self.sigma:g})",
                    "xlabel": "L2 radius (input units)", "ylabel": "certified accuracy",
                    "x": radii, "series": {"certified accuracy": [self.certified_accuracy(r) for r in radii]},
                }},
            },
        )


def certify(
    model: torch.nn.Module,
    data,
    sigma: float,
    n0: int = 100,
    n: int = 100_000,
    alpha: float = 0.001,
    *,
    seed: int = 0,
    batch_size: int = 1024,
    device=None,
) -> Certification:
    """Cohen's CERTIFY for every input, batched across inputs.

    Per input: c_A = the most frequent class among draws 0..n0-1 of its noise stream; k = how many
    of the n fresh draws n0..n0+n-1 fall in c_A; p_lower = BetaInv(alpha; k, n - k + 1) (one-sided
    Clopper-Pearson); abstain if p_lower < 1/2, else certify c_A within radius sigma Phi^-1(p_lower).
    ``sigma`` is in the units of the model's inputs. Defaults are Cohen's (n0=100, n=100 000,
    alpha=0.001). Certified accuracy at any radius: ``result.certified_accuracy(r)``.
    """
    sigma, alpha = _validate_fixed(sigma, alpha, seed, batch_size, n0=n0, n=n)
    ds = load_data(data)
    device = resolve_device(device, model)
    started = time.perf_counter()
    with guarded(model, device):
        forward = Forward(model, batch_size, max_label=int(ds.y.max()))
        counts = _class_counts(forward, ds.x.to(device), sigma, [(0, n0), (n0, n0 + n)], seed, device, "CERTIFY")
    choice = counts[:, 0].argmax(axis=1)
    k = counts[np.arange(len(choice)), 1, choice]
    lower_of = {c: clopper_pearson_lower(c, n, alpha) for c in np.unique(k).tolist()}
    pa_lower = np.array([lower_of[c] for c in k.tolist()])
    abstain = pa_lower < 0.5
    radius = np.array([sigma * smoothing.NORMAL.inv_cdf(p) if p >= 0.5 else 0.0 for p in pa_lower])
    prediction = np.where(abstain, ABSTAIN, choice)
    label = ds.y.cpu().numpy()
    return Certification(
        sigma=sigma, n0=n0, n=n, alpha=alpha, seed=seed, device=str(device),
        seconds=time.perf_counter() - started, forward_passes=forward.passes,
        label=label, prediction=prediction, count=k, pa_estimate=k / n, pa_lower=pa_lower,
        radius=radius, correct=prediction == label, draws=np.full(len(label), n0 + n),
    )


@dataclass
class Prediction:
    """Per-input outcome of Cohen's PREDICT: ``prediction`` (ABSTAIN = -1), the top two class
    counts among the n draws, the two-sided binomial p-value of their comparison, ``correct``."""

    sigma: float
    n: int
    alpha: float
    seed: int
    device: str
    seconds: float
    forward_passes: int
    label: np.ndarray
    prediction: np.ndarray
    top_count: np.ndarray
    runner_up_count: np.ndarray
    p_value: np.ndarray
    correct: np.ndarray


def predict(
    model: torch.nn.Module,
    data,
    sigma: float,
    n: int = 10_000,
    alpha: float = 0.001,
    *,
    seed: int = 0,
    batch_size: int = 1024,
    device=None,
) -> Prediction:
    """Cohen's PREDICT for every input: the top two classes' counts n_A >= n_B among n noisy draws;
    return the top class unless the two-sided binomial test of n_A out of n_A + n_B at p = 1/2 has
    p-value > alpha (then abstain). The returned class differs from the smoothed classifier's with
    probability <= alpha. ``sigma`` is in the units of the model's inputs."""
    sigma, alpha = _validate_fixed(sigma, alpha, seed, batch_size, n=n)
    ds = load_data(data)
    device = resolve_device(device, model)
    started = time.perf_counter()
    with guarded(model, device):
        forward = Forward(model, batch_size, max_label=int(ds.y.max()))
        counts = _class_counts(forward, ds.x.to(device), sigma, [(0, n)], seed, device, "PREDICT")[:, 0]
    order = np.argsort(-counts, axis=1, kind="stable")
    rows = np.arange(len(counts))
    top, runner_up = counts[rows, order[:, 0]], counts[rows, order[:, 1]]
    p_value = np.array([smoothing.predict_pvalue(int(a), int(b)) for a, b in zip(top, runner_up)])
    prediction = np.where(p_value > alpha, ABSTAIN, order[:, 0])
    label = ds.y.cpu().numpy()
    return Prediction(
        sigma=sigma, n=n, alpha=alpha, seed=seed, device=str(device), seconds=time.perf_counter() - started,
        forward_passes=forward.passes, label=label, prediction=prediction, top_count=top,
        runner_up_count=runner_up, p_value=p_value, correct=prediction == label,
    )


# ----------------------------------------------------------------------------------------------
# The gate: certified accuracy at a fixed radius, with per-input sequential tests
# ----------------------------------------------------------------------------------------------


def _check_feasible(n_inputs, threshold, radius, sigma, alpha, confidence, budget, max_draws) -> tuple[int, int]:
    """Refuse requests that cannot pass before spending compute; returns the fewest draws with
    which the sequential test, and a fixed-size Clopper-Pearson test, can certify one input."""
    fixed = smoothing.min_samples_to_certify(radius, sigma, alpha)
    fewest = smoothing.min_sequential_draws(radius, sigma, alpha)
    why = (
        f"fewer draws per input cannot certify L2 radius {radius:g} at sigma={sigma:g}, alpha={alpha:g} even "
        f"if the model is right on every draw (the sequential test needs {fewest}; a fixed-size "
        f"Clopper-Pearson test would need {fixed})"
    )
    if max_draws < fewest:
        raise SettingError("max_draws", max_draws, f"at least {fewest}: {why}")
    if budget < fewest:
        raise SettingError("budget", budget, f"at least {fewest}: {why}")
    if threshold is None:
        return fewest, fixed
    level = 1.0 - confidence
    inputs_needed = smoothing.fewest_inputs_to_pass(threshold, alpha, confidence)
    if inputs_needed is None or n_inputs < inputs_needed:
        best = max(0.0, clopper_pearson_lower(n_inputs, n_inputs, level) - alpha)
        fix = (f"use at least {inputs_needed} inputs or a lower threshold" if inputs_needed
               else f"a threshold below 1 - alpha = {1 - alpha:g}")
        raise SettingError(
            "threshold", threshold,
            f"at most {best:.4f}: with {n_inputs} inputs the {confidence:.0%} lower bound on certified "
            f"accuracy (Clopper-Pearson minus alpha={alpha:g}) cannot exceed that even if every input "
            f"is certified; {fix}",
        )

    def passes(certified: int) -> bool:
        return clopper_pearson_lower(certified, n_inputs, level) - alpha >= threshold

    affordable = min(n_inputs, budget // fewest)
    if not passes(affordable):
        short, needed = affordable, n_inputs  # passes(n_inputs) holds (checked above); bisect the boundary
        while needed - short > 1:
            mid = (short + needed) // 2
            short, needed = (short, mid) if passes(mid) else (mid, needed)
        raise SettingError(
            "budget", budget,
            f"at least {needed * fewest}: passing needs at least {needed} of {n_inputs} inputs certified "
            f"and each certificate at least {fewest} draws (L2 radius {radius:g}, sigma={sigma:g}, "
            f"alpha={alpha:g}); raise the budget or use fewer inputs",
        )
    return fewest, fixed


@dataclass(frozen=True)
class _GatePlan:
    """What the per-input tests need: noise, the tested probability Phi(r/sigma), their level,
    the caps, and the fewest draws with which any test can pass."""

    sigma: float
    required: float
    alpha: float
    seed: int
    budget: int
    max_draws: int
    fewest: int


@dataclass
class _GateRun:
    """Per-input state of the sequential tests: gates, draws consumed, correct draws, outcomes not
    yet fed to the gate (see ``_feed``), rounds of budget allocation."""

    gates: list
    drawn: np.ndarray
    hits: np.ndarray
    waiting: list
    rounds: int = 0

    def decided(self) -> int:
        return sum(g.decision is not None for g in self.gates)


def _feed(run: _GateRun, plan: _GatePlan, i: int, chunk: np.ndarray, stop: int):
    """Give input i's outcomes up to draw ``stop`` to its test; returns its decision or None.

    While every outcome so far is correct and fewer than ``plan.fewest`` draws were made, neither
    side of the test can decide (a pass needs at least ``fewest`` correct draws, a fail needs a
    miss), so the outcomes wait and are fed in one later update: the decision, at its exact draw,
    is the same, with fewer calls into the test.
    """
    run.waiting[i].append(chunk)
    if stop < plan.fewest and chunk.all():
        return None
    block = np.concatenate(run.waiting[i])
    run.waiting[i] = []
    return run.gates[i].update(block)


def _run_gates(forward: Forward, x: torch.Tensor, y: torch.Tensor, plan: _GatePlan, device) -> _GateRun:
    """Run every input's sequential test until it is decided, reaches ``max_draws``, or the total
    ``budget`` is spent.

    Allocation is in rounds, so that it does not depend on packing: each round gives every open
    input (undecided, below max_draws) an equal share of the remaining budget; draws left unused
    by inputs decided early go to the next round. Within a round, up to batch_size // BLOCK inputs
    are active at a time, each contributing whole blocks of draws to one batch (more blocks per
    input when fewer inputs remain, at most drawn / GROWTH), and finished inputs are replaced
    from the queue. A test is fed its draws in stream order and stops at the exact draw where it
    decides; the rest of that chunk counts as forward passes, not as draws.
    """
    n = len(y)
    run = _GateRun([SequentialGate(plan.required, plan.alpha) for _ in range(n)], np.zeros(n, np.int64),
                   np.zeros(n, np.int64), [[] for _ in range(n)])
    while True:
        open_inputs = [i for i in range(n) if run.gates[i].decision is None and run.drawn[i] < plan.max_draws]
        share = (plan.budget - int(run.drawn.sum())) // len(open_inputs) if open_inputs else 0
        if share == 0:
            return run
        run.rounds += 1
        allowance = np.minimum(run.drawn + share, plan.max_draws)
        queue, active = deque(open_inputs), []
        while queue or active:
            slots = max(1, forward.batch_size // BLOCK)
            while queue and len(active) < slots:
                active.append(queue.popleft())
            spans = []
            for i in active:
                start = int(run.drawn[i])
                blocks = max(1, min(slots // len(active), start // (GROWTH * BLOCK)))
                spans.append((i, start, int(min(allowance[i], (start // BLOCK + blocks) * BLOCK))))
            rows = torch.cat([_noisy(x[i], plan.sigma, plan.seed, i, a, b, device) for i, a, b in spans])
            labels = torch.cat([y[i].expand(b - a) for i, a, b in spans])
            hit = correct_predictions(forward.logits(rows), labels).cpu().numpy()
            active, offset = [], 0
            for i, a, b in spans:
                chunk = hit[offset : offset + b - a]
                offset += b - a
                decision = _feed(run, plan, i, chunk, b)
                used = (decision.at if decision else b) - a
                run.hits[i] += int(chunk[:used].sum())
                run.drawn[i] += used
                if decision is None and run.drawn[i] < allowance[i]:
                    active.append(i)
            report_progress(metric="certified accuracy", draws=int(run.drawn.sum()), budget=plan.budget,
                            inputs_done=run.decided, inputs=n, forward_passes=forward.passes)


@records_warnings
def certified_accuracy(
    model: torch.nn.Module,
    data,
    threshold: float | None,
    radius: float,
    sigma: float,
    alpha: float = 1e-3,
    max_draws: int = 100_000,
    *,
    confidence: float = 0.95,
    budget: int = 100_000,
    seed: int = 0,
    batch_size: int = 1024,
    device=None,
) -> Result:
    """Gate: the Gaussian-smoothed model is certified correct within L2 ``radius`` on at least a
    fraction ``threshold`` of ``data``, at the stated confidence.

    ``sigma`` (noise standard deviation) and ``radius`` are in the units of the model's inputs
    (pixel units when the normalisation is inside the model).

    Per input: the anytime-valid betting test of H0: p_y <= Phi(radius / sigma) at level
    ``alpha`` (``stats.SequentialGate``), fed one draw at a time in stream order; it stops at the
    first draw where it certifies (rejects H0) or proves the input not certifiable (rejects
    p_y >= Phi(radius / sigma)). With the label known no class-selection step is needed.

    Dataset: with K certified and U undecided of n inputs, ``smoothing.certified_accuracy_bounds``
    gives lower = CP_lower(K, n) - alpha and upper = CP_upper(K + U, n) + alpha at level
    1 - confidence each (each per-input decision is wrong with probability <= alpha). Pass iff
    lower >= threshold, fail iff upper < threshold, else inconclusive. Undecided inputs count as
    not certified for the estimate K / n and the lower bound.

    Budgets: ``max_draws`` caps the draws of one input; ``budget`` caps the total draws of the
    check, shared equally among open inputs in rounds (draws left by inputs decided early are
    shared again), so the numbers do not depend on ``batch_size``. Forward passes can exceed the
    draws by the part of a chunk evaluated after its input was decided. Requests that cannot pass
    (a cap too small to certify even when every draw is correct, too few inputs or too small a
    budget for the threshold) raise ``SettingError`` before any forward pass.
    """
    args = check_run_args(threshold=threshold, confidence=confidence, budget=budget, seed=seed,
                          batch_size=batch_size)
    threshold, confidence, budget, seed = args.threshold, args.confidence, args.budget, args.seed
    radius = validation.non_negative_float("radius", radius)
    sigma = validation.positive_float("sigma", sigma)
    alpha = validation.open_unit("alpha", alpha)
    max_draws = validation.positive_int("max_draws", max_draws)
    ds = load_data(data)
    fewest, fixed = _check_feasible(len(ds), threshold, radius, sigma, alpha, confidence, budget, max_draws)
    required = smoothing.required_pa(radius, sigma)
    device = resolve_device(device, model)
    started = time.perf_counter()
    with guarded(model, device) as info:
        forward = Forward(model, args.batch_size, max_label=int(ds.y.max()))
        plan = _GatePlan(sigma, required, alpha, seed, budget, max_draws, fewest)
        run = _run_gates(forward, ds.x.to(device), ds.y.to(device), plan, device)
    verdicts = [g.decision.verdict if g.decision else "undecided" for g in run.gates]
    certified, refuted = verdicts.count("pass"), verdicts.count("fail")
    undecided = len(verdicts) - certified - refuted
    n = len(verdicts)
    lower, upper = smoothing.certified_accuracy_bounds(certified, undecided, n, alpha, confidence)
    if threshold is None:
        verdict = "estimate"
    else:
        verdict = "pass" if lower >= threshold else "fail" if upper < threshold else "inconclusive"
    at_cap = sum(v == "undecided" and d >= max_draws for v, d in zip(verdicts, run.drawn.tolist()))
    note = f"{certified} of {n} inputs certified, {refuted} proven not certifiable"
    if undecided:
        note += (
            f", {undecided} undecided and counted as not certified ({at_cap} reached max_draws={max_draws}, "
            f"{undecided - at_cap} stopped by the budget of {budget} draws)"
        )
    note += f"; bounds: Clopper-Pearson over inputs -/+ alpha={alpha:g}"
    reason = None
    if verdict == "inconclusive" and not undecided:
        reason = ("every input was decided and the bounds still straddle the threshold: only more inputs "
                  "(not more draws) can narrow them")
    return Result(
        metric="certified_accuracy",
        estimate=certified / n,
        lower=lower,
        upper=upper,
        threshold=threshold,
        confidence=confidence,
        verdict=verdict,
        n_inputs=n,
        draws=int(run.drawn.sum()),
        forward_passes=forward.passes,
        seconds=time.perf_counter() - started,
        device=str(device),
        seed=seed,
        perturbation=f"Gaussian smoothing sigma={sigma:g}, L2 radius {radius:g}, alpha={alpha:g}",
        budget=budget,
        note=note,
        details={
            "inconclusive_reason": reason,
            "radius": radius,
            "sigma": sigma,
            "alpha": alpha,
            "max_draws": max_draws,
            "required_pa": required,
            "certified": certified,
            "not_certifiable": refuted,
            "undecided": undecided,
            "undecided_at_max_draws": at_cap,
            "decisions": ["certified" if v == "pass" else "not certifiable" if v == "fail" else "undecided"
                          for v in verdicts],
            "draws_per_input": run.drawn.tolist(),
            "correct_draws_per_input": run.hits.tolist(),
            "min_draws_to_certify": fewest,
            "min_draws_fixed_size": fixed,
            "rounds": run.rounds,
            "test": (
                f"per input: anytime-valid betting test of p_y > Phi(r/sigma) = {required:.6g} at level "
                f"alpha={alpha:g} (Waudby-Smith & Ramdas 2024)"
            ),
            "bounds": (
                "lower = CP_lower(certified, n, 1 - confidence) - alpha; "
                "upper = CP_upper(certified + undecided, n, 1 - confidence) + alpha"
            ),
            "batch_size": forward.batch_size,
            "oom_halvings": forward.halvings,
            "model_was_training": info["model_was_training"],
        },
    )


# ----------------------------------------------------------------------------------------------
# The pA report
# ----------------------------------------------------------------------------------------------


@records_warnings
def pa_report(
    model: torch.nn.Module,
    data,
    sigma: float,
    n: int = 10_000,
    radii=None,
    alpha: float = 1e-3,
    convert_to=((100, 0.01), (100_000, 0.001)),
    *,
    confidence: float = 0.95,
    seed: int = 0,
    batch_size: int = 1024,
    device=None,
) -> Result:
    """The empirical distribution of p_A and what it implies (Sun et al., ICML 2025, section 7 and
    appendix B).

    p_A,i = P(f(x_i + eps) = y_i), the base model's accuracy on input i under N(0, sigma^2 I) noise
    (``sigma`` in the units of the model's inputs), is estimated from n draws per input. The
    result (metric "pa_report", verdict "estimate") carries in ``details``:

    - ``pa``: per-input estimates k_i / n (and ``correct_counts`` k_i);
    - ``pa_survival``: P(p_A >= p) over inputs for p on a grid of [0.5, 1];
    - ``certified_accuracy``: at each radius of ``radii`` (default: 0 to the largest radius n
      draws can certify, in 20 steps), the fraction of inputs whose k_i certifies it at level
      alpha (CERTIFY with the label known), and the accuracy expected under each other budget
      (n', alpha') of ``convert_to`` by ``smoothing.certified_accuracy_from_pa``;
    - ``acr`` only next to ``acr_warning``;
    - ``curves``: the survival curve and the accuracy-radius curves, drawn to PNG in the report.

    ``estimate`` is the mean p_A (accuracy under the noise), with Clopper-Pearson bounds on the
    pooled draws at ``confidence`` (valid for the stratified design: n draws of every input).
    n = 10 000 resolves p_A to about +-0.003 near 0.98; the seed uses 100 000.
    """
    sigma, alpha = _validate_fixed(sigma, alpha, seed, batch_size, n=n)
    confidence = validation.open_unit("confidence", confidence)
    conversions = [(validation.positive_int("n'", m), validation.open_unit("alpha'", a)) for m, a in convert_to]
    largest = smoothing.radius_from_counts(n, n, alpha, sigma)
    if radii is None:
        radii = np.round(np.linspace(0.0, largest, 21), 4).tolist()
    radii = [validation.non_negative_float("radius", r) for r in radii]
    ds = load_data(data)
    device = resolve_device(device, model)
    started = time.perf_counter()
    with guarded(model, device) as info:
        forward = Forward(model, batch_size, max_label=int(ds.y.max()))
        counts = _class_counts(forward, ds.x.to(device), sigma, [(0, n)], seed, device, "pA report")[:, 0]
    k = counts[np.arange(len(counts)), ds.y.cpu().numpy()]
    pa = k / n
    grid = np.round(np.linspace(0.5, 1.0, 101), 4).tolist()
    survival = [float(np.mean(pa >= p)) for p in grid]
    measured = []
    for r in radii:
        need = smoothing.min_count_to_certify(r, sigma, n, alpha)
        measured.append(0.0 if need is None else float(np.mean(k >= need)))
    expected = {
        f"expected at n={m}, alpha={a:g}": [smoothing.certified_accuracy_from_pa(pa, r, sigma, m, a) for r in radii]
        for m, a in conversions
    }
    radius_of = {int(c): smoothing.radius_from_counts(int(c), n, alpha, sigma) for c in np.unique(k)}
    acr = float(np.mean([radius_of[int(c)] for c in k]))
    total = int(k.sum())
    level = 1.0 - confidence
    measured_label = f"measured at n={n}, alpha={alpha:g}"
    step = max(1, len(radii) // 4)  # up to four radii, evenly spread, in the one-line note
    notes = ", ".join(f"r={r:g}: {a:.3f}" for r, a in list(zip(radii, measured))[::step][:4])
    return Result(
        metric="pa_report",
        estimate=total / (n * len(k)),
        lower=clopper_pearson_lower(total, n * len(k), level),
        upper=clopper_pearson_upper(total, n * len(k), level),
        threshold=None,
        confidence=confidence,
        verdict="estimate",
        n_inputs=len(k),
        draws=n * len(k),
        forward_passes=forward.passes,
        seconds=time.perf_counter() - started,
        device=str(device),
        seed=seed,
        perturbation=f"Gaussian smoothing sigma={sigma:g} (pA report, n={n} draws per input)",
        budget=n * len(k),
        note=(
            f"estimate = mean pA (accuracy under the noise); median pA {float(np.median(pa)):.4f}, "
            f"P(pA >= 0.5) = {float(np.mean(pa >= 0.5)):.3f}; certified accuracy ({measured_label}) {notes}"
        ),
        details={
            "sigma": sigma,
            "n": n,
            "alpha": alpha,
            "pa": pa.tolist(),
            "correct_counts": k.tolist(),
            "pa_survival": {"p": grid, "fraction": survival},
            "certified_accuracy": {"radius": radii, measured_label: measured, **expected},
            "largest_certifiable_radius": largest,
            "conversion_note": (
                "expected accuracies treat the measured pA as exact (seed appendix B); they are reliable "
                f"for budgets up to about n={n} and for pA not within about 1/sqrt(n) of Phi(r/sigma)"
            ),
            "acr": acr,
            "acr_warning": ACR_WARNING,
            "batch_size": forward.batch_size,
            "oom_halvings": forward.halvings,
            "model_was_training": info["model_was_training"],
            "curves": {
                "pa_survival": {
                    "title": f"Distribution of pA (sigma={sigma:g}, n={n} per input)",
                    "xlabel": "p",
                    "ylabel": "fraction of inputs with pA >= p",
                    "x": grid,
                    "series": {"P(pA >= p)": survival},
                    "logx": False,
                },
                "certified_accuracy": {
                    "title": f"Certified accuracy vs L2 radius (sigma={sigma:g})",
                    "xlabel": "L2 radius (input units)",
                    "ylabel": "certified accuracy",
                    "x": radii,
                    "series": {measured_label: measured, **expected},
                    "logx": False,
                },
            },
        },
    )

