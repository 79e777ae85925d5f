"""Certified robustness by randomized smoothing (Cohen, Rosenfeld & Kolter, ICML 2019), reported
the way Sun, Mao, Mueller & Vechev (ICML 2025) recommend: certified accuracy at fixed radii and the
empirical distribution of p_A, not the average certified radius (ACR).

Units. ``sigma`` (noise standard deviation) and ``radius`` (L2) are in the space of the tensors
the model receives: noise is added to the data exactly as given, without clipping. Keep the
normalisation inside the model and both stay in pixel units (sigma = 0.25 on [0, 1] images is
Cohen's setting); normalising outside the model puts them in normalised units.

Noise. Draw t of input i is x_i + sigma * eps, where eps is row t % BLOCK of block t // BLOCK of
input i's stream, seeded with ``stream_seed(seed, "smoothing", i, t // BLOCK)``. Every function
here reads draws from these streams in order, so per-input numbers depend on (seed, device, dtype) only, never
on batch size, packing or the other inputs. Batches mix draws of many inputs; there is no Python
loop per draw.

Host reads. On a GPU every read of a device value by the host stalls the stream, and so does
every copy from pageable host memory to the device. Each rank's inputs and labels are copied to
the device once (``_Shard``) and the noise is drawn there, so no batch uploads anything. The
fixed-size procedures count classes on the device and read the counts once, at the end; the gate
reads one boolean per draw of each batch, once per batch, because its sequential tests run on the
host and the next batch depends on their decisions.

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

import functools
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from .. import certificates, validation
from ..engine import Forward, correct_predictions, report_progress, stream_seed
from ..errors import SettingError
from ..inspection import records_warnings
from ..perturbations import GaussianNoise
from ..results import Result, decide
from ..run import Run
from ..stats import SequentialGate, clopper_pearson_lower, clopper_pearson_upper

#: Draws per random-stream block (the unit in which noise is generated and inputs are packed).
BLOCK = 64
#: An input may take at most drawn / GROWTH more draws in one step (bounds the draws a decision
#: mid-chunk wastes to about 1/GROWTH), and never less than FIRST.
GROWTH = 16
#: Draws in an input's first chunk, which decides the inputs the model mostly gets wrong.
FIRST = 16
#: Most draws one input contributes to a batch of the gate.
MAX_CHUNK = 256
#: With a threshold, round k lets an input reach at most ROUND_DRAWS * 2^(k-1) draws, so that the
#: check looks at its bounds over inputs (and can stop) before hard inputs spend their share.
ROUND_DRAWS = 512
#: Prediction code of an abstention in ``certify`` and ``predict``.
ABSTAIN = -1

ACR_WARNING = (
    "ACR (average certified radius) is shown for comparison with older papers only. It is a poor "
    "metric (Sun et al., ICML 2025): a constant classifier reaches any ACR given enough draws, an "
    "input already near p_A = 1 adds far more to it than a hard input, and the ranking of models "
    "by ACR changes with the budget n. Compare models by certified accuracy at fixed radii and by "
    "the distribution of p_A."
)


@functools.cache
def _generator(device: str) -> torch.Generator:
    """One generator per device, re-seeded for every block (``_noisy``): building a generator per
    block is avoidable work on the hot path."""
    return torch.Generator(device=device)


def _noisy(x_i: torch.Tensor, sigma: float, seed: int, index: int, start: int, stop: int, device,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Draws start..stop-1 of input ``index``: x_i + sigma * eps from the input's stream blocks (block
    b is the stream ``stream_seed(seed, "smoothing", index, b)``, whichever generator object
    draws it); written into ``out`` (stop - start rows) when given."""
    first, last = start // BLOCK, (stop - 1) // BLOCK
    gen = _generator(str(torch.device(device)))
    noise = torch.empty(((last - first + 1) * BLOCK,) + tuple(x_i.shape), device=device, dtype=x_i.dtype)
    for k, block in enumerate(range(first, last + 1)):
        gen.manual_seed(stream_seed(seed, "smoothing", index, block))
        torch.randn((BLOCK,) + tuple(x_i.shape), generator=gen, out=noise[k * BLOCK : (k + 1) * BLOCK])
    offset = first * BLOCK
    scaled = torch.mul(noise[start - offset : stop - offset], sigma, out=out)
    return scaled.add_(x_i)  # sigma * eps + x_i: the same rounding as x_i + sigma * eps


