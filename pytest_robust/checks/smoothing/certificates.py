"""Randomized smoothing in closed form: certificates, sample sizes, budget conversion. Pure math.

The smoothed classifier (Cohen, Rosenfeld & Kolter, ICML 2019). For a base classifier f and
Gaussian noise eps ~ N(0, sigma^2 I),

    g(x) = argmax_c p_c(x),    p_c(x) = P(f(x + eps) = c).

If p_A = p_{c_A}(x) > 1/2, then g(x + delta) = c_A for every ||delta||_2 < sigma Phi^-1(p_A)
(their Theorem 1 with p_B <= 1 - p_A). With the label y known, "certified correct at radius r" is
therefore the single condition p_y(x) > Phi(r / sigma), with no class-selection step.

Units. ``sigma`` and ``radius`` are L2 distances in the space of the tensors the model receives.
For images in [0, 1] pixel space with the normalization inside the model, sigma = 0.25 is a
quarter of the pixel range per coordinate (Cohen's convention). If the data are normalized
outside the model, both sigma and the radius are in normalized units (pixel units / std).

From counts to certificates. k of n draws in the class, one-sided Clopper-Pearson at level alpha:

    p_lower = BetaInv(alpha; k, n - k + 1),     radius = sigma Phi^-1(p_lower)

(abstain when p_lower < 1/2). Since BetaInv(alpha; k, n - k + 1) >= t exactly when
P(Bin(n, t) >= k) <= alpha, "k of n certifies radius r" is a binomial tail comparison, which
gives exact count thresholds (``min_count_to_certify``) and the budget conversion of Sun, Mao,
Mueller & Vechev (ICML 2025, appendix B): the certified accuracy expected under another budget
(n, alpha) from the empirical distribution of p_A (``certified_accuracy_from_pa``).

Phi and Phi^-1 are ``statistics.NormalDist``; the binomial and Beta functions come from ``stats``.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from pytest_robust.errors import SettingError
from pytest_robust.settings import validation
from pytest_robust.stats import SequentialGate, binom_sf, clopper_pearson_lower, clopper_pearson_upper

NORMAL = NormalDist()

#: Fewer than this many draws per input must suffice to certify; larger requests are refused
#: (they would mean a radius many sigmas wide, far beyond any practical certificate).
MAX_DRAWS_TO_CERTIFY = 10**7


def required_pa(radius: float, sigma: float) -> float:
    """Phi(r / sigma): the probability of the true class above which radius r is certified."""
    radius = validation.non_negative_float("radius", radius)
    sigma = validation.positive_float("sigma", sigma)
    return NORMAL.cdf(radius / sigma)


def radius_from_counts(k: int, n: int, alpha: float, sigma: float) -> float:
    """sigma Phi^-1(p_lower) with p_lower the one-sided (1 - alpha) Clopper-Pearson lower bound of
    k successes in n draws; 0.0 when p_lower <= 1/2 (Cohen's CERTIFY abstains below 1/2)."""
    sigma = validation.positive_float("sigma", sigma)
    lower = clopper_pearson_lower(k, n, alpha)
    return sigma * NORMAL.inv_cdf(lower) if lower > 0.5 else 0.0


def _neg_log_required(radius: float, sigma: float) -> float:
    """-ln Phi(r / sigma), accurate also when Phi(r / sigma) is within rounding of 1."""
    tail = NORMAL.cdf(-validation.non_negative_float("radius", radius) / validation.positive_float("sigma", sigma))
    return -math.log1p(-tail)


def min_samples_to_certify(radius: float, sigma: float, alpha: float) -> int:
    """Fewest draws n with which radius r can ever be certified: every draw correct gives
    p_lower = alpha^(1/n), and alpha^(1/n) > Phi(r/sigma) iff n > ln(1/alpha) / (-ln Phi(r/sigma)).

    sigma=0.25, r=0.5, alpha=1e-3 -> 301 (Cohen's default spends n0 + n = 100 100).
    """
    alpha = validation.open_unit("alpha", alpha)
    neg_log = _neg_log_required(radius, sigma)
    need = math.log(1.0 / alpha) / neg_log if neg_log > 0.0 else math.inf
    if need >= MAX_DRAWS_TO_CERTIFY:
        raise SettingError(
            "radius", radius,
            f"a radius certifiable with fewer than {MAX_DRAWS_TO_CERTIFY:.0e} draws at sigma={sigma:g}, "
            f"alpha={alpha:g}: radius/sigma = {radius / sigma:.3g} needs about {need:.3g} draws per input",
        )
    return math.floor(need) + 1


def min_sequential_draws(radius: float, sigma: float, alpha: float, max_draws: int = 100_000) -> int:
    """Fewest draws with which the anytime-valid betting test (``stats.SequentialGate`` with
    horizon ``max_draws``, as used by the certified-accuracy gate) can certify radius r at level
    alpha: the draw at which it rejects H0: p_y <= Phi(r/sigma) when every draw is correct (the
    fastest possible path). Always at least ``min_samples_to_certify``: the price of being allowed
    to stop at any time."""
    min_samples_to_certify(radius, sigma, alpha)  # refuses radii no practical budget certifies
    gate = SequentialGate(required_pa(radius, sigma), alpha, horizon=max_draws)
    while gate.update(np.ones(4096)) is None:
        pass
    return gate.decision.at


def min_count_to_certify(radius: float, sigma: float, n: int, alpha: float) -> int | None:
    """Smallest k such that k of n draws in the true class certify radius r at level alpha, i.e.
    the smallest k with BetaInv(alpha; k, n - k + 1) >= Phi(r/sigma), equivalently with
    P(Bin(n, Phi(r/sigma)) >= k) <= alpha; None when even k = n does not.

    The seed's appendix B example: r=0.5, sigma=1, n=100, alpha=0.01 -> 81 (an observed p_A of 0.81).
    """
    t = required_pa(radius, sigma)
    n = validation.positive_int("n", n)
    alpha = validation.open_unit("alpha", alpha)
    if binom_sf(n, n, t) > alpha:
        return None
    lo, hi = 0, n  # binom_sf(k, n, t) is decreasing in k; invariant: lo fails (or is 0), hi certifies
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if binom_sf(mid, n, t) <= alpha:
            hi = mid
        else:
            lo = mid
    return hi


def certified_accuracy_from_pa(pa, radius: float, sigma: float, n: int, alpha: float) -> float:
    """Expected certified accuracy at radius r under a budget of n draws at level alpha, given each
    input's probability p_A,i of the true class (seed appendix B):

        mean_i P_{k ~ Bin(n, p_A,i)}( CP_lower(k, n, alpha) >= Phi(r/sigma) )
          = mean_i P(Bin(n, p_A,i) >= k*),    k* = min_count_to_certify(r, sigma, n, alpha).

    The p_A,i are treated as exact; estimates from a budget much larger than n (the seed uses
    100 000 draws) make that a good approximation. Ignores Cohen's class-selection step (which
    picks the true class almost surely whenever p_A > 1/2 and n0 is moderate).
    """
    pa = np.asarray(pa, dtype=np.float64).ravel()
    if len(pa) == 0 or not np.all((pa >= 0.0) & (pa <= 1.0)):
        raise ValueError("pa must be a non-empty array of probabilities in [0, 1]")
    k = min_count_to_certify(radius, sigma, n, alpha)
    if k is None:
        return 0.0
    values, weights = np.unique(pa, return_counts=True)
    return float(sum(w * binom_sf(k, n, float(p)) for p, w in zip(values, weights)) / len(pa))


def predict_pvalue(count_a: int, count_b: int) -> float:
    """Two-sided binomial test of H0: p = 1/2 for count_a successes in count_a + count_b trials
    (Cohen's PREDICT tests the top two class counts this way and abstains when p > alpha).

    By symmetry of Bin(N, 1/2) the outcomes at most as likely as count_a are the two tails beyond
    min and max of (count_a, N - count_a): p = min(1, 2 P(Bin(N, 1/2) >= max(count_a, N - count_a))).
    Equals ``scipy.stats.binomtest(count_a, N, 0.5).pvalue``.
    """
    count_a = validation.non_negative_int("count_a", count_a)
    count_b = validation.non_negative_int("count_b", count_b)
    total = count_a + count_b
    if total == 0:
        return 1.0
    return min(1.0, 2.0 * binom_sf(max(count_a, total - count_a), total, 0.5))


def certified_accuracy_bounds(
    certified: int, undecided: int, n_inputs: int, alpha: float, confidence: float
) -> tuple[float, float]:
    """Honest (lower, upper) confidence bounds on certified accuracy from per-input decisions.

    Each input gets a level-alpha test of p_y > Phi(r/sigma): "certified" is wrong with
    probability <= alpha when p_y <= Phi(r/sigma), "not certifiable" is wrong with probability
    <= alpha when p_y >= Phi(r/sigma); the rest are undecided. With C the true certified accuracy,
    D the certified indicator and U the indicator "certified or undecided",
    E[D] <= E[C] + alpha and E[C] <= E[U] + alpha, so with probability >= confidence each,

        lower = CP_lower(certified, n, 1 - confidence) - alpha,
        upper = CP_upper(certified + undecided, n, 1 - confidence) + alpha

    (undecided inputs count as not certified for the lower bound and as possibly certified for
    the upper one), clipped to [0, 1].
    """
    level = 1.0 - validation.open_unit("confidence", confidence)
    lower = clopper_pearson_lower(certified, n_inputs, level) - alpha
    upper = clopper_pearson_upper(certified + undecided, n_inputs, level) + alpha
    return max(0.0, lower), min(1.0, upper)


def fewest_inputs_to_pass(threshold: float, alpha: float, confidence: float) -> int | None:
    """Fewest inputs with which the lower bound of ``certified_accuracy_bounds`` can reach
    ``threshold``: all n certified gives (1 - confidence)^(1/n) - alpha >= threshold iff
    n >= ln(1 - confidence) / ln(threshold + alpha). None when threshold + alpha >= 1."""
    if threshold + alpha >= 1.0:
        return None
    n = math.ceil(math.log(1.0 - confidence) / math.log(threshold + alpha))
    while clopper_pearson_lower(n, n, 1.0 - confidence) - alpha < threshold:  # guard rounding
        n += 1
    return max(n, 1)
