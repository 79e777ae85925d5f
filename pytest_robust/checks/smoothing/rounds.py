"""The rounds scheduler of per-input sequential tests: every input gets an anytime-valid test fed
its noisy draws in stream order, until it is decided, reaches its cap, or the budget is spent
(used by the certified-accuracy gate of randomized smoothing).

Rounds. Allocation is in rounds, so that it does not depend on packing or on the ranks: each round
gives every open input (undecided, below max_draws) an equal share of the remaining budget of model
evaluations; evaluations left unused by inputs decided early go to the next round. With a
threshold, round k caps every input at ROUND_DRAWS * 2^(k-1) draws, and the scheduler stops after
the first round whose bounds over inputs decide the check.

Chunks. Within a round an input's draws come in chunks (``chunk_end``): FIRST draws first, then,
while every draw was correct, the halving sequence up to the fewest draws that can certify, then
steps of drawn / GROWTH (at most MAX_CHUNK). Chunks of many inputs are packed into batches of
about ``batch_size`` draws.

Host reads. The sequential tests run on the host and the next batch depends on their decisions,
so each batch reads one boolean per draw, once per batch (``outcomes``); nothing else touches the
device.

P-values. With a threshold, ``run_gates`` leaves the p-values of the check's two claims in the
run's details (``details["p_values"]``, ``p_values``): those of the bounds over inputs, the exact
binomial tests behind Clopper-Pearson shifted by the per-input alpha, each <= 1 - confidence
exactly when its bound decides. The scheduler's early stop only leaves inputs undecided, so they
are conservative: the p-values of the full run would be no larger.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from pytest_robust.checks.smoothing import certificates
from pytest_robust.checks.smoothing.draws import Noise, Shard, draw_noisy
from pytest_robust.engine.run import Run
from pytest_robust.results import decide
from pytest_robust.stats import SequentialGate, clopper_pearson_p_values

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


@dataclass(frozen=True)
class GatePlan:
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
class GateState:
    """Per-input state of the sequential tests, the same on every rank after each round: verdict
    code, draws the test used, correct draws among them, model evaluations spent (draws plus the
    rest of the chunk in which the test decided), and the rounds of budget allocation."""

    verdict: np.ndarray
    drawn: np.ndarray
    hits: np.ndarray
    evaluated: np.ndarray
    rounds: int = 0
    settled: bool = False  # stopped because the bounds over inputs had decided the check

    def bounds(self, plan: GatePlan) -> tuple[float, float]:
        """The bounds over inputs now: undecided inputs count as not certified in the lower bound
        and as certified in the upper one (``certificates.certified_accuracy_bounds``)."""
        certified, undecided = int((self.verdict == CERTIFIED).sum()), int((self.verdict == OPEN).sum())
        return certificates.certified_accuracy_bounds(certified, undecided, len(self.verdict), plan.alpha,
                                                      plan.confidence)


class LocalTests:
    """This rank's per-input sequential tests and the outcomes not yet fed to them (see ``feed``)."""

    def __init__(self, plan: GatePlan, inputs):
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


def chunk_end(start: int, allowance: int, fewest: int, clean: bool) -> int:
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


def outcomes(run: Run, plan: GatePlan, shard: Shard, spans: list) -> np.ndarray:
    """One batch of the gate: whether the model is right on draws a..b-1 of input i, for each span
    (i, a, b) in turn, as one boolean host array. Noise and labels are assembled on the device;
    the outcomes, with the logits' finiteness flag (``Forward.deferring``), are the batch's one host
    read."""
    rows = [shard.row[i] for i, _, _ in spans]
    noise = Noise(tuple(shard.x.shape[1:]), shard.x.dtype, run.seed, run.device)
    noisy = torch.cat([draw_noisy(shard.x[k], plan.sigma, noise, i, a, b) for k, (i, a, b) in zip(rows, spans)])
    labels = torch.cat([shard.y[k].expand(b - a) for k, (_, a, b) in zip(rows, spans)])
    with run.forward.deferring():  # the logits' finiteness comes back with the outcomes
        correct = run.forward.correct(noisy, labels)
        finite = run.forward.finite
    if finite is True:  # no rows: nothing was evaluated
        return correct.numpy(force=True)
    host = torch.cat([correct, finite.view(1)]).numpy(force=True)
    run.forward.check_flag(int(host[-1]))
    return host[:-1]