@dataclass(frozen=True)
class _Shard:
    """This rank's inputs (``Run.shard``) on the device: ``index`` their positions in the data,
    ``x`` and ``y`` their rows and labels (row k is input ``index[k]``), copied from the host once."""

    index: np.ndarray
    x: torch.Tensor
    y: torch.Tensor

    @classmethod
    def of(cls, run: Run) -> "_Shard":
        """This rank's share of ``run``'s data, on ``run.device``."""
        index = run.shard(len(run.ds))
        rows = torch.as_tensor(index)
        return cls(index, run.ds.x[rows].to(run.device), run.ds.y[rows].to(run.device))

    @functools.cached_property
    def row(self) -> dict[int, int]:
        """Input (position in the data) -> its row in ``x`` and ``y``."""
        return {int(i): k for k, i in enumerate(self.index)}


# ----------------------------------------------------------------------------------------------
# Fixed sample sizes: class counts per input (CERTIFY, PREDICT, the pA report)
# ----------------------------------------------------------------------------------------------


def _batches(x: torch.Tensor, index, sigma: float, phases, seed: int, device, batch_size: int):
    """(noisy rows, tags) in batches of exactly ``batch_size`` rows (the last may be shorter): every
    input's draws of each phase, inputs one after another, so batches are packed across inputs.
    Row i of x is input ``index[i]`` of the data (its noise stream); a row's tag is
    i * len(phases) + phase. The noise is written straight into one reused batch buffer: each batch
    must be consumed before the next is requested."""
    rows = torch.empty((batch_size,) + tuple(x.shape[1:]), device=device, dtype=x.dtype)
    tags = torch.empty(batch_size, dtype=torch.long, device=device)
    filled = 0
    for i in range(len(x)):
        for p, (start, stop) in enumerate(phases):
            at = start
            while at < stop:
                take = min(stop - at, batch_size - filled)
                _noisy(x[i], sigma, seed, int(index[i]), at, at + take, device, out=rows[filled : filled + take])
                tags[filled : filled + take] = i * len(phases) + p
                filled, at = filled + take, at + take
                if filled == batch_size:
                    yield rows, tags
                    filled = 0
    if filled:
        yield rows[:filled], tags[:filled]


def _class_counts(run: Run, sigma: float, phases, metric: str) -> np.ndarray:
    """Counts of f(x_i + eps) over the draws of each phase: array (inputs, phases, classes).

    ``phases`` are draw ranges [start, stop) of every input's stream (disjoint ranges are
    independent samples). A tie between logits counts in no class. ``metric`` names the
    procedure in progress reports. Under torch.distributed each rank counts its share of the
    inputs (``Run.shard``) and the counts are gathered, identical to one process.
    """
    shard = _Shard.of(run)
    local = _counts(run.forward, shard.x, shard.index, sigma, phases, run.seed, run.device, metric)
    return np.stack(run.gather(list(local), len(run.ds)))


def _counts(forward: Forward, x: torch.Tensor, index, sigma: float, phases, seed: int, device,
            metric: str) -> np.ndarray:
    """``_class_counts`` for the rows x (on the device), which are inputs ``index`` of the data.

    The counts stay on the device, flat: cell tag * (classes + 1) + class, where class = classes
    stands for a tie. ``index_add_`` asserts its indices on the device, where
    ``index_put_(accumulate=True)`` reads their range to the host in some PyTorch releases; so the
    only host read is the final one.
    """
    counts = None
    total = len(x) * sum(stop - start for start, stop in phases)
    for rows, tags in _batches(x, index, sigma, phases, seed, device, forward.batch_size):
        logits = forward.logits(rows)
        width = logits.shape[1] + 1
        top = logits.topk(2, dim=1).values
        pred = torch.where(top[:, 0] > top[:, 1], logits.argmax(dim=1), width - 1)
        if counts is None:
            counts = torch.zeros(len(x) * len(phases) * width, dtype=torch.long, device=device)
        counts.index_add_(0, tags * width + pred, torch.ones_like(pred))
        report_progress(metric=metric, draws=forward.passes, budget=total)
    if counts is None:  # no inputs on this rank
        return np.zeros((0, len(phases), 0), dtype=np.int64)
    return counts.view(len(x), len(phases), width)[:, :, :-1].numpy(force=True)


