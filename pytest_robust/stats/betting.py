"""Anytime-valid sequential tests by betting: the betting processes of the gate (``stats.gate``)
and the confidence sequence ``confidence_sequence`` on the mean of a stream of values in [0, 1].

Pure Python and NumPy (and torch's ``cumsum`` for the running sums, ``running_sum``); nothing
here knows about pytest or the checks.

Betting test of H0: E[X] <= m for X_i in [0, 1] (Waudby-Smith & Ramdas, JRSS-B 2024):
    K_t = prod_{i <= t} (1 + lambda_i (X_i - m)),   0 <= lambda_i <= c / m,
with lambda_i a function of X_1..X_{i-1} only (a plug-in Kelly bet, see ``_advance``). Under H0,
K_t is a non-negative supermartingale, so by Ville's inequality P(sup_t K_t >= 1/alpha) <= alpha:
rejecting H0 the first time K_t >= 1/alpha has false-rejection probability <= alpha at *any*
stopping time. Inverting the test over m gives a confidence sequence for the mean.

Mixture of bets (``SequentialGate(..., horizon=n)``): each side bets with
    W_t = W_BOLD B_t + (1 - W_BOLD) / k sum_j C_t(lambda_j),
    C_t(lambda) = prod_{i <= t} (1 + lambda (X_i - m)),   B_t = C_t(BOLD / m),
constant bets on a grid of alternatives: lambda_j = min(delta_j / (m (1 - m)), BET_CAP / m), the
Kelly bet against mean m + delta_j for small gaps, with delta_j geometric (ratio GRID_RATIO) from
delta_min = sqrt(2 log(1 / alpha) m (1 - m) / n), the smallest gap a test of n draws can resolve,
to 1 - m; B is the nearly all-in bet that certifies a stream of all-successes. Each C(lambda)
with 0 <= lambda < 1 / m is a non-negative supermartingale with initial value 1 under H0, so a
convex combination of them is one too (E[W_t | past] = sum_j w_j E[C_t(lambda_j) | past] <=
sum_j w_j C_{t-1}(lambda_j) = W_{t-1}), and Ville's inequality applies to W unchanged. The price is
log(1 / w_j) in the rejection level of the component that fits the data; in return the test
stakes the right amount from the first draw (the plug-in bet needs ~1 / (1 - m) draws before its
estimate of the mean moves its stake), so a stream of all-successes is rejected within
log(1 / (W_BOLD alpha)) / log(1 + BOLD (1 - m) / m) draws, near the fixed-size minimum
log(1 / alpha) / log(1 / m), and inputs close to m decide with the growth rate of a bet sized
for their gap.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

#: Largest fraction of the admissible bet 1/m that is ever staked (keeps each factor >= 1 - BET_CAP).
BET_CAP = 0.9
#: Fraction of the admissible bet 1/m staked on every observation by the bold component of a
#: mixture (each factor stays >= 1 - BOLD > 0), and that component's weight.
BOLD = 0.995
W_BOLD = 0.35
#: Ratio between neighbouring gaps delta_j of a mixture's grid of constant bets.
GRID_RATIO = math.sqrt(2.0)


def running_sum(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.cumsum(a, axis=-1)`` of a float64 array (``out``: where to write it, ``a`` itself
    allowed): the same sequential float64 sums, element by element along the last axis, by torch's
    ``cumsum`` on the same memory, four to six times faster than NumPy's from a few hundred
    elements on (``tests/test_stats.py`` checks the numbers are NumPy's exactly). Torch is imported
    here, not at import: the plugin loads without it (``stats``)."""
    import torch

    a = np.asarray(a, dtype=np.float64)
    if not a.flags.writeable or any(step < 0 for step in a.strides):  # memory torch cannot take as it is
        a = a.copy()
    out = np.empty(a.shape) if out is None else out
    torch.cumsum(torch.from_numpy(a), a.ndim - 1, out=torch.from_numpy(out))
    return out


@dataclass
class _Running:
    """Sufficient statistics of a betting process: count, sum of observations, log capital (the
    sum and the log capital are arrays of shape (k, 1) for k processes advanced side by side)."""

    t: int = 0
    total: float | np.ndarray = 0.0
    log_capital: float | np.ndarray = 0.0