def run_round(run: Run, plan: GatePlan, state: GateState, tests: LocalTests, shard: Shard, queue: deque,
           allowance: np.ndarray):
    """Evaluate this rank's open inputs of one round, packed into batches of about ``batch_size``
    draws, until each is decided or reaches its allowance; updates ``state`` for those inputs.
    Each batch reads its outcomes to the host once (``outcomes``); nothing else here touches the
    device."""
    active = []

    def end(i: int) -> int:
        drawn = int(state.drawn[i])
        return chunk_end(drawn, int(allowance[i]), plan.fewest, int(state.hits[i]) == drawn)

    def size(i: int) -> int:
        return end(i) - int(state.drawn[i])

    while queue or active:
        rows = sum(size(i) for i in active)
        while queue and rows < run.forward.batch_size:
            active.append(queue.popleft())
            rows += size(active[-1])
        spans = [(i, int(state.drawn[i]), end(i)) for i in active]
        hit = outcomes(run, plan, shard, spans)
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
        run.clock.pace("certified accuracy", int(state.evaluated.sum()), plan.budget)
        run.forward.report_progress(metric="certified accuracy", draws=int(state.drawn.sum()), budget=plan.budget,
                        inputs_done=lambda: int((state.verdict != OPEN).sum()), inputs=len(state.verdict),
                        forward_passes=run.forward.passes)


def run_gates(run: Run, plan: GatePlan) -> GateState:
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
    state = GateState(*(np.zeros(n, np.int64) for _ in range(4)))
    shard = Shard.of(run)
    tests = LocalTests(plan, shard.index.tolist())
    while True:
        open_inputs = [i for i in range(n) if state.verdict[i] == OPEN and state.drawn[i] < plan.max_draws]
        share = (plan.budget - int(state.evaluated.sum())) // len(open_inputs) if open_inputs else 0
        if share == 0 or (state.rounds and run.clock.expired()):  # the time limit: undecided inputs count against
            return _with_p_values(run, plan, state)
        state.rounds += 1
        allowance = np.minimum(state.evaluated + share, plan.max_draws)
        if plan.threshold is not None:
            allowance = np.minimum(allowance, ROUND_DRAWS << min(state.rounds - 1, 40))
        run_round(run, plan, state, tests, shard, deque(i for i in open_inputs if i in shard.row), allowance)
        rows = run.gather([(state.verdict[i], state.drawn[i], state.hits[i], state.evaluated[i])
                           for i in shard.index], n)
        state.verdict, state.drawn, state.hits, state.evaluated = (np.array(col, np.int64) for col in zip(*rows))
        if plan.threshold is not None and decide(plan.threshold, *state.bounds(plan)) != "inconclusive":
            state.settled = True
            return _with_p_values(run, plan, state)


def p_values(plan: GatePlan, state: GateState) -> dict[str, float]:
    """{"pass": p, "fail": p} of the bounds over inputs (``certificates.certified_accuracy_bounds``)
    against the threshold. With K certified and U undecided of n, and alpha the per-input level,
    the lower bound CP_lower(K, n, a) - alpha reaches the threshold t exactly when a >= P(Bin(n, t
    + alpha) >= K), and the upper bound CP_upper(K + U, n, a) + alpha comes down to t exactly when
    a >= P(Bin(n, t - alpha) <= K + U): those are the p-values of pass and fail (1 when t + alpha >=
    1, resp. t - alpha <= 0: no level decides). The rounding at 1 - confidence itself is resolved
    by the bounds' own decision."""
    certified, undecided = int((state.verdict == CERTIFIED).sum()), int((state.verdict == OPEN).sum())
    n, t = len(state.verdict), plan.threshold
    found = {"pass": clopper_pearson_p_values(certified, n, t + plan.alpha)[0],
             "fail": clopper_pearson_p_values(certified + undecided, n, t - plan.alpha)[1]}
    verdict, level = decide(t, *state.bounds(plan)), 1.0 - plan.confidence
    return {side: min(p, level) if verdict == side else max(p, math.nextafter(level, 1.0))
            for side, p in found.items()}


def _with_p_values(run: Run, plan: GatePlan, state: GateState) -> GateState:
    """``state``, with the p-values of its claims in the run's details when the check has a threshold."""
    if plan.threshold is not None:
        run.details["p_values"] = p_values(plan, state)
    return state
