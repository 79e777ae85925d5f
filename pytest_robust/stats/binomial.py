"""Exact binomial and Student-t tails from the regularized incomplete beta function I_x(a, b).

Pure Python (math only); nothing here knows about torch, numpy or pytest.

Clopper–Pearson (fixed sample size n, k successes, one-sided level alpha):
    lower = BetaInv(alpha; k, n - k + 1)     (0 when k = 0; alpha**(1/n) when k = n)
    upper = BetaInv(1 - alpha; k + 1, n - k) (1 when k = n)

Binomial tail: P(Bin(n, p) >= k) = I_p(k, n - k + 1). Student t with nu degrees of freedom:
P(T > t) = I_x(nu/2, 1/2) / 2 with x = nu / (nu + t^2). I_x(a, b) by its continued fraction
(modified Lentz), its inverse by safeguarded Newton steps.

P-values of the Clopper–Pearson bounds (``clopper_pearson_p_values``): the smallest level at which
the bound crosses m. The lower bound BetaInv(a; k, n - k + 1) is >= m exactly when a >= I_m(k, n -
k + 1) = P(Bin(n, m) >= k), the exact one-sided binomial test of H0: p <= m; the upper bound is <=
m exactly when a >= P(Bin(n, m) <= k), the test of H0: p >= m. So each p-value is <= alpha exactly
when the bound at level alpha decides, and P(p <= a) <= a under its null for every a.
"""

from __future__ import annotations

import functools
import math
import statistics


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
    """The x in [0, 1] with I_x(a, b) = y (I_x is increasing in x): safeguarded Newton steps on
    the log of the tail beyond y (the derivative of I_x is the Beta(a, b) density) inside a
    bracket [lo, hi] with I_lo < y <= I_hi that every evaluation narrows (a step that would leave
    it bisects it instead), until a step moves x by at most ``NEWTON_WIDTH`` of it: about five
    evaluations of I_x (Newton's convergence is quadratic, from a start near the root), against
    some thirty for a bisection to the last bit, to the precision of I_x's own near the root
    (``tests/test_hot_loop.py``, ``tests/test_stats.py``)."""
    if y <= 0.0:
        return 0.0
    if y >= 1.0:
        return 1.0
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    low_tail = y <= 0.5
    # start where the normal approximation puts the root (a, b >= 5), else at the mean or nearer
    # the tail where its leading term x^a / (a B(a, b)) (upper: (1 - x)^b / (b B(a, b))) reaches y
    mean = a / (a + b)
    if min(a, b) >= NORMAL_FROM:
        spread = math.sqrt(a * b / (a + b + 1.0)) / (a + b)
        x = min(max(mean + statistics.NormalDist().inv_cdf(y) * spread, 0.5 * mean), 0.5 + 0.5 * mean)
    elif low_tail:
        x = min(mean, math.exp((math.log(y) + math.log(a) + log_beta) / a))
    else:
        x = max(mean, -math.expm1((math.log1p(-y) + math.log(b) + log_beta) / b))
    x = x if 0.0 < x < 1.0 else mean  # a tail start that underflowed to an end
    lo, hi = 0.0, 1.0
    for _ in range(MOST_STEPS):
        value = betainc(a, b, x)
        if value == y:
            return x
        lo, hi = (x, hi) if value < y else (lo, x)
        # Newton on the log of the nearer tail, log I_x - log y or log(1 - I_x) - log(1 - y): nearly
        # linear in log x where the tail is a power of x, so steep tails take a few steps too
        try:
            density = math.exp((a - 1.0) * math.log(x) + (b - 1.0) * math.log1p(-x) - log_beta)
            step = x - (math.log(value / y) * value if low_tail else math.log((1.0 - y) / (1.0 - value)) *
                        (1.0 - value)) / density
        except (ValueError, ZeroDivisionError, OverflowError):  # I_x or the density at an extreme: bisect
            step = 0.5 * (lo + hi)
        if abs(step - x) <= NEWTON_WIDTH * x:  # converged (a step within a few units in the last place)
            return step
        x = step if lo < step < hi else 0.5 * (lo + hi)
        if x in (lo, hi):  # the bracket holds no float between its ends
            return x
    return x


#: Steps of ``betaincinv`` at most (a bisection from [0, 1] reaches any float64 root within them),
#: and the relative move of x at which it stops (a few units in the last place).
MOST_STEPS, NEWTON_WIDTH = 1100, 4e-16
#: Both shapes at least this large: ``betaincinv`` starts from the normal approximation.
NORMAL_FROM = 5.0


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