def _validate_fixed(sigma, alpha, **sizes) -> tuple[float, float]:
    sigma = validation.positive_float("sigma", sigma)
    alpha = validation.open_unit("alpha", alpha)
    for key, value in sizes.items():
        validation.positive_int(key, value)
    return sigma, alpha


@dataclass
class _FixedSize:
    """What CERTIFY and PREDICT share: the noise (sigma, input units), the level alpha, the seed,
    where and how long they ran, and per input (arrays indexed like the data) the label, the
    returned class (ABSTAIN = -1) and whether it equals the label."""

    sigma: float
    alpha: float
    seed: int
    device: str
    seconds: float
    forward_passes: int
    label: np.ndarray
    prediction: np.ndarray
    correct: np.ndarray


@dataclass
class Certification(_FixedSize):
    """Per-input outcome of Cohen's CERTIFY; every array is indexed like the data.

    ``prediction`` is the certified class or ABSTAIN (-1); ``count`` is how many of the n
    estimation draws fell in the class chosen from the n0 selection draws, ``pa_estimate`` =
    count / n and ``pa_lower`` its one-sided (1 - alpha) Clopper-Pearson lower bound; ``radius``
    = sigma Phi^-1(pa_lower) (0 when abstaining); ``correct`` = not abstained and prediction ==
    label; ``draws`` = n0 + n per input. With probability >= 1 - alpha per input, the smoothed
    classifier returns ``prediction`` everywhere within ``radius`` (L2, in input units).
    """

    n0: int
    n: int
    count: np.ndarray
    pa_estimate: np.ndarray
    pa_lower: np.ndarray
    radius: np.ndarray
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
    model: torch.nn.Module, data, sigma: float, n0: int = 100, n: int = 100_000, alpha: float = 0.001, *,
    seed: int = 0, batch_size: int = 1024, device=None,
) -> Certification:
    """Cohen's CERTIFY for every input, batched across inputs.

    Per input: c_A = the most frequent class among draws 0..n0-1 of its noise stream; k = how many
    of the n fresh draws n0..n0+n-1 fall in c_A; p_lower = BetaInv(alpha; k, n - k + 1) (one-sided
    Clopper-Pearson); abstain if p_lower < 1/2, else certify c_A within radius sigma Phi^-1(p_lower).
    ``sigma`` is in the units of the model's inputs. Defaults are Cohen's (n0=100, n=100 000,
    alpha=0.001). Certified accuracy at any radius: ``result.certified_accuracy(r)``.
    """
    sigma, alpha = _validate_fixed(sigma, alpha, n0=n0, n=n)
    with Run("certify", model, data, budget=None, seed=seed, batch_size=batch_size, device=device,
             certificate=True) as run:
        counts = _class_counts(run, sigma, [(0, n0), (n0, n0 + n)], "CERTIFY")
    choice = counts[:, 0].argmax(axis=1)
    k = counts[np.arange(len(choice)), 1, choice]
    lower_of = {c: clopper_pearson_lower(c, n, alpha) for c in np.unique(k).tolist()}
    pa_lower = np.array([lower_of[c] for c in k.tolist()])
    abstain = pa_lower < 0.5
    radius = np.array([sigma * certificates.NORMAL.inv_cdf(p) if p >= 0.5 else 0.0 for p in pa_lower])
    prediction = np.where(abstain, ABSTAIN, choice)
    label = run.ds.y.cpu().numpy()
    return Certification(
        sigma=sigma, n0=n0, n=n, alpha=alpha, seed=run.seed, device=str(run.device),
        seconds=time.perf_counter() - run.started, forward_passes=sum(run.spent().values()),
        label=label, prediction=prediction, count=k, pa_estimate=k / n, pa_lower=pa_lower,
        radius=radius, correct=prediction == label, draws=np.full(len(label), n0 + n),
    )


