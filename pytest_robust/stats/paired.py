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

from pytest_robust.stats.betting import BET_CAP, Rejection, running_sum


def _prefix(d: np.ndarray, before: tuple = (0, 0.0, 0.0)) -> tuple:
    """(i, S, Q, after) of the draws ``d``, which follow ``before`` = (count, sum of D, sum of D^2)
    of the draws before them: per draw the count of draws before it (i), the sum of D before it
    (S) and of D^2 (Q), and the totals after the last. The sums continue ``before`` element by
    element (a sequential cumsum), so a stream fed in steps gets the numbers of the whole stream;
    for D in {-1, 0, 1} they are integers, exact in float64."""
    count, total, squares = before
    sums = np.empty((2, len(d) + 1))  # the running sums of D and of D^2, side by side
    sums[0, 0], sums[1, 0], sums[0, 1:] = total, squares, d
    np.multiply(d, d, out=sums[1, 1:])
    running_sum(sums, out=sums)
    i = np.arange(count, count + len(d), dtype=np.float64)
    return i, sums[0, :-1], sums[1, :-1], (count + len(d), float(sums[0, -1]), float(sums[1, -1]))


def _bets(m: float, i: np.ndarray, sums: np.ndarray, squares: np.ndarray, out: np.ndarray | None = None,
          spare: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(r, spare): per draw r_i = (m i - S) / (1/4 + q), the "below" side's bet before its clip (the
    "above" side's is -r: at most one side bets on a draw), from the draws' ``_prefix`` (``_terms``);
    ``out`` holds r, ``spare`` is a work array of the same length (None: new ones)."""
    out = np.multiply(i, m, out=out)
    spare = np.subtract(out, np.multiply(sums, 2.0, out=spare), out=spare)
    spare *= m
    spare += squares
    spare += 0.25  # 1/4 + q
    np.subtract(out, sums, out=out)
    out *= np.divide(1.0, spare, out=spare)  # 1 / (1/4 + q): np.reciprocal's numbers, twice as fast
    return out, spare


def _cap(m: float, claim: str) -> float:
    """The largest bet of the test that proves ``claim`` about m: BET_CAP / b, b its largest loss."""
    return BET_CAP / max(1.0 - m if claim == "below" else 1.0 + m, 1e-9)


def _terms(d: np.ndarray, m: float, claim: str, i: np.ndarray, sums: np.ndarray, squares: np.ndarray,
           out: np.ndarray | None = None, spare: np.ndarray | None = None) -> np.ndarray:
    """log(1 + lambda_i Z_i) per draw of the test that proves ``claim`` about m: "below" rejects
    E[D] >= m (Z = m - D, which can lose at most b = 1 - m), "above" rejects E[D] <= m (Z = D - m,
    at most b = 1 + m); ``i``, ``sums``, ``squares`` are the draws' ``_prefix``, ``out`` and
    ``spare`` work arrays of their length (None: new ones); returns ``out``.

    The bet lambda_i = clip(mu / (v + mu^2), 0, BET_CAP / b) uses the running mean mu and second
    moment v + mu^2 of Z_1..Z_{i-1}, with a prior of one observation at 0 and variance 1/4:
    mu = s / (i + 1) and v + mu^2 = (1/4 + q) / (i + 1) with s, q the sums of Z and Z^2 before the
    draw, so lambda_i = s / (1/4 + q), where s = +-(m i - S) and q = (m i - 2 S) m + Q (the sums
    of D before it, ``_prefix``, serve every m): lambda_i = clip(+-r_i, 0, BET_CAP / b) (``_bets``).
    It is predictable, so the capital is a supermartingale under H0."""
    out, spare = _bets(m, i, sums, squares, out, spare)
    above = claim == "above"
    if above:
        np.negative(out, out=out)
    np.clip(out, 0.0, _cap(m, claim), out=out)
    out *= np.subtract(m, d, out=spare)
    if above:
        np.negative(out, out=out)
    return np.log1p(out, out=out)


class _Rejection(Rejection):
    """Whether the test that proves ``claim`` about m (``_terms``) on the draws d rejects, for
    many m (``confidence_sequence``); ``prefix`` is d's ``_prefix``, computed once for every m."""

    def __init__(self, d: np.ndarray, alpha: float, claim: str, prefix: tuple):
        super().__init__(len(d), alpha)
        self.d, self.claim, self.prefix = d, claim, prefix

    def terms(self, piece: slice, m: float, out: np.ndarray, spare: np.ndarray) -> None:
        _terms(self.d[piece], m, self.claim, *(a[piece] for a in self.prefix), out, spare)


def _capital(d: np.ndarray, m: float, claim: str) -> np.ndarray:
    """Log capital after each draw of ``d`` of the test that proves ``claim`` about m (``_terms``)."""
    d = np.asarray(d, dtype=np.float64)
    return running_sum(_terms(d, m, claim, *_prefix(d)[:3]))


def p_values(d: np.ndarray, margin: float) -> dict:
    """{"pass": p, "fail": p}: the anytime-valid p-value of each claim, 1 / the largest capital its
    test reached over ``d`` (<= alpha exactly when the test rejected at level alpha)."""
    return {verdict: _p_value(_capital(d, margin, claim).max(initial=0.0))
            for verdict, claim in (("pass", "below"), ("fail", "above"))}


def _p_value(log_capital: float) -> float:
    """1 / the largest capital, from its log (at least the initial capital 1)."""
    return float(min(1.0, math.exp(-max(0.0, log_capital))))


def confidence_sequence(d: np.ndarray, alpha: float, tol: float = 1e-4,
                        known: tuple[float, str | None] | None = None) -> tuple[float, float]:
    """(lower, upper) anytime-valid bounds on E[D] for D in [-1, 1] after the stream ``d``: lower
    is the largest m whose test of "E[D] <= m" has rejected (at level alpha, at any time so far),
    upper the smallest m whose test of "E[D] >= m" has; each found by bisection (the rejection
    regions are taken as the intervals below lower and above upper). Each test (``_Rejection``)
    stops at the first piece of the stream where it rejects.

    ``known`` = (margin, decision) is what a ``PairedGate`` over the same draws found at its
    margin: "pass" (the upper side rejected there), "fail" (the lower side rejected there) or
    None (neither), the other side not rejected. The bisection then takes the verdict of every
    midpoint that this settles under the same interval assumption (beyond a margin not rejected,
    or between the end and a margin rejected) instead of testing it: the same bounds, about half
    the tests on a long stream."""
    d = np.asarray(d, dtype=np.float64)
    prefix = _prefix(d)[:3]

    def edge(claim: str) -> float:
        rejects = _Rejection(d, alpha, claim, prefix)
        inside, outside = (-1.0, 1.0) if claim == "above" else (1.0, -1.0)  # rejected end, kept end
        if not (len(d) and rejects(inside)):
            return inside
        margin, decision = known if known is not None else (None, None)
        rejected_there = decision == ("fail" if claim == "above" else "pass")

        def settled(m: float) -> bool | None:  # the verdict at m that the gate's margin settles, else None
            if margin is None or m == margin:
                return rejected_there if m == margin else None
            between = (m - inside) * (margin - m) > 0.0  # m lies between the rejected end and the margin
            return True if rejected_there and between else False if not rejected_there and not between else None

        while abs(outside - inside) > tol:
            mid = 0.5 * (inside + outside)
            verdict = settled(mid)
            inside, outside = (mid, outside) if (rejects(mid) if verdict is None else verdict) else (inside, mid)
        return inside

    return edge("above"), edge("below")


#: The most draws a gate keeps waiting before it computes them (memory: 8 bytes a draw).
MOST_WAITING = 1 << 20
#: Slack of the waiting test against the level, far above float rounding of the log capital.
SLACK = 1e-9
#: The tally of no waiting draws (``PairedGate._waited``).
_NO_TALLY = (0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class PairedGate:
    """The anytime-valid gate "E[D] <= margin" over a growing stream of paired differences D in
    [-1, 1], fed step by step with ``update`` (of two outcomes, D = R - C in {-1, 0, 1}, the waiting
    test below counts a step's draws of each value; any other step takes one more pass): it carries
    the running sums (``_prefix``), each side's log capital and the largest it reached, so a step
    costs what its own draws cost however long the stream, and the capitals are those of
    computing the whole stream at once (``_terms``'s numbers). Both sides advance in one pass: at
    most one of them bets on a draw (``_bets``), so one log1p per draw serves both, as in
    ``betting._KellyPair``. Once decided, updates are ignored.

    Draws that provably cannot decide wait, as in ``stats.gate``. For a side with Z = m - D (pass)
    or D - m (fail), take a step of waiting draws, s and q the sums of Z and Z^2 over every draw
    before it (computed or waiting: known up to float rounding, which ``SLACK`` covers), P and N
    the sums of Z^+ and Z^- over its draws and R their sum of Z^2. A bet on one of its draws has
    numerator s plus the Z of the step's draws before it, within [s - N, s + P], and denominator
    1/4 plus the sum of Z^2 before it, within [1/4 + q, 1/4 + q + R], so it lies within
        lo = min(cap, max(0, s - N) / (1/4 + q + R)),   hi = min(cap, max(0, s + P) / (1/4 + q)).
    As log1p(y) <= y, each draw adds at most hi Z where Z > 0 and lo Z where Z < 0 to the log
    capital: over the step at most hi P - lo N (its *rise*), and at any draw within it at most the
    rise of the steps before plus hi P (its *peak*). While the log capital L where computing
    stopped plus the largest peak stays below the level on both sides the draws wait; the first
    step where it might not is computed with the waiting draws before it, so the decision (its
    draw included), the capitals and the p-values are those of computing every step (the same
    numbers: the sums continue element by element)."""

    def __init__(self, margin: float, alpha: float):
        self.margin, self.level = margin, math.log(1.0 / alpha)
        self._sums = (0, 0.0, 0.0)  # of the draws computed (count, sum of D, sum of D^2)
        self._logs = np.zeros((2, 1))  # each side's log capital ("pass", "fail")
        self._last = (0.0, 0.0)  # the same as Python floats (the waiting test)
        self._best = np.zeros(2)  # each side's largest log capital, up to the decision (0: the initial 1)
        self._waiting: list = []  # draws not yet computed, and their ``_waited`` tally
        self._tally = _NO_TALLY
        self.decision: tuple[str, int] | None = None  # ("pass" | "fail", draws it rests on)

    @property
    def drawn(self) -> int:
        return self._sums[0] + self._tally[0]

    def update(self, d: np.ndarray) -> None:
        """Consume the next draws' differences; decide at the first draw where a side's capital
        reaches 1 / alpha (the earlier side, "fail" when both reach it at the same draw)."""
        if self.decision is not None or len(d) == 0:
            return
        d = np.asarray(d, dtype=np.float64)
        tally = self._waited(d)
        reach = self.level - SLACK
        if (tally[0] <= MOST_WAITING and self._last[0] + tally[5] * (1.0 + 1e-12) < reach
                and self._last[1] + tally[6] * (1.0 + 1e-12) < reach):
            self._waiting.append(d)
            self._tally = tally
            return
        self._compute(np.concatenate([*self._waiting, d]) if self._waiting else d)

    def _waited(self, d: np.ndarray) -> tuple:
        """The waiting tally with the step d added: (draws, sum of the pass side's Z, sum of Z^2,
        each side's rise, each side's peak) over the waiting draws (class docstring)."""
        n, total, squares = self._sums
        count, sum_z, sum_z2, rise_pass, rise_fail, peak_pass, peak_fail = self._tally
        m, k = self.margin, len(d)
        d_sum, d_squares = float(d.sum()), float(np.dot(d, d))
        shift = m * k - d_sum  # the sum of the pass side's Z = m - D over the step (the fail side's is -shift)
        if np.count_nonzero(d) == d_squares:  # D in {-1, 0, 1} (|D| <= 1): P counted from the draws of each value
            up, down = 0.5 * (d_squares + d_sum), 0.5 * (d_squares - d_sum)  # draws with D = 1 and D = -1
            gains = down * max(m + 1.0, 0.0) + (k - up - down) * max(m, 0.0) + up * max(m - 1.0, 0.0)
        else:
            gains = float(np.clip(m - d, 0.0, None).sum())
        losses = gains - shift  # P of the pass side, the sum of (m - D)^+; its N (the fail side's P) is P - sum Z
        s = m * n - total + sum_z  # the pass side's s before the step (the fail side's is -s)
        before = 0.25 + (m * n - 2.0 * total) * m + squares + sum_z2  # 1/4 + q
        r = (m * k - 2.0 * d_sum) * m + d_squares
        cap_pass, cap_fail = _cap(m, "below"), _cap(m, "above")
        hi, lo = min(cap_pass, max(0.0, s + gains) / before), min(cap_pass, max(0.0, s - losses) / (before + r))
        peak_pass, rise_pass = max(peak_pass, rise_pass + hi * gains), rise_pass + hi * gains - lo * losses
        hi, lo = min(cap_fail, max(0.0, losses - s) / before), min(cap_fail, max(0.0, -s - gains) / (before + r))
        peak_fail, rise_fail = max(peak_fail, rise_fail + hi * losses), rise_fail + hi * losses - lo * gains
        return count + k, sum_z + shift, sum_z2 + r, rise_pass, rise_fail, peak_pass, peak_fail

    def flush(self) -> None:
        """Compute the waiting draws (for the p-values, which need every capital)."""
        if self._waiting and self.decision is None:
            self._compute(np.concatenate(self._waiting))

    def _compute(self, d: np.ndarray) -> None:
        """Advance both sides over the draws ``d`` (the waiting ones, then the step's)."""
        self._waiting, self._tally = [], _NO_TALLY
        m, drawn = self.margin, self._sums[0]
        *prefix, self._sums = _prefix(d, self._sums)
        bets, spare = _bets(m, *prefix)
        np.clip(bets, -_cap(m, "above"), _cap(m, "below"), out=bets)  # > 0: the pass side's bet, < 0: the fail side's
        terms = np.log1p(np.multiply(bets, np.subtract(m, d, out=spare), out=spare), out=spare)
        logs = np.empty((2, len(d) + 1))
        logs[:, :1] = self._logs
        np.multiply(terms, bets > 0.0, out=logs[0, 1:])  # each side's terms, 0 where it does not bet
        np.multiply(terms, bets < 0.0, out=logs[1, 1:])
        running_sum(logs, out=logs)
        self._logs = logs[:, -1:].copy()
        self._last = (float(logs[0, -1]), float(logs[1, -1]))
        best = logs[:, 1:].max(axis=1)
        if best.max() >= self.level:  # decided within the step: at its first crossing, the largest up to it
            seen = int(np.flatnonzero((logs[:, 1:] >= self.level).any(axis=0))[0]) + 1
            best = logs[:, 1:seen + 1].max(axis=1)
            self.decision = ("fail" if logs[1, seen] >= self.level else "pass", drawn + seen)
        self._best = np.maximum(self._best, best)

    @property
    def used(self) -> int:
        return self.decision[1] if self.decision else self.drawn

    def p_values(self) -> dict:
        """``p_values`` of the draws the gate used: 1 / the largest capital each side reached up to
        the decision (or over every draw, undecided)."""
        self.flush()
        return {verdict: _p_value(best) for verdict, best in zip(("pass", "fail"), self._best)}
