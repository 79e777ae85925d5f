"""Anytime-valid tests of a paired difference D in [-1, 1] (a candidate against a reference on
common random numbers): "E[D] <= margin" and its mirror, their p-values and confidence sequence.

For each side a betting test (Waudby-Smith & Ramdas, JRSS-B 2024) with the predictable
variance-adaptive bet (their aGRAPA)
    K_t = prod_{i <= t} (1 + lambda_i Z_i),  lambda_i = clip(mu_{i-1} / (v_{i-1} + mu_{i-1}^2), 0, c / b),
on Z = margin - D (rejecting E[D] >= margin) and Z = D - margin (rejecting E[D] <= margin), with mu,
v the running mean and variance of Z from past draws only, b the largest loss one draw can bring
and c = ``betting.BET_CAP`` (so every factor stays >= 1 - c > 0). Under each null K is a
non-negative supermartingale, and by Ville's inequality a side is proven with error probability
<= alpha at any stopping time. The confidence sequence inverts these tests over the margin by
bisection. Pure NumPy.
"""

from __future__ import annotations

import math

import numpy as np

from pytest_robust.stats.betting import BET_CAP


def _log_capital(z: np.ndarray, reach: float) -> np.ndarray:
    """Log capital after each element of ``z`` of the betting test of H0: E[Z] <= 0, for Z >= -reach.

    The bet lambda_i = clip(mu / (v + mu^2), 0, BET_CAP / reach) uses the running mean mu and the
    running second moment v + mu^2 of z_1..z_{i-1} (with a prior of one observation at 0 and
    variance 1/4), so it is predictable and the capital a supermartingale under H0.
    """
    if len(z) == 0:
        return np.zeros(0)
    count = np.arange(len(z), dtype=np.float64) + 1.0
    sums = np.concatenate(([0.0], np.cumsum(z)[:-1]))
    squares = np.concatenate(([0.0], np.cumsum(z * z)[:-1]))
    mean = sums / count
    second = (0.25 + squares) / count
    lam = np.clip(mean / np.maximum(second, 1e-12), 0.0, BET_CAP / reach)
    return np.cumsum(np.log1p(lam * z))


def _capital(d: np.ndarray, m: float, claim: str) -> np.ndarray:
    """Log capital over ``d`` of the test that proves ``claim`` about m: "below" rejects E[D] >= m
    (Z = m - D, which can lose at most 1 - m), "above" rejects E[D] <= m (Z = D - m, at most 1 + m)."""
    z, reach = (m - d, 1.0 - m) if claim == "below" else (d - m, 1.0 + m)
    return _log_capital(z, max(reach, 1e-9))


def _rejected(d: np.ndarray, margin: float, alpha: float) -> tuple[int | None, int | None]:
    """(first draw at which "E[D] < margin" is proven, first at which "E[D] > margin" is), or None."""
    level = math.log(1.0 / alpha)
    out = []
    for claim in ("below", "above"):
        hits = np.flatnonzero(_capital(d, margin, claim) >= level)
        out.append(int(hits[0]) + 1 if len(hits) else None)
    return out[0], out[1]


def p_values(d: np.ndarray, margin: float) -> dict:
    """{"pass": p, "fail": p}: the anytime-valid p-value of each claim, 1 / the largest capital its
    test reached over ``d`` (<= alpha exactly when the test rejected at level alpha)."""
    return {verdict: float(min(1.0, math.exp(-max(0.0, _capital(d, margin, claim).max(initial=0.0)))))
            for verdict, claim in (("pass", "below"), ("fail", "above"))}


def confidence_sequence(d: np.ndarray, alpha: float, tol: float = 1e-4) -> tuple[float, float]:
    """(lower, upper) anytime-valid bounds on E[D] for D in [-1, 1] after the stream ``d``: lower
    is the largest m whose test of "E[D] <= m" has rejected (at level alpha, at any time so far),
    upper the smallest m whose test of "E[D] >= m" has; each found by bisection (the rejection
    regions are the intervals below lower and above upper)."""
    level = math.log(1.0 / alpha)

    def rejects(m: float, claim: str) -> bool:
        return len(d) > 0 and _capital(d, m, claim).max() >= level

    def edge(claim: str) -> float:
        inside, outside = (-1.0, 1.0) if claim == "above" else (1.0, -1.0)  # rejected end, kept end
        if not rejects(inside, claim):
            return inside
        while abs(outside - inside) > tol:
            mid = 0.5 * (inside + outside)
            inside, outside = (mid, outside) if rejects(mid, claim) else (inside, mid)
        return inside

    return edge("above"), edge("below")


class PairedGate:
    """The anytime-valid gate "E[D] <= margin" over a growing stream of paired differences."""

    def __init__(self, margin: float, alpha: float):
        self.margin, self.alpha = margin, alpha
        self.d = np.zeros(0)
        self.decision: tuple[str, int] | None = None  # ("pass" | "fail", draws it rests on)

    def update(self, d: np.ndarray) -> None:
        self.d = np.concatenate([self.d, d])
        passed, failed = _rejected(self.d, self.margin, self.alpha)
        decided = [(t, verdict) for t, verdict in ((passed, "pass"), (failed, "fail")) if t is not None]
        if decided:
            t, verdict = min(decided)
            self.decision = (verdict, t)

    @property
    def used(self) -> int:
        return self.decision[1] if self.decision else len(self.d)