@dataclass
class Prediction(_FixedSize):
    """Per-input outcome of Cohen's PREDICT: ``prediction`` (ABSTAIN = -1), the top two class
    counts among the n draws, the two-sided binomial p-value of their comparison, ``correct``."""

    n: int
    top_count: np.ndarray
    runner_up_count: np.ndarray
    p_value: np.ndarray


def predict(
    model: torch.nn.Module, data, sigma: float, n: int = 10_000, alpha: float = 0.001, *, seed: int = 0,
    batch_size: int = 1024, device=None,
) -> Prediction:
    """Cohen's PREDICT for every input: the top two classes' counts n_A >= n_B among n noisy draws;
    return the top class unless the two-sided binomial test of n_A out of n_A + n_B at p = 1/2 has
    p-value > alpha (then abstain). The returned class differs from the smoothed classifier's with
    probability <= alpha. ``sigma`` is in the units of the model's inputs."""
    sigma, alpha = _validate_fixed(sigma, alpha, n=n)
    with Run("predict", model, data, budget=None, seed=seed, batch_size=batch_size, device=device,
             certificate=True) as run:
        counts = _class_counts(run, sigma, [(0, n)], "PREDICT")[:, 0]
    order = np.argsort(-counts, axis=1, kind="stable")
    rows = np.arange(len(counts))
    top, runner_up = counts[rows, order[:, 0]], counts[rows, order[:, 1]]
    p_value = np.array([certificates.predict_pvalue(int(a), int(b)) for a, b in zip(top, runner_up)])
    prediction = np.where(p_value > alpha, ABSTAIN, order[:, 0])
    label = run.ds.y.cpu().numpy()
    return Prediction(
        sigma=sigma, n=n, alpha=alpha, seed=run.seed, device=str(run.device),
        seconds=time.perf_counter() - run.started, forward_passes=sum(run.spent().values()), label=label, prediction=prediction, top_count=top,
        runner_up_count=runner_up, p_value=p_value, correct=prediction == label,
    )


# ----------------------------------------------------------------------------------------------
# The gate: certified accuracy at a fixed radius, with per-input sequential tests
# ----------------------------------------------------------------------------------------------


def _check_feasible(n_inputs, threshold, radius, sigma, alpha, confidence, budget, max_draws) -> tuple[int, int]:
    """Refuse requests that cannot pass before spending compute; returns the fewest draws with
    which the sequential test, and a fixed-size Clopper-Pearson test, can certify one input."""
    fixed = certificates.min_samples_to_certify(radius, sigma, alpha)
    fewest = certificates.min_sequential_draws(radius, sigma, alpha, max_draws)
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
    inputs_needed = certificates.fewest_inputs_to_pass(threshold, alpha, confidence)
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
    budget: int
    max_draws: int
    fewest: int
    threshold: float | None
    confidence: float


#: Per-input verdict codes of the sequential tests.
OPEN, CERTIFIED, REFUTED = 0, 1, 2


@dataclass
class _GateState:
    """Per-input state of the sequential tests, the same on every rank after each round: verdict
    code, draws the test used, correct draws among them, model evaluations spent (draws plus the
    rest of the chunk in which the test decided), and the rounds of budget allocation."""

    verdict: np.ndarray
    drawn: np.ndarray
    hits: np.ndarray
    evaluated: np.ndarray
    rounds: int = 0
    settled: bool = False  # stopped because the bounds over inputs had decided the check

    def bounds(self, plan: _GatePlan) -> tuple[float, float]:
        """The bounds over inputs now: undecided inputs count as not certified in the lower bound
        and as certified in the upper one (``certificates.certified_accuracy_bounds``)."""
        certified, undecided = int((self.verdict == CERTIFIED).sum()), int((self.verdict == OPEN).sum())
        return certificates.certified_accuracy_bounds(certified, undecided, len(self.verdict), plan.alpha,
                                                      plan.confidence)