def _advance(x: np.ndarray, m, state: _Running) -> np.ndarray:
    """Log capital after each element of block x for H0: E[X] <= m; updates ``state`` in place.

    The bet is the plug-in Kelly fraction for a Bernoulli mean, from past data only:
    mu_{t-1} = (1/2 + sum_{i<t} x_i) / t,  lambda_t = clip((mu_{t-1} - m) / (m (1 - m)), 0, BET_CAP / m).
    (For X in {0, 1} it maximises E log(1 + lambda (X - m)) at mean mu; the cap keeps every factor
    1 + lambda (X - m) >= 1 - BET_CAP > 0 for any X in [0, 1].)

    x may hold k streams as rows of a (k, n) array, with m of shape (k, 1) (``_KellyPair``): each
    row gets the numbers of advancing it alone (the same element-wise operations, and cumulative
    sums along the row), in one pass of array operations instead of k.
    """
    n = x.shape[-1]
    if n == 0:
        return np.empty(x.shape)
    sums = running_sum(x)
    mu_before = np.empty_like(sums)  # (1/2 + the sum before each element) / (elements before it + 1)
    mu_before[..., 0] = 0.0
    mu_before[..., 1:] = sums[..., :-1]
    mu_before += state.total
    mu_before += 0.5
    mu_before /= np.arange(state.t + 1, state.t + n + 1, dtype=np.float64)
    lam = np.subtract(mu_before, m, out=mu_before)
    lam /= m * (1.0 - m)
    np.clip(lam, 0.0, BET_CAP / m, out=lam)
    lam *= x - m
    log_k = running_sum(np.log1p(lam, out=lam), out=lam)
    log_k += state.log_capital
    state.t += n
    state.total = state.total + (sums[..., -1:] if x.ndim > 1 else sums[-1])
    state.log_capital = log_k[..., -1:].copy() if x.ndim > 1 else float(log_k[-1])
    return log_k


