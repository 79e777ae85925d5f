"""The sequential gate "mean >= threshold" on a stream of values in [0, 1]: two betting tests
(``stats.betting``), one per claim, each at level alpha.

A gate fed with ``update`` block by block defers the arithmetic of blocks that provably cannot
decide. With the plug-in Kelly bets (no horizon), each side's log capital after a block is its
log capital before it plus a sum of log1p(lambda_s (x_s - m)) terms, and log1p(y) <= y. Each bet
is a clipped function of the running mean before it, mu = (1/2 + sum before) / (draws before + 1);
for C a block's sum and W its length, with T and t the sum and count before the block (the waiting
blocks before it included), every running mean in the block lies in

    [(1/2 + T) / (t + W - C + 1),  (1/2 + T + C) / (t + C + 1)]

(x in [0, 1]: the sum after j of the block's draws lies in [max(0, C - (W - j)), min(j, C)]), so
its pass-side bets lie in [lo, hi], the clipped bets at those two means, and its terms sum to at
most L = hi * sum_s (x_s - m)^+ - lo * sum_s (m - x_s)^+ (a term with x_s < m is largest at the
smallest bet), the terms up to any draw inside it to at most hi * sum_s (x_s - m)^+. Over waiting
blocks 1..k the pass side's log capital therefore rises by at most

    max_j (L_1 + ... + L_(j-1) + hi_j * sum over block j of (x_s - m)^+),

kept block by block in O(1) (the fail side mirrors it with m - x_s and its own bets). Per block,
the range of the running mean shrinks like W / t, so on a long stream near its threshold blocks
wait until the bound's linear growth reaches the level. While both sides' bounds stay below it,
the blocks wait; the first block whose bound reaches it is computed exactly with the blocks before
it, so the decision (its draw included), the capitals and the p-values are those of updating block
by block (up to the float rounding of summing the same terms in longer runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pytest_robust.stats.betting import BET_CAP, _KellyPair, _Mixture

#: The most draws a gate keeps waiting before it computes them (memory: 8 bytes a draw).
MOST_WAITING = 1 << 20
#: No waiting block: (draws, their sum, each side's summed bound L, each side's largest peak).
_EMPTY = (0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Decision:
    """Outcome of a sequential gate: ``verdict`` is "pass" or "fail"; ``at`` counts the draws used."""

    verdict: str
    at: int


class SequentialGate:
    """Anytime-valid one-sided test of "mean >= threshold" on a stream of values in [0, 1].

    Two betting processes run side by side, each at level alpha:
    pass when the test of H0: mean <= threshold rejects (false pass <= alpha whenever the true mean
    is at most the threshold), fail when the mirror test of H0: mean >= threshold rejects (false
    fail <= alpha whenever the true mean is at least the threshold). Feed blocks with ``update``;
    once decided, further updates are ignored. With ``horizon=n`` each side bets with the mixture
    of constant bets sized for the gaps n draws can resolve, plus the bold bet (``stats.betting``):
    still level alpha per side, much faster near a threshold close to 0 or 1, and a side whose
    data all sit at its favoured extreme decides within a few draws of the fixed-size minimum.
    Without a horizon, blocks that provably cannot decide wait (module docstring).

    ``p_values()`` gives each side's anytime-valid p-value, 1 / the largest capital its betting
    process reached up to the decision: by Ville's inequality P(p <= a) <= a under that side's
    null for every level a, at any stopping time, and it is <= alpha exactly when that side decided.
    """

    def __init__(self, threshold: float, alpha: float, horizon: int | None = None):
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must lie strictly between 0 and 1, got {threshold}")
        self.threshold = threshold
        self.alpha = alpha
        self._log_level = math.log(1.0 / alpha)
        self._kelly = _KellyPair(threshold) if horizon is None else None
        if self._kelly is not None:
            self._sides = self._kelly.advance
        else:
            sides = _Mixture(threshold, alpha, horizon), _Mixture(1.0 - threshold, alpha, horizon)
            self._sides = lambda x: np.stack((sides[0].advance(x), sides[1].advance(1.0 - x)))
        self._done = 0  # draws computed (``seen`` counts the waiting ones too)
        self.decision: Decision | None = None
        #: the largest log capital of each side so far (0: the initial capital 1), up to the decision
        self._best = {"pass": 0.0, "fail": 0.0}
        #: blocks that cannot decide, not yet computed (``_waits``), with their count and sum, and each
        #: side's bound on its rise over them: the sum of the blocks' L and the largest peak (module docstring)
        self._waiting: list = []
        self._tally = _EMPTY

    def update(self, x: np.ndarray) -> Decision | None:
        """Consume a block of observations; return the decision once one is reached."""
        if self.decision is not None:
            return self.decision
        x = np.asarray(x)
        if self._kelly is not None and self._waits(x):
            return None
        self._compute(x)
        return self.decision

    def _waits(self, x: np.ndarray) -> bool:
        """Whether block x joins the waiting blocks: no point of them can reach the level on
        either side (module docstring); its tally is kept either way until it is computed."""
        m = self.threshold
        if x.dtype == bool:  # outcomes: the sums are counts
            ones = int(np.count_nonzero(x))
            total, above, below = float(ones), ones * (1.0 - m), (len(x) - ones) * m
        else:  # sum (x - m) = sum (x - m)^+ - sum (m - x)^+
            gaps = np.asarray(x, dtype=np.float64) - m
            shift, above = float(gaps.sum()), float(np.maximum(gaps, 0.0).sum())
            total, below = shift + m * len(x), above - shift
        n, c, rise_pass, rise_fail, peak_pass, peak_fail = self._tally
        k = self._kelly
        t, before = k.t + n, k.total + c  # draws and their sum before this block
        scale = m * (1.0 - m)
        high = ((0.5 + before + total) / (t + total + 1.0) - m) / scale  # (mu - m) / (m (1 - m)) at the extremes
        low = ((0.5 + before) / (t + len(x) - total + 1.0) - m) / scale
        pass_cap, fail_cap = BET_CAP / m, BET_CAP / (1.0 - m)
        pass_hi, pass_lo = min(max(high, 0.0), pass_cap), min(max(low, 0.0), pass_cap)
        fail_hi, fail_lo = min(max(-low, 0.0), fail_cap), min(max(-high, 0.0), fail_cap)
        peak_pass, peak_fail = max(peak_pass, rise_pass + pass_hi * above), max(peak_fail, rise_fail + fail_hi * below)
        rise_pass += pass_hi * above - pass_lo * below
        rise_fail += fail_hi * below - fail_lo * above
        level = self._log_level - 1e-9 * (1.0 + self._log_level)  # a margin far above either computation's rounding
        pass_capital, fail_capital = k.last
        n, c = n + len(x), c + total
        waits = n <= MOST_WAITING and pass_capital + peak_pass < level and fail_capital + peak_fail < level
        if waits:
            self._waiting.append(x)
            self._tally = (n, c, rise_pass, rise_fail, peak_pass, peak_fail)
        return waits

    def _compute(self, x: np.ndarray | None = None) -> None:
        """Advance both sides over the waiting blocks and x (None: the waiting blocks alone), in
        one pass, and decide where a side first reaches the level."""
        blocks = self._waiting + ([] if x is None else [x])
        self._waiting, self._tally = [], _EMPTY
        if not blocks:
            return
        x = np.concatenate(blocks, dtype=np.float64)
        logs = self._sides(x)  # row 0: the pass side's log capital, row 1: the fail side's
        best = logs.max(axis=1) if len(x) else np.zeros(2)
        if best.max() >= self._log_level:
            crossed = logs >= self._log_level
            firsts = [(int(np.argmax(row)), side) for row, side in zip(crossed, ("pass", "fail")) if row.any()]
            at, verdict = min(firsts)
            self.decision = Decision(verdict, self._done + at + 1)
            best = logs[:, :at + 1].max(axis=1)  # what follows the decision is not part of the test
        self._best = {"pass": max(self._best["pass"], float(best[0])), "fail": max(self._best["fail"], float(best[1]))}
        self._done += len(x)

    @property
    def seen(self) -> int:
        """Draws fed to the gate before its decision (all of them while it is undecided)."""
        return self._done + self._tally[0]

    def p_values(self) -> dict[str, float]:
        """{"pass": p, "fail": p}: each side's anytime-valid p-value, min(1, 1 / the largest
        capital its betting process reached so far, up to the decision) (class docstring). The
        p-value of H0: mean <= threshold is "pass" (its rejection proves the requirement), that of
        H0: mean >= threshold "fail". It agrees with the gate exactly: a side's p-value is <= alpha
        if and only if that side decided (rounding at the level itself resolved by the decision)."""
        self._compute()  # the waiting blocks, which cannot decide, still raise the largest capitals
        out = {}
        for side, best in self._best.items():
            p = min(1.0, math.exp(-best))
            decided = self.decision is not None and self.decision.verdict == side
            out[side] = min(p, self.alpha) if decided else max(p, math.nextafter(self.alpha, 1.0))
        return out
