"""RS_conf_seq (Voráček, "Treatment of statistical estimation problems in randomized smoothing for
adversarial robustness", NeurIPS 2024), written for the benchmark from the paper and its public code
(github.com/vvoracek/RS_conf_seq: ``thresholds.get_thresholds`` and ``core.Certifier.certify``).
It is a yardstick for ``bench_smoothing.py`` and never part of the package.

Per-input test. With A successes in N draws and target probability p = Phi(r / sigma), the
Krichevsky-Trofimov mixture likelihood ratio against Bernoulli(p)

    L(A, N) = KT(A, N) / (p^A (1 - p)^(N - A)),
    KT(A, N) = Gamma(A + 1/2) Gamma(N - A + 1/2) / (pi Gamma(N + 1))   (Beta(1/2, 1/2) mixture)

is a non-negative martingale under p. The upper table holds, for each N, the smallest A >= pN
with log L(A, N) > log(1 / level); the input is certified the first time A reaches it. The
lower table is the same construction on the failures (target 1 - p), turned into a success
count N - F and made non-decreasing; the input is refused the first time A falls to it.
``thresholds.py`` uses log(1 / (2 alpha)) for both tables, i.e. level 2 alpha per side; the
benchmark passes ``level`` per side explicitly so both methods are compared at the same level.
Both tables are replaced by their reverse running minimum (upper) as in the original. Inputs
still open after ``horizon`` draws (131 100 in the original) are undecided.

Evaluations. ``certify`` evaluates batches of ``bs`` rows (100 in the paper's ``main.py``); each
row belongs to an input; rows start spread over the inputs with the fewest rows (a heap keyed by
rows assigned), and when an input is decided its rows go to the open inputs with the fewest rows.
A reassigned row's next outcome is discarded, as in the original loop (the ``new`` flags), and
the rest of the batch of a decided input's rows are discarded too. ``evaluations`` replays that
schedule from the draws each input's test used (the data a row consumes do not depend on which
batch it sits in here: draw t of input i is always row t of its noise stream).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

HORIZON = 131_100


def upper_thresholds(p: float, level: float, horizon: int = HORIZON) -> np.ndarray:
    """For N = 0..horizon-1, the success count at which the test of "mean <= p" rejects at draw N
    (a value above N where it cannot), reverse-running-minimum as in the original tables."""
    out = np.full(horizon, 2 * horizon, dtype=np.int64)
    log_p, log_q, bar = math.log(p), math.log1p(-p), math.log(1.0 / level)

    def log_ratio(a: int, n: int) -> float:
        kt = math.lgamma(a + 0.5) + math.lgamma(n - a + 0.5) - math.lgamma(n + 1) - math.log(math.pi)
        return kt - a * log_p - (n - a) * log_q

    a = 0
    for n in range(horizon):
        a = max(a, math.ceil(p * n))  # the smallest admissible count never decreases with n
        while a <= n and log_ratio(a, n) <= bar:
            a += 1
        if a <= n:
            out[n] = a
        else:  # no count rejects at n; the original resumes the next search at count n
            a = n
    return np.minimum.accumulate(out[::-1])[::-1]


def tables(p: float, level: float, horizon: int = HORIZON) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper): refuse when A == lower[N], certify when A == upper[N]."""
    upper = upper_thresholds(p, level, horizon)
    failures = upper_thresholds(1.0 - p, level, horizon)
    lower = np.maximum.accumulate(np.arange(horizon) - failures)
    return lower, upper


def decide(outcomes: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> tuple[str | None, int]:
    """(decision, draws) for one input's outcomes read in order: "certified", "not certifiable", or
    None with the draws read when the outcomes (or the tables) ran out first."""
    n = min(len(outcomes), len(lower) - 1)
    counts = np.cumsum(outcomes[:n], dtype=np.int64)
    steps = np.arange(1, n + 1)
    refuse = np.flatnonzero(counts == lower[steps])
    accept = np.flatnonzero(counts == upper[steps])
    first_refuse = refuse[0] if len(refuse) else n
    first_accept = accept[0] if len(accept) else n
    if first_refuse == first_accept == n:
        return None, n
    if first_refuse <= first_accept:  # the original checks the lower table first
        return "not certifiable", int(first_refuse) + 1
    return "certified", int(first_accept) + 1


def evaluations(draws: list[int], bs: int = 100) -> int:
    """Rows the original batch loop evaluates until every input's test has read its ``draws``."""
    total = len(draws)
    heap = [(0, i) for i in range(total)]
    heapq.heapify(heap)
    rows_of: dict[int, list[int]] = {i: [] for i in range(total)}
    owner, fresh, used, done = [0] * bs, [False] * bs, [0] * total, set()

    def assign(row: int) -> None:
        while True:
            count, idx = heapq.heappop(heap)
            if idx not in done:
                break
        rows_of[idx].append(row)
        owner[row] = idx
        heapq.heappush(heap, (count + 1, idx))

    for row in range(bs):
        assign(row)
    batches = 0
    while len(done) < total:
        batches += 1
        for row in range(bs):
            if fresh[row]:
                fresh[row] = False
                continue
            idx = owner[row]
            used[idx] += 1
            if used[idx] < draws[idx]:
                continue
            done.add(idx)
            if len(done) == total:
                break
            for other in rows_of[idx]:
                fresh[other] = True
                assign(other)
    return batches * bs