def mixture_bets(m: float, alpha: float, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(bets lambda, log weights) of the mixture test of H0: E[X] <= m (module docstring)."""
    smallest = math.sqrt(2.0 * math.log(1.0 / alpha) * m * (1.0 - m) / horizon)
    k = 1 + max(0, math.ceil(math.log((1.0 - m) / smallest) / math.log(GRID_RATIO)))
    gaps = np.geomspace(min(smallest, 1.0 - m), 1.0 - m, k)
    bets = np.concatenate(([BOLD / m], np.minimum(gaps / (m * (1.0 - m)), BET_CAP / m)))
    weights = np.concatenate(([W_BOLD], np.full(k, (1.0 - W_BOLD) / k)))
    return bets, np.log(weights)


class _KellyPair:
    """The plug-in Kelly processes of ``_advance`` for the gate's two sides, H0: E[X] <= m on x
    (pass) and H0: E[1 - X] <= 1 - m on 1 - x (fail), advanced together in one pass over x.

    The fail side's running mean of 1 - x is 1 - mu_{t-1}, so its bet is
    clip((m - mu_{t-1}) / (m (1 - m)), 0, BET_CAP / (1 - m)) and its factor 1 + lambda (m - x):
    with u = (mu_{t-1} - m) / (m (1 - m)) and v = clip(u, -BET_CAP / (1 - m), BET_CAP / m), each
    element's factor 1 + v (x - m) belongs to the pass side where v > 0 and to the fail side where
    v < 0 (the other side's factor is 1). One log1p per element serves both sides: the numbers
    of ``_advance`` on x and on 1 - x up to float64 rounding (``tests/test_hot_loop.py``)."""

    def __init__(self, m: float):
        self.m = m
        self.t, self.total = 0, 0.0
        self.log_capital = np.zeros((2, 1))
        #: the two sides' log capitals as Python floats (the gate's test of waiting blocks)
        self.last = (0.0, 0.0)

    def advance(self, x: np.ndarray) -> np.ndarray:
        """(2, len(x)): each side's log capital after each element of block x."""
        n, m = len(x), self.m
        if n == 0:
            return np.empty((2, 0))
        mu = np.empty(n)  # (1/2 + the sum before each element) / (elements before it + 1)
        sums = running_sum(x)
        mu[0] = self.total
        mu[1:] = sums[:-1]
        mu[1:] += self.total
        mu += 0.5
        mu /= np.arange(self.t + 1, self.t + n + 1, dtype=np.float64)
        mu -= m
        mu /= m * (1.0 - m)
        np.clip(mu, -BET_CAP / (1.0 - m), BET_CAP / m, out=mu)
        logs = np.zeros((2, n))
        opened = mu > 0.0  # the pass side's bets; the fail side's where mu < 0
        np.subtract(x, m, out=logs[1])
        np.log1p(np.multiply(mu, logs[1], out=logs[1]), out=logs[1])
        np.copyto(logs[0], logs[1], where=opened)
        np.copyto(logs[1], 0.0, where=opened)
        running_sum(logs, out=logs)
        logs += self.log_capital
        self.t += n
        self.total += float(sums[-1])
        self.log_capital = logs[:, -1:].copy()
        self.last = (float(logs[0, -1]), float(logs[1, -1]))
        return logs


class _Mixture:
    """The mixture process of ``mixture_bets`` for H0: E[X] <= m: the log of each component's
    weighted capital."""

    def __init__(self, m: float, alpha: float, horizon: int):
        self.m = m
        self.bets, self.log_parts = mixture_bets(m, alpha, horizon)

    def advance(self, x: np.ndarray) -> np.ndarray:
        """Log of the mixture capital after each element of block x; updates the state in place."""
        if len(x) == 0:
            return np.empty(0)
        logs = self.log_parts[:, None] + running_sum(np.log1p(self.bets[:, None] * (x[None, :] - self.m)))
        self.log_parts = logs[:, -1].copy()
        return np.logaddexp.reduce(logs, axis=0)


def rejects_at(x: np.ndarray, m: float, alpha: float) -> int | None:
    """First index t (0-based) at which the betting test rejects H0: E[X] <= m, or None."""
    if m <= 0.0:
        return 0 if len(x) else None
    if m >= 1.0:
        return None
    log_k = _advance(np.asarray(x, dtype=np.float64), m, _Running())
    hits = np.flatnonzero(log_k >= math.log(1.0 / alpha))
    return int(hits[0]) if len(hits) else None


#: Observations per piece of ``Rejection`` (the first; each next one twice as many).
FIRST_PIECE = 4096


class Rejection(ABC):
    """Whether a betting test on a fixed stream rejects its H0 at m by the end of the stream, for
    many m (the bisections of ``confidence_sequence`` and ``stats.paired.confidence_sequence``). A subclass
    writes each draw's log factor log(1 + lambda_i (x_i - m)) of a piece of the stream into ``out``
    (``terms``) from what it computed once for every m; the log capital is summed piece by
    piece, stopping at the first piece where it crosses the level (each piece's running sum
    starts from the previous one's last value, so every partial sum is the one ``np.cumsum`` of
    the whole stream makes, ``running_sum``)."""

    def __init__(self, n: int, alpha: float):
        self.n, self.level = n, math.log(1.0 / alpha)
        self.work, self.gap = np.empty(n), np.empty(n)  # the work arrays of every m

    @abstractmethod
    def terms(self, piece: slice, m: float, out: np.ndarray, spare: np.ndarray) -> None:
        """Write the log factors of the draws ``piece`` at m into ``out`` (``spare``: a second work
        array of the same length)."""

    def __call__(self, m: float) -> bool:
        return self.capital(m, stop=self.level) >= self.level

    def distance(self, m: float) -> float:
        """sqrt(largest log capital, at least 0) - sqrt(level): the sign of ``capital(m) - level``,
        nearly linear in m near the bound (the log capital grows about as (mean - m)^2), so the
        bracket's interpolation steps land close to it."""
        return math.sqrt(max(self.capital(m), 0.0)) - math.sqrt(self.level)

    def capital(self, m: float, stop: float = math.inf) -> float:
        """The largest log capital of the test at m over the stream, or the first value of at least
        ``stop``."""
        carried, best, start, size = 0.0, -math.inf, 0, FIRST_PIECE
        while start < self.n and best < stop:
            piece = slice(start, start + size)
            log_k = self.work[piece]
            self.terms(piece, m, log_k, self.gap[piece])
            log_k[0] += carried  # the running sum goes on from the previous piece's
            running_sum(log_k, out=log_k)
            best, carried, start, size = max(best, float(log_k.max())), log_k[-1], start + size, 2 * size
        return best


class _KellyRejection(Rejection):
    """``Rejection`` of the plug-in Kelly test of ``_advance`` (H0: E[X] <= m, X in [0, 1]) on x:
    the numbers of ``rejects_at``, with the running means mu_{t-1}, which do not depend on m,
    computed once."""

    def __init__(self, x: np.ndarray, alpha: float):
        super().__init__(len(x), alpha)
        self.x = x
        sum_before = np.concatenate(([0.0], running_sum(x)[:-1]))
        self.mu_before = (0.5 + sum_before) / (np.arange(len(x), dtype=np.float64) + 1.0)

    def __call__(self, m: float) -> bool:
        if m <= 0.0:
            return self.n > 0
        if m >= 1.0:
            return False
        return super().__call__(m)

    def terms(self, piece: slice, m: float, out: np.ndarray, spare: np.ndarray) -> None:
        np.subtract(self.mu_before[piece], m, out=out)
        np.divide(out, m * (1.0 - m), out=out)
        np.clip(out, 0.0, BET_CAP / m, out=out)
        np.multiply(out, np.subtract(self.x[piece], m, out=spare), out=out)
        np.log1p(out, out=out)


#: Most regula falsi steps (``_bracket``) that narrow the bracket before the bisection; they stop
#: once the bracket is narrower than the bisection's tolerance.
FALSI_STEPS = 12
#: Where the test does not reject at the bracket's first end, the next end lies this many times the
#: linear extrapolation to the bound beyond it (a margin, so that it rejects there).
EXTRAPOLATE = 1.25


def _bracket(x: np.ndarray, alpha: float, rejects: Rejection, tol: float) -> tuple[float, float]:
    """(below, above): the test rejects at ``below`` and not at ``above``, both confirmed by
    ``rejects``, close around the bound. It starts from the mean (above) and the mean less the
    Hoeffding half-width sqrt(log(1 / alpha) / 2n) (below), where the bound lies on most data
    (or half the mean, when that is below 0; where the test does not reject there, the next end lies
    ``EXTRAPOLATE`` times the linear extrapolation to the bound beyond it, at most twice as far from
    the mean (or half as far from 0), the last end not rejected becoming ``above``, until it
    rejects or the end falls below the tolerance), and narrows them by regula falsi (Illinois)
    steps. Both steps interpolate sqrt(largest log capital) - sqrt(level) (``distance``), which
    has the sign of the test's verdict and is nearly linear in m, as the log capital grows about
    as (mean - m)^2: a fifth fewer tests than on the log capital itself, the same bracket ends
    confirmed, so the same bounds.
    An end the test does not confirm is 0 (below) or 1 (above), which exclude nothing."""
    mean = float(x.mean())
    below = mean - math.sqrt(math.log(1.0 / alpha) / (2.0 * len(x)))
    below = below if below > 0.0 else mean / 2.0
    if not 0.0 < below < mean < 1.0:
        return 0.0, 1.0
    above = mean
    f_below, f_above = rejects.distance(below), rejects.distance(above)
    while f_below < 0.0 and f_above < 0.0 and below > tol:  # the bound lies lower: extrapolate past it
        reach = below + EXTRAPOLATE * (above - below) * f_below / (f_below - f_above) if f_below > f_above else 0.0
        widest = 2.0 * below - mean if 2.0 * below > mean else below / 2.0  # twice as far from the mean
        above, f_above = below, f_below
        below = max(reach, widest)
        f_below = rejects.distance(below)
    if not f_below >= 0.0 > f_above:
        return (below if f_below >= 0.0 else 0.0), (above if f_above < 0.0 else 1.0)
    side = 0
    for _ in range(FALSI_STEPS):
        if above - below < tol:
            break
        m = below + (above - below) * f_below / (f_below - f_above)
        if not below < m < above:
            break
        f = rejects.distance(m)
        if f >= 0.0:
            below, f_below = m, f
            f_above, side = (f_above / 2 if side == 1 else f_above), 1
        else:
            above, f_above = m, f
            f_below, side = (f_below / 2 if side == -1 else f_below), -1
    return below, above


def confidence_sequence(
    x: np.ndarray, alpha: float, *, lower_at_least: float = 0.0, upper_at_most: float = 1.0, tol: float = 1e-6
) -> tuple[float, float]:
    """Anytime-valid (1 - alpha) one-sided lower and upper bounds on E[X] after observing x.

    lower = sup{m : the betting test of E[X] <= m has rejected by now}, found by bisection (the
    rejection region is an interval [0, lower)); upper is the mirror image on 1 - x.
    ``lower_at_least`` / ``upper_at_most`` are values the same tests are known to have rejected
    (the gate's threshold after a pass / fail): the bisection starts there, so the reported bound
    and the verdict agree exactly. Each test is ``_KellyRejection``'s (``rejects_at``'s numbers);
    midpoints outside a bracket the tests have confirmed (``_bracket``) are not tested again,
    which changes no step of the bisection.
    """
    x = np.asarray(x, dtype=np.float64)

    def bound(data: np.ndarray, known: float) -> float:
        lo = max(known, 0.0)
        if len(data) == 0:
            return lo
        rejects = _KellyRejection(data, alpha)
        if not rejects(max(lo, tol)):
            return lo
        below, above = _bracket(data, alpha, rejects, tol)
        lo, hi = max(lo, tol), 1.0
        while hi - lo > tol:
            mid = 0.5 * (lo + hi)
            if mid <= below or (mid < above and rejects(mid)):
                lo = mid
            else:
                hi = mid
        return lo

    return bound(x, lower_at_least), 1.0 - bound(1.0 - x, 1.0 - upper_at_most)