class _LocalTests:
    """This rank's per-input sequential tests and the outcomes not yet fed to them (see ``feed``)."""

    def __init__(self, plan: _GatePlan, inputs):
        self.plan = plan
        self.gates = {i: SequentialGate(plan.required, plan.alpha, horizon=plan.max_draws) for i in inputs}
        self.waiting = {i: [] for i in inputs}

    def feed(self, i: int, chunk: np.ndarray, stop: int):
        """Give input i's outcomes up to draw ``stop`` to its test; returns its decision or None.

        While every outcome so far is correct and fewer than ``plan.fewest`` draws were made,
        neither side of the test can decide (a pass needs at least ``fewest`` correct draws, a fail
        needs a miss), so the outcomes wait and are fed in one later update: the decision, at its
        exact draw, is the same, with fewer calls into the test.
        """
        self.waiting[i].append(chunk)
        if stop < self.plan.fewest and chunk.all():
            return None
        block = np.concatenate(self.waiting[i])
        self.waiting[i] = []
        return self.gates[i].update(block)


def _chunk_end(start: int, allowance: int, fewest: int, clean: bool) -> int:
    """Where an input's next chunk of draws ends, never past its allowance: FIRST draws first (enough
    for the fail side to decide an input the model mostly gets wrong); then, while every draw so
    far was correct (``clean``), the next point above ``start`` of the halving sequence
    fewest, ceil(fewest / 2), ceil(fewest / 4), ..., which ends at ``fewest``, the draw at which an
    input the model gets right every time is certified (no pass can come earlier): such an input
    costs exactly ``fewest`` evaluations, and one that starts missing wastes at most as many draws
    as it has made. After a miss, steps of start / GROWTH draws (at least FIRST, at most
    MAX_CHUNK). Depends on the input's own draws alone, never on the batch size or on which other
    inputs share the batch."""
    if start == 0:
        end = min(FIRST, fewest)
    elif clean and start < fewest:
        end = fewest
        while -(-end // 2) > start:
            end = -(-end // 2)
    else:
        end = start + max(FIRST, min(MAX_CHUNK, start // GROWTH))
    return int(min(allowance, end))


def _outcomes(run: Run, plan: _GatePlan, shard: _Shard, spans: list) -> np.ndarray:
    """One batch of the gate: whether the model is right on draws a..b-1 of input i, for each span
    (i, a, b) in turn, as one boolean host array. Noise and labels are assembled on the device;
    the outcomes are the batch's one host read."""
    rows = [shard.row[i] for i, _, _ in spans]
    noisy = torch.cat([_noisy(shard.x[k], plan.sigma, run.seed, i, a, b, run.device)
                       for k, (i, a, b) in zip(rows, spans)])
    labels = torch.cat([shard.y[k].expand(b - a) for k, (_, a, b) in zip(rows, spans)])
    return correct_predictions(run.forward.logits(noisy), labels).numpy(force=True)


def _round(run: Run, plan: _GatePlan, state: _GateState, tests: _LocalTests, shard: _Shard, queue: deque,
           allowance: np.ndarray):
    """Evaluate this rank's open inputs of one round, packed into batches of about ``batch_size``
    draws, until each is decided or reaches its allowance; updates ``state`` for those inputs.
    Each batch reads its outcomes to the host once (``_outcomes``); nothing else here touches the
    device."""
    active = []

    def end(i: int) -> int:
        drawn = int(state.drawn[i])
        return _chunk_end(drawn, int(allowance[i]), plan.fewest, int(state.hits[i]) == drawn)

    def size(i: int) -> int:
        return end(i) - int(state.drawn[i])

    while queue or active:
        rows = sum(size(i) for i in active)
        while queue and rows < run.forward.batch_size:
            active.append(queue.popleft())
            rows += size(active[-1])
        spans = [(i, int(state.drawn[i]), end(i)) for i in active]
        hit = _outcomes(run, plan, shard, spans)
        active, offset = [], 0
        for i, a, b in spans:
            chunk = hit[offset : offset + b - a]
            offset += b - a
            decision = tests.feed(i, chunk, b)
            used = (decision.at if decision else b) - a
            state.hits[i] += int(chunk[:used].sum())
            state.drawn[i] += used
            state.evaluated[i] += b - a
            if decision is not None:
                state.verdict[i] = CERTIFIED if decision.verdict == "pass" else REFUTED
            elif state.drawn[i] < allowance[i]:
                active.append(i)
        report_progress(metric="certified accuracy", draws=int(state.drawn.sum()), budget=plan.budget,
                        inputs_done=lambda: int((state.verdict != OPEN).sum()), inputs=len(state.verdict),
                        forward_passes=run.forward.passes)


def _run_gates(run: Run, plan: _GatePlan) -> _GateState:
    """Run every input's sequential test until it is decided, reaches ``max_draws``, or the budget
    of model evaluations is spent.

    Allocation is in rounds, so that it does not depend on packing or on the ranks: each round
    gives every open input (undecided, below max_draws) an equal share of the remaining budget;
    evaluations left unused by inputs decided early go to the next round. Under torch.distributed
    each rank evaluates its share of the inputs (``Run.shard``) and the per-input state is
    gathered after every round, so every rank reaches the single-process numbers. A test is fed
    its draws in stream order and stops at the exact draw where it decides; the rest of that
    chunk counts as evaluations, not as draws.

    With a threshold, round k caps every input at ROUND_DRAWS * 2^(k-1) draws, and the gate stops
    after the first round whose bounds over inputs decide the check. That stop changes no verdict
    and keeps the bounds valid: inputs are only ever certified or refuted, never undone, so the
    lower bound (certified count) can only rise and the upper bound (certified plus undecided) only
    fall if the gate went on. The bounds at the stop are, input for input, on the conservative side
    of those the full run would report.
    """
    n = len(run.ds)
    state = _GateState(*(np.zeros(n, np.int64) for _ in range(4)))
    shard = _Shard.of(run)
    tests = _LocalTests(plan, shard.index.tolist())
    while True:
        open_inputs = [i for i in range(n) if state.verdict[i] == OPEN and state.drawn[i] < plan.max_draws]
        share = (plan.budget - int(state.evaluated.sum())) // len(open_inputs) if open_inputs else 0
        if share == 0:
            return state
        state.rounds += 1
        allowance = np.minimum(state.evaluated + share, plan.max_draws)
        if plan.threshold is not None:
            allowance = np.minimum(allowance, ROUND_DRAWS << min(state.rounds - 1, 40))
        _round(run, plan, state, tests, shard, deque(i for i in open_inputs if i in shard.row), allowance)
        rows = run.gather([(state.verdict[i], state.drawn[i], state.hits[i], state.evaluated[i])
                           for i in shard.index], n)
        state.verdict, state.drawn, state.hits, state.evaluated = (np.array(col, np.int64) for col in zip(*rows))
        if plan.threshold is not None and decide(plan.threshold, *state.bounds(plan)) != "inconclusive":
            state.settled = True
            return state


@records_warnings
def certified_accuracy(
    model: torch.nn.Module, data, threshold: float | None, radius: float, sigma: float, alpha: float = 1e-3,
    max_draws: int = 100_000, *, confidence: float = 0.95, budget: int = 2_000_000, seed: int = 0,
    batch_size: int = 1024, device=None,
) -> Result:
    """Gate: the Gaussian-smoothed model is certified correct within L2 ``radius`` on at least a
    fraction ``threshold`` of ``data``, at the stated confidence.

    ``sigma`` (noise standard deviation) and ``radius`` are in the units of the model's inputs
    (pixel units when the normalisation is inside the model).

    Per input: the anytime-valid betting test of H0: p_y <= Phi(radius / sigma) at level
    ``alpha`` (``stats.SequentialGate`` with horizon ``max_draws``: a mixture of constant bets
    sized for the gaps max_draws draws can resolve, plus a nearly all-in bet that certifies an
    always-correct input near the fixed-size minimum), fed one draw at a time in stream order; it
    stops at the first draw where it certifies (rejects H0) or proves the input not certifiable
    (rejects p_y >= Phi(radius / sigma)). With the label known no class-selection step is needed.

    Dataset: with K certified and U undecided of n inputs, ``certificates.certified_accuracy_bounds``
    gives lower = CP_lower(K, n) - alpha and upper = CP_upper(K + U, n) + alpha at level
    1 - confidence each (each per-input decision is wrong with probability <= alpha). Verdict by
    ``results.decide``. Undecided inputs count as not certified for the estimate K / n and the
    lower bound.

    Budgets: ``max_draws`` caps the draws of one input; ``budget`` caps the model evaluations of
    the check, shared equally among open inputs in rounds (``_run_gates``), so the numbers do not
    depend on ``batch_size`` or on the number of ranks. Requests that cannot pass (a cap too small
    to certify even when every draw is correct, too few inputs or too small a budget for the
    threshold) raise ``SettingError`` before any model evaluation.
    """
    radius = validation.non_negative_float("radius", radius)
    sigma = validation.positive_float("sigma", sigma)
    alpha = validation.open_unit("alpha", alpha)
    max_draws = validation.positive_int("max_draws", max_draws)
    with Run("certified_accuracy", model, data, threshold=threshold, confidence=confidence, budget=budget, seed=seed,
             batch_size=batch_size, device=device, certificate=True) as run:
        fewest, fixed = _check_feasible(len(run.ds), run.args.threshold, radius, sigma, alpha, run.args.confidence,
                                        run.args.budget, max_draws)
        plan = _GatePlan(sigma, certificates.required_pa(radius, sigma), alpha, run.args.budget, max_draws, fewest,
                         run.args.threshold, run.args.confidence)
        state = _run_gates(run, plan)
    n = len(state.verdict)
    certified, refuted = int((state.verdict == CERTIFIED).sum()), int((state.verdict == REFUTED).sum())
    lower, upper = state.bounds(plan)
    at_cap = int(((state.verdict == OPEN) & (state.drawn >= max_draws)).sum())
    return run.result(
        estimate=certified / n, lower=lower, upper=upper, draws=int(state.drawn.sum()),
        perturbation=f"Gaussian smoothing sigma={sigma:g}, L2 radius {radius:g}, alpha={alpha:g}",
        note=_gate_note(certified, refuted, at_cap, n, state.settled, run.args.budget, plan),
        details=_gate_details(plan, state, radius, fewest, fixed, at_cap),
        example=GaussianNoise(sigma=sigma, bounds=None),
    )


def _gate_note(certified, refuted, at_cap, n, settled, budget, plan: _GatePlan) -> str:
    note = f"{certified} of {n} inputs certified, {refuted} proven not certifiable"
    undecided = n - certified - refuted
    if undecided:
        stopped = ("left open once the bounds over inputs decided the check" if settled
                   else f"stopped by the budget of {budget} model evaluations")
        note += (
            f", {undecided} undecided and counted as not certified ({at_cap} reached max_draws={plan.max_draws}, "
            f"{undecided - at_cap} {stopped})"
        )
        if settled:
            note += "; the estimate counts them as not certified, so it is a lower estimate"
    return note + f"; bounds: Clopper-Pearson over inputs -/+ alpha={plan.alpha:g}"


def _gate_details(plan: _GatePlan, state: _GateState, radius: float, fewest: int, fixed: int, at_cap: int) -> dict:
    names = {OPEN: "undecided", CERTIFIED: "certified", REFUTED: "not certifiable"}
    undecided = int((state.verdict == OPEN).sum())
    return {
        "inconclusive_reason": None if undecided else (
            "every input was decided and the bounds still straddle the threshold: only more inputs "
            "(not more draws) can narrow them"),
        "radius": radius,
        "sigma": plan.sigma,
        "alpha": plan.alpha,
        "max_draws": plan.max_draws,
        "required_pa": plan.required,
        "certified": int((state.verdict == CERTIFIED).sum()),
        "not_certifiable": int((state.verdict == REFUTED).sum()),
        "undecided": undecided,
        "undecided_at_max_draws": at_cap,
        "settled_early": state.settled,
        "per_input": {
            "index": list(range(len(state.verdict))),
            "outcome": [names[int(v)] for v in state.verdict],
            "radius": [radius if v == CERTIFIED else None for v in state.verdict],
            "estimate": [int(k) / int(d) if d else None for k, d in zip(state.hits, state.drawn)],
            "draws": state.drawn.tolist(),
            "correct_draws": state.hits.tolist(),
            "evaluations": state.evaluated.tolist(),
        },
        "min_draws_to_certify": fewest,
        "min_draws_fixed_size": fixed,
        "rounds": state.rounds,
        "test": (
            f"per input: anytime-valid betting test of p_y > Phi(r/sigma) = {plan.required:.6g} at level "
            f"alpha={plan.alpha:g} (Waudby-Smith & Ramdas 2024)"
        ),
        "bounds": (
            "lower = CP_lower(certified, n, 1 - confidence) - alpha; "
            "upper = CP_upper(certified + undecided, n, 1 - confidence) + alpha"
        ),
    }


# ----------------------------------------------------------------------------------------------
# The pA report
# ----------------------------------------------------------------------------------------------


@records_warnings
def pa_report(
    model: torch.nn.Module, data, sigma: float, n: int = 10_000, radii=None, alpha: float = 1e-3,
    convert_to=((100, 0.01), (100_000, 0.001)), *,
    confidence: float = 0.95, seed: int = 0, batch_size: int = 1024, device=None,
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
      (n', alpha') of ``convert_to`` by ``certificates.certified_accuracy_from_pa``;
    - ``acr`` only next to ``acr_warning``;
    - ``curves``: the survival curve and the accuracy-radius curves, drawn to PNG in the report.

    ``estimate`` is the mean p_A (accuracy under the noise), with Clopper-Pearson bounds on the
    pooled draws at ``confidence`` (valid for the stratified design: n draws of every input).
    n = 10 000 resolves p_A to about +-0.003 near 0.98; the seed uses 100 000.
    """
    sigma, alpha = _validate_fixed(sigma, alpha, n=n)
    conversions = [(validation.positive_int("n'", m), validation.open_unit("alpha'", a)) for m, a in convert_to]
    largest = certificates.radius_from_counts(n, n, alpha, sigma)
    if radii is None:
        radii = np.round(np.linspace(0.0, largest, 21), 4).tolist()
    radii = [validation.non_negative_float("radius", r) for r in radii]
    with Run("pa_report", model, data, confidence=confidence, budget=None, seed=seed, batch_size=batch_size,
             device=device, certificate=True) as run:
        counts = _class_counts(run, sigma, [(0, n)], "pA report")[:, 0]
    k = counts[np.arange(len(counts)), run.ds.y.cpu().numpy()]
    pa, total, level = k / n, int(k.sum()), run.alpha
    measured = []
    for r in radii:
        need = certificates.min_count_to_certify(r, sigma, n, alpha)
        measured.append(0.0 if need is None else float(np.mean(k >= need)))
    measured_label = f"measured at n={n}, alpha={alpha:g}"
    step = max(1, len(radii) // 4)  # up to four radii, evenly spread, in the one-line note
    notes = ", ".join(f"r={r:g}: {a:.3f}" for r, a in list(zip(radii, measured))[::step][:4])
    return run.result(
        estimate=total / (n * len(k)), lower=clopper_pearson_lower(total, n * len(k), level),
        upper=clopper_pearson_upper(total, n * len(k), level), draws=n * len(k), estimate_only=True,
        perturbation=f"Gaussian smoothing sigma={sigma:g} (pA report, n={n} draws per input)",
        note=(
            f"estimate = mean pA (accuracy under the noise); median pA {float(np.median(pa)):.4f}, "
            f"P(pA >= 0.5) = {float(np.mean(pa >= 0.5)):.3f}; certified accuracy ({measured_label}) {notes}"
        ),
        details=_pa_details(k, n, sigma, alpha, radii, measured, measured_label, conversions, largest),
    )


def _pa_details(k: np.ndarray, n: int, sigma: float, alpha: float, radii: list, measured: list, measured_label: str,
                conversions: list, largest: float) -> dict:
    """The pA report's details: per-input pA, its survival curve, accuracy against radius (measured
    and converted to other budgets), ACR with its warning, and the curves to plot."""
    pa = k / n
    grid = np.round(np.linspace(0.5, 1.0, 101), 4).tolist()
    survival = [float(np.mean(pa >= p)) for p in grid]
    expected = {
        f"expected at n={m}, alpha={a:g}": [certificates.certified_accuracy_from_pa(pa, r, sigma, m, a) for r in radii]
        for m, a in conversions
    }
    radius_of = {int(c): certificates.radius_from_counts(int(c), n, alpha, sigma) for c in np.unique(k)}
    return {
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
        "acr": float(np.mean([radius_of[int(c)] for c in k])),
        "acr_warning": ACR_WARNING,
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
    }
