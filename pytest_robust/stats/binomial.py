"""Exact binomial and Student-t tails from the regularized incomplete beta function I_x(a, b).

Pure Python (math only); nothing here knows about torch, numpy or pytest.

Clopper–Pearson (fixed sample size n, k successes, one-sided level alpha):
    lower = BetaInv(alpha; k, n - k + 1)     (0 when k = 0; alpha**(1/n) when k = n)
    upper = BetaInv(1 - alpha; k + 1, n - k) (1 when k = n)

Binomial tail: P(Bin(n, p) >= k) = I_p(k, n - k + 1). Student t with nu degrees of freedom:
P(T > t) = I_x(nu/2, 1/2) / 2 with x = nu / (nu + t^2). I_x(a, b) by its continued fraction
(modified Lentz), its inverse by bisection.

P-values of the Clopper–Pearson bounds (``clopper_pearson_p_values``): the smallest level at which
the bound crosses m. The lower bound BetaInv(a; k, n - k + 1) is >= m exactly when a >= I_m(k, n -
k + 1) = P(Bin(n, m) >= k), the exact one-sided binomial test of H0: p <= m; the upper bound is <=
m exactly when a >= P(Bin(n, m) <= k), the test of H0: p >= m. So each p-value is <= alpha exactly
when the bound at level alpha decides, and P(p <= a) <= a under its null for every a.
"""

from __future__ import annotations

import functools
import math


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def betaincinv(a: float, b: float, y: float) -> float:
    """The x in [0, 1] with I_x(a, b) = y, by bisection to the last bit (I_x is increasing in x).
    Midpoints outside a bracket that evaluations have confirmed (``_bracket``) are decided
    without evaluating I_x again, which changes no step of the bisection."""
    below, above = _bracket(a, b, y)
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if mid <= below or (mid < above and betainc(a, b, mid) < y):
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


#: Newton steps of ``_bracket``, and its last bracket's half-width relative to the root.
NEWTON_STEPS, NEWTON_WIDTH = 12, 1e-10


def _bracket(a: float, b: float, y: float) -> tuple[float, float]:
    """(below, above) with I_below(a, b) < y <= I_above(a, b), both evaluated: safeguarded Newton
    steps on I_x - y (the derivative is the Beta(a, b) density) keep such a bracket and move x to
    the root, and two last evaluations at the root -+ ``NEWTON_WIDTH`` tighten both ends."""
    lo, hi, x = 0.0, 1.0, a / (a + b)
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    for _ in range(NEWTON_STEPS):
        f = betainc(a, b, x) - y
        lo, hi = (x, hi) if f < 0.0 else (lo, x)
        density = math.exp((a - 1.0) * math.log(x) + (b - 1.0) * math.log1p(-x) - log_beta)
        step = x - f / density if density > 0.0 else 0.5 * (lo + hi)
        new = step if lo < step < hi else 0.5 * (lo + hi)
        if abs(new - x) <= NEWTON_WIDTH * x:
            x = new
            break
        x = new
    for end in (x * (1.0 - NEWTON_WIDTH), x * (1.0 + NEWTON_WIDTH)):
        if lo < end < hi:
            lo, hi = (end, hi) if betainc(a, b, end) < y else (lo, end)
    return lo, hi


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, dof: int) -> float:
    """The p-quantile (p > 1/2) of Student's t with ``dof`` degrees of freedom.

    P(T > t) = I_x(dof/2, 1/2) / 2 with x = dof / (dof + t^2), solved with ``betaincinv``
    (memoized: a sequential gate asks for the same few quantiles again and again).
    """
    x = betaincinv(dof / 2.0, 0.5, 2.0 * (1.0 - p))
    return math.sqrt(dof * (1.0 - x) / x)


def binom_sf(k: int, n: int, p: float) -> float:
    """P(Bin(n, p) >= k), exactly, via I_p(k, n - k + 1)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return betainc(k, n - k + 1, p)


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(Bin(n, p) <= k), exactly, via P(Bin(n, 1 - p) >= n - k) (no cancellation in small tails)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return binom_sf(n - k, n, 1.0 - p)


def t_sf(t: float, dof: int) -> float:
    """P(T > t) for Student's t with ``dof`` degrees of freedom (the p-value of a one-sided t test
    whose statistic is t; ``t_quantile`` is its inverse): I_x(dof/2, 1/2) / 2 with x = dof / (dof +
    t^2) for t >= 0, one minus that below 0; 0 and 1 at plus and minus infinity."""
    if math.isnan(t):
        return 1.0
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * betainc(dof / 2.0, 0.5, dof / (dof + t * t))
    return tail if t >= 0 else 1.0 - tail


def clopper_pearson_p_values(k: int, n: int, m: float) -> tuple[float, float]:
    """(p above, p below): the exact one-sided binomial p-values of H0: p <= m (rejected when the
    Clopper–Pearson lower bound is >= m) and of H0: p >= m (rejected when the upper bound is <= m),
    for k successes in n trials (module docstring). Each is the smallest level at which its bound
    crosses m: ``clopper_pearson_lower(k, n, a) >= m`` exactly when ``a >= p above``."""
    if not (n >= 1 and 0 <= k <= n):
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    above = 0.0 if m <= 0.0 else 1.0 if m >= 1.0 else binom_sf(k, n, m)
    below = 0.0 if m >= 1.0 else 1.0 if m <= 0.0 else binom_cdf(k, n, m)
    return above, below


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper–Pearson lower bound on a binomial proportion."""
    _check_counts(k, n, alpha)
    if k == 0:
        return 0.0
    if k == n:
        return alpha ** (1.0 / n)
    return betaincinv(k, n - k + 1, alpha)


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper–Pearson upper bound on a binomial proportion."""
    _check_counts(k, n, alpha)
    return 1.0 - clopper_pearson_lower(n - k, n, alpha)


def _check_counts(k: int, n: int, alpha: float) -> None:
    if not (n >= 1 and 0 <= k <= n):
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
