"""pytest_robust.stats: exact binomial bounds against scipy, and the anytime-valid sequential gate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
import scipy.stats

from pytest_robust.stats import (
    BET_CAP,
    Decision,
    SequentialGate,
    betainc,
    betaincinv,
    betting,
    binom_sf,
    clopper_pearson_lower,
    clopper_pearson_upper,
    confidence_sequence,
    rejects_at,
)

# ---------------------------------------------------------------------------------------------
# incomplete beta function and its inverse
# ---------------------------------------------------------------------------------------------

SMALL_AB = [(0.5, 0.5), (1.0, 1.0), (1.0, 3.0), (2.0, 5.0), (5.0, 2.0), (7.5, 0.8), (50.0, 3.0), (30.0, 70.0)]
LARGE_AB = [
    (1e5, 1.0),
    (1.0, 1e5),
    (5e4, 5e4),
    (1e5, 1e5),
    (99_990.0, 11.0),
    (10.0, 99_991.0),
    (3_000.0, 70.0),
]
X_GRID = [0.0, 1e-12, 1e-8, 1e-4, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.9999, 1 - 1e-8, 1.0]


def _tolerance(a: float, b: float) -> float:
    # lgamma of large arguments loses ~ (a + b) log(a + b) * 1e-16 in absolute terms
    return 1e-12 if a + b <= 200 else 1e-8


@pytest.mark.parametrize("a,b", SMALL_AB + LARGE_AB)
def test_betainc_matches_scipy(a, b):
    xs = X_GRID + [a / (a + b), min(1.0, a / (a + b) + 3 * math.sqrt(a * b) / (a + b) ** 1.5)]
    for x in xs:
        assert betainc(a, b, x) == pytest.approx(scipy.special.betainc(a, b, x), rel=0, abs=_tolerance(a, b)), x


def test_betainc_edges_and_symmetry():
    assert betainc(2.0, 3.0, 0.0) == 0.0
    assert betainc(2.0, 3.0, -0.5) == 0.0
    assert betainc(2.0, 3.0, 1.0) == 1.0
    assert betainc(2.0, 3.0, 1.5) == 1.0
    # I_x(1, 1) = x; I_x(a, 1) = x**a; I_x(1, b) = 1 - (1 - x)**b
    for x in (0.1, 0.37, 0.5, 0.93):
        assert betainc(1.0, 1.0, x) == pytest.approx(x, abs=1e-14)
        assert betainc(3.0, 1.0, x) == pytest.approx(x**3, abs=1e-14)
        assert betainc(1.0, 4.0, x) == pytest.approx(1 - (1 - x) ** 4, abs=1e-14)
        # symmetry I_x(a, b) = 1 - I_{1-x}(b, a)
        assert betainc(2.5, 7.0, x) == pytest.approx(1 - betainc(7.0, 2.5, 1 - x), abs=1e-13)


@pytest.mark.parametrize("a,b", SMALL_AB + LARGE_AB)
def test_betaincinv_matches_scipy_beta_ppf(a, b):
    for y in (1e-6, 0.001, 0.025, 0.05, 0.1, 0.5, 0.9, 0.95, 0.975, 0.999):
        ref = scipy.stats.beta.ppf(y, a, b)
        got = betaincinv(a, b, y)
        assert 0.0 <= got <= 1.0
        assert got == pytest.approx(ref, rel=1e-9 if a + b > 200 else 1e-11, abs=1e-300), y
        # and it is an inverse of betainc
        assert betainc(a, b, got) == pytest.approx(y, rel=1e-6 if a + b > 200 else 1e-9)


@pytest.mark.filterwarnings("ignore:Error in function boost:RuntimeWarning")  # scipy's own root finder, at 1e-3
@pytest.mark.parametrize("a, b, y", [(0.5, 3.0, 1e-300), (0.001, 2.0, 1e-10), (3.0, 0.5, 1 - 1e-15),
                                     (0.5, 0.5, 1e-12), (2000.0, 0.3, 0.5), (1e-3, 1e-3, 0.3)])
def test_betaincinv_at_extreme_shapes_and_levels_returns_the_root_or_the_end_it_underflows_to(a, b, y):
    """Where the start or the density under- or overflows, the Newton steps fall back to bisection:
    a root in [0, 1] within scipy's relative 1e-10, or 0 where the root lies below the smallest
    float (scipy clamps it to the smallest normal one), never an exception."""
    got, ref = betaincinv(a, b, y), scipy.stats.beta.ppf(y, a, b)
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(ref, rel=1e-10) or (got == 0.0 and ref <= 2.3e-308)


def test_betaincinv_endpoints():
    assert betaincinv(2.0, 3.0, 0.0) == 0.0  # the ends of the level are the ends of [0, 1]
    top = betaincinv(2.0, 3.0, 1.0)
    assert top == 1.0 and betainc(2.0, 3.0, top) == 1.0
    assert betaincinv(1.0, 1.0, 0.3) == pytest.approx(0.3, abs=1e-15)


# ---------------------------------------------------------------------------------------------
# binomial tail and Clopper–Pearson bounds
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 10, 57, 1000, 100_000])
def test_binom_sf_matches_scipy(n):
    ks = sorted({-3, 0, 1, 2, n // 3, n // 2, n - 1, n, n + 1, n + 10})
    for p in (1e-5, 0.01, 0.3, 0.5, 0.77, 0.99, 1 - 1e-6):
        for k in ks:
            ref = scipy.stats.binom.sf(k - 1, n, p)  # scipy: P(X > k - 1) = P(X >= k)
            tol = 1e-12 if n <= 100 else 1e-8
            assert binom_sf(k, n, p) == pytest.approx(ref, rel=0, abs=tol), (k, p)


def test_binom_sf_edge_values():
    assert binom_sf(0, 5, 0.3) == 1.0
    assert binom_sf(-1, 5, 0.3) == 1.0
    assert binom_sf(6, 5, 0.3) == 0.0
    assert binom_sf(5, 5, 0.3) == pytest.approx(0.3**5, rel=1e-12)
    assert binom_sf(1, 5, 0.3) == pytest.approx(1 - 0.7**5, rel=1e-12)


CP_CASES = [
    (n, k, alpha)
    for n in (1, 2, 3, 10, 100, 1000, 100_000)
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n} & set(range(n + 1)))
    for alpha in (0.001, 0.05, 0.1)
]


@pytest.mark.parametrize("n,k,alpha", CP_CASES)
def test_clopper_pearson_against_scipy_and_closed_forms(n, k, alpha):
    lower = clopper_pearson_lower(k, n, alpha)
    upper = clopper_pearson_upper(k, n, alpha)
    rel = 1e-9 if n > 200 else 1e-11
    if k == 0:
        assert lower == 0.0
        assert upper == pytest.approx(1 - alpha ** (1 / n), rel=rel)
    else:
        assert lower == pytest.approx(scipy.stats.beta.ppf(alpha, k, n - k + 1), rel=rel)
    if k == n:
        assert lower == pytest.approx(alpha ** (1 / n), rel=1e-15)
        assert upper == 1.0
    else:
        assert upper == pytest.approx(scipy.stats.beta.ppf(1 - alpha, k + 1, n - k), rel=rel)
    assert 0.0 <= lower <= k / n <= upper <= 1.0
    if 0 < k < n:
        assert lower < k / n < upper


def test_clopper_pearson_monotone_in_k_and_alpha():
    n = 40
    lowers = [clopper_pearson_lower(k, n, 0.05) for k in range(n + 1)]
    uppers = [clopper_pearson_upper(k, n, 0.05) for k in range(n + 1)]
    assert all(b > a for a, b in zip(lowers, lowers[1:]))
    assert all(b > a for a, b in zip(uppers, uppers[1:]))
    # a smaller alpha (more confidence) widens the bounds
    assert clopper_pearson_lower(30, n, 0.01) < clopper_pearson_lower(30, n, 0.05)
    assert clopper_pearson_upper(30, n, 0.01) > clopper_pearson_upper(30, n, 0.05)


def test_a_clopper_pearson_bound_takes_a_few_evaluations_of_the_incomplete_beta(monkeypatch):
    """``betaincinv``'s safeguarded Newton steps converge in a few evaluations of I_x on the
    bounds the checks compute (n from 512 to 131,072 draws, every 37th count, three levels): at
    most 20 and a median of at most 8, where a bisection to the last bit takes about 30."""
    from pytest_robust.stats import binomial

    calls, plain = [], binomial.betainc
    monkeypatch.setattr(binomial, "betainc", lambda a, b, x: calls.append(x) or plain(a, b, x))
    counts = []
    for n in (512, 4096, 131_072):
        for k in range(1, n, n // 37):
            for alpha in (1e-6, 1e-3, 0.05):
                calls.clear()
                clopper_pearson_lower(k, n, alpha)
                counts.append(len(calls))
    assert max(counts) <= 20 and np.median(counts) <= 8


@pytest.mark.parametrize("n,alpha", [(20, 0.05), (50, 0.1)])
def test_clopper_pearson_exact_coverage(n, alpha):
    """For every p on a grid, P_k(lower(k) <= p) >= 1 - alpha and P_k(upper(k) >= p) >= 1 - alpha, exactly."""
    lowers = np.array([clopper_pearson_lower(k, n, alpha) for k in range(n + 1)])
    uppers = np.array([clopper_pearson_upper(k, n, alpha) for k in range(n + 1)])
    ks = np.arange(n + 1)
    for p in np.linspace(0.005, 0.995, 199):
        pmf = scipy.stats.binom.pmf(ks, n, p)
        assert pmf[lowers <= p].sum() >= 1 - alpha - 1e-12
        assert pmf[uppers >= p].sum() >= 1 - alpha - 1e-12


@pytest.mark.parametrize("fn", [clopper_pearson_lower, clopper_pearson_upper])
@pytest.mark.parametrize(
    "k,n,alpha,word",
    [
        (-1, 10, 0.05, "k="),
        (11, 10, 0.05, "k="),
        (0, 0, 0.05, "n=0"),
        (3, 10, 0.0, "alpha"),
        (3, 10, 1.0, "alpha"),
        (3, 10, -0.1, "alpha"),
        (3, 10, 1.5, "alpha"),
        (3, 10, float("nan"), "alpha"),
    ],
)
def test_clopper_pearson_bad_arguments(fn, k, n, alpha, word):
    with pytest.raises(ValueError, match=word):
        fn(k, n, alpha)


# ---------------------------------------------------------------------------------------------
# the betting process: an independent reference implementation of the documented formula
# ---------------------------------------------------------------------------------------------


def _reference_log_capital(x, m):
    """K_t = prod (1 + lambda_i (x_i - m)), lambda_i = clip((mu_{i-1} - m) / (m (1 - m)), 0, BET_CAP / m)."""
    out, log_k, total = [], 0.0, 0.0
    for i, xi in enumerate(x):
        mu = (0.5 + total) / (i + 1)
        lam = min(max((mu - m) / (m * (1 - m)), 0.0), BET_CAP / m)
        log_k += math.log(1 + lam * (xi - m))
        total += xi
        out.append(log_k)
    return np.array(out)


def _reference_decision(x, threshold, alpha):
    level = math.log(1 / alpha)
    up = _reference_log_capital(x, threshold)
    down = _reference_log_capital([1 - v for v in x], 1 - threshold)
    for i in range(len(x)):
        if up[i] >= level:
            return Decision("pass", i + 1)
        if down[i] >= level:
            return Decision("fail", i + 1)
    return None


def test_advance_matches_reference_formula_across_blocks():
    rng = np.random.default_rng(11)
    x = rng.random(300)  # values in [0, 1], not only Bernoulli
    for m in (0.2, 0.5, 0.9):
        state = betting._Running()
        parts = [betting._advance(x[:1], m, state), betting._advance(x[1:100], m, state),
                 betting._advance(x[100:], m, state)]
        got = np.concatenate(parts)
        np.testing.assert_allclose(got, _reference_log_capital(x, m), rtol=0, atol=1e-10)
        assert state.t == 300 and state.total == pytest.approx(x.sum())


def test_bet_cap_binds_for_long_runs_of_ones():
    """At m = 1/2 the Kelly bet (mu - m) / (m (1 - m)) exceeds the cap 0.9 / m = 1.8 once the plug-in
    mean passes 0.95 (after 10 ones); from then on every 1 multiplies the capital by 1 + 1.8 / 2 = 1.9."""
    assert BET_CAP == 0.9
    log_k = betting._advance(np.ones(30), 0.5, betting._Running())
    steps = np.diff(np.concatenate(([0.0], log_k)))
    mus = (0.5 + np.arange(30)) / (1 + np.arange(30))
    uncapped = np.log1p((mus - 0.5) / 0.25 * 0.5)
    capped = mus > 0.95
    assert capped.sum() == 20 and not capped[:10].any()  # draws 11 to 30
    np.testing.assert_allclose(steps[capped], math.log(1.9), rtol=1e-12)
    np.testing.assert_allclose(steps[~capped], uncapped[~capped], rtol=1e-12)
    # a 0 right after that costs the capped stake: factor 1 - 1.8 / 2 = 0.1
    state = betting._Running()
    betting._advance(np.ones(30), 0.5, state)
    before = state.log_capital
    assert betting._advance(np.zeros(1), 0.5, state)[0] - before == pytest.approx(math.log(0.1), rel=1e-12)


def test_gate_hand_computed_example():
    # all ones, threshold 1/2, alpha 1/4 (level: capital 4):
    # bets 0, 1, 4/3, 3/2 -> capital 1, 1.5, 2.5, 4.375: passes at the 4th draw
    gate = SequentialGate(0.5, 0.25)
    assert gate.update(np.ones(3)) is None
    assert gate.update(np.ones(1)) == Decision("pass", 4)
    # the mirror image fails at the 4th draw
    assert SequentialGate(0.5, 0.25).update(np.zeros(10)) == Decision("fail", 4)


@pytest.mark.parametrize(
    "p,threshold,expected", [(0.99, 0.9, "pass"), (0.75, 0.9, "fail"), (0.75, 0.5, "pass"), (0.25, 0.5, "fail")]
)
def test_gate_far_from_threshold_decides_correctly(p, threshold, expected):
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = (rng.random(20_000) < p).astype(float)
        decision = SequentialGate(threshold, 0.05).update(x)
        assert decision is not None and decision.verdict == expected
        assert 1 <= decision.at <= len(x)
        assert decision == _reference_decision(x[: decision.at].tolist(), threshold, 0.05)


def test_gate_decision_time_is_the_first_crossing():
    rng = np.random.default_rng(2)
    x = (rng.random(5000) < 0.95).astype(float)
    decision = SequentialGate(0.9, 0.05).update(x)
    assert decision is not None
    assert SequentialGate(0.9, 0.05).update(x[: decision.at - 1]) is None
    assert SequentialGate(0.9, 0.05).update(x[: decision.at]) == decision
    assert rejects_at(x, 0.9, 0.05) == decision.at - 1


def test_gate_decision_is_final():
    gate = SequentialGate(0.9, 0.05)
    decision = gate.update(np.ones(500))
    assert decision is not None and decision.verdict == "pass"
    seen = gate.seen
    # overwhelming evidence the other way changes nothing
    assert gate.update(np.zeros(100_000)) is decision
    assert gate.decision is decision
    assert gate.seen == seen


def _feed(x, sizes, threshold=0.9, alpha=0.05):
    gate = SequentialGate(threshold, alpha)
    start = 0
    for size in sizes:
        gate.update(x[start : start + size])
        start += size
    assert start >= len(x)
    return gate


@pytest.mark.parametrize("p,threshold", [(0.95, 0.9), (0.85, 0.9), (0.9, 0.9), (0.55, 0.5)])
def test_gate_decision_does_not_depend_on_block_sizes(p, threshold):
    rng = np.random.default_rng(3)
    x = (rng.random(4000) < p).astype(float)
    random_sizes = rng.integers(0, 300, size=200).tolist()  # includes empty blocks
    results = []
    for sizes in ([1] * len(x), [7] * (len(x) // 7 + 1), [256] * 16, [len(x)], random_sizes + [len(x)]):
        gate = _feed(x, sizes, threshold)
        results.append(gate.decision)
    assert all(r == results[0] for r in results)
    assert results[0] == _reference_decision(x.tolist(), threshold, 0.05)


def test_gate_undecided_stream_counts_everything():
    x = np.tile([1.0, 0.0], 50)  # mean exactly 1/2 vs threshold 1/2: no evidence either way
    gate = _feed(x, [13] * 8, threshold=0.5)
    assert gate.decision is None
    assert gate.seen == 100


@pytest.mark.parametrize(
    "threshold,alpha,word",
    [(0.0, 0.05, "threshold"), (1.0, 0.05, "threshold"), (1.2, 0.05, "threshold"), (0.9, 0.0, "alpha"),
     (0.9, 1.0, "alpha"), (0.9, -1, "alpha")],
)
def test_gate_bad_arguments(threshold, alpha, word):
    with pytest.raises(ValueError, match=word):
        SequentialGate(threshold, alpha)


def test_rejects_at_edges():
    x = np.ones(10)
    assert rejects_at(x, 0.0, 0.05) == 0
    assert rejects_at(np.empty(0), 0.0, 0.05) is None
    assert rejects_at(x, 1.0, 0.05) is None


# ---------------------------------------------------------------------------------------------
# confidence sequence
# ---------------------------------------------------------------------------------------------


def test_confidence_sequence_simple_cases():
    assert confidence_sequence(np.empty(0), 0.05) == (0.0, 1.0)
    lower, upper = confidence_sequence(np.ones(2000), 0.05)
    assert upper == 1.0 and 0.99 < lower < 1.0
    lower, upper = confidence_sequence(np.zeros(2000), 0.05)
    assert lower == 0.0 and 0.0 < upper < 0.01
    # a single 1 already rejects E[X] <= m for m <= alpha / 2: the first bet uses the prior mean 1/2,
    # lambda = (1/2 - m) / (m (1 - m)), so K_1 = 1/(2m) >= 1/alpha (valid: P(X_1 = 1) <= m under H0)
    lower, upper = confidence_sequence(np.ones(1), 0.05)
    assert upper == 1.0 and lower == pytest.approx(0.025, abs=1e-6)
    lower, upper = confidence_sequence(np.zeros(1), 0.05)
    assert lower == 0.0 and upper == pytest.approx(0.975, abs=1e-6)


def test_confidence_sequence_narrows_with_data_and_widens_with_confidence():
    rng = np.random.default_rng(4)
    x = (rng.random(4000) < 0.7).astype(float)
    widths = [np.subtract(*confidence_sequence(x[:n], 0.05)[::-1]) for n in (250, 1000, 4000)]
    assert widths[0] > widths[1] > widths[2] > 0
    lo05, up05 = confidence_sequence(x, 0.05)
    lo01, up01 = confidence_sequence(x, 0.01)
    assert lo01 <= lo05 < 0.7 < up05 <= up01
    # wider than the fixed-n Clopper–Pearson interval (the price of anytime validity)
    k = int(x.sum())
    assert lo05 < clopper_pearson_lower(k, len(x), 0.05)
    assert up05 > clopper_pearson_upper(k, len(x), 0.05)


@pytest.mark.parametrize("p,alpha", [(0.3, 0.05), (0.9, 0.1)])
def test_confidence_sequence_coverage(p, alpha):
    rng = np.random.default_rng(5)
    reps, n = 300, 1000
    lower_ok = upper_ok = crossed = 0
    for _ in range(reps):
        x = (rng.random(n) < p).astype(float)
        lower, upper = confidence_sequence(x, alpha)
        assert 0.0 <= lower <= 1.0 and 0.0 <= upper <= 1.0
        lower_ok += lower <= p
        upper_ok += upper >= p
        # The two one-sided bounds are running intersections and may cross (lower > upper); that
        # can only happen when one of them misses p, so it is rare but not impossible.
        if lower > upper:
            crossed += 1
            assert lower > p or upper < p
    se = math.sqrt(alpha * (1 - alpha) / reps)
    assert lower_ok / reps >= 1 - alpha - 3 * se
    assert upper_ok / reps >= 1 - alpha - 3 * se
    assert crossed / reps <= 2 * alpha


def test_confidence_sequence_consistent_with_gate():
    """When the gate decides at threshold t after `at` draws, the confidence sequence on those draws
    excludes t on the same side, up to the bisection tolerance tol=1e-6; one draw earlier it does not."""
    tol = 1e-6
    rng = np.random.default_rng(6)
    decided = {"pass": 0, "fail": 0}
    for _ in range(60):
        for threshold, p in ((0.9, 0.93), (0.9, 0.87), (0.5, 0.56), (0.5, 0.44)):
            x = (rng.random(8000) < p).astype(float)
            decision = SequentialGate(threshold, 0.05).update(x)
            if decision is None:
                continue
            decided[decision.verdict] += 1
            lower, upper = confidence_sequence(x[: decision.at], 0.05)
            before_lower, before_upper = confidence_sequence(x[: decision.at - 1], 0.05)
            if decision.verdict == "pass":
                assert lower >= threshold - tol
                assert before_lower <= threshold
            else:
                assert upper <= threshold + tol
                assert before_upper >= threshold
    assert decided["pass"] > 50 and decided["fail"] > 50


# ---------------------------------------------------------------------------------------------
# calibration by simulation
# ---------------------------------------------------------------------------------------------


def test_mixture_capital_is_the_weighted_sum_of_constant_bet_capitals():
    """log W_t = log sum_j w_j prod_i (1 + lambda_j (x_i - m)), fed in any blocks; the grid runs from
    the smallest gap the horizon resolves to 1 - m, the bold bet first; and an all-ones stream is
    rejected within log(1 / (W_BOLD alpha)) / log(1 + BOLD (1 - m) / m) draws (the bold bet alone
    gets there), a few draws above the fixed-size minimum log(1 / alpha) / log(1 / m)."""
    x = (np.random.default_rng(3).random(500) < 0.95).astype(float)
    m, alpha, horizon = 0.9, 0.05, 10_000
    bets, log_w = betting.mixture_bets(m, alpha, horizon)
    assert bets[0] == betting.BOLD / m and math.exp(log_w[0]) == pytest.approx(betting.W_BOLD)
    assert np.exp(log_w).sum() == pytest.approx(1.0)
    gaps = bets[1:] * m * (1 - m)
    assert gaps[0] == pytest.approx(math.sqrt(2 * math.log(1 / alpha) * m * (1 - m) / horizon))
    assert np.all(bets[1:] <= betting.BET_CAP / m) and np.all(np.diff(bets[1:]) >= 0)
    direct = np.log(sum(np.exp(w + np.cumsum(np.log(1 + b * (x - m)))) for b, w in zip(bets, log_w)))
    process = betting._Mixture(m, alpha, horizon)
    fed = np.concatenate([process.advance(x[:1]), process.advance(x[1:200]), process.advance(x[200:])])
    np.testing.assert_allclose(fed, direct, rtol=1e-10)
    m, alpha = 0.977, 1e-3
    at = SequentialGate(m, alpha, horizon=100_000).update(np.ones(1000)).at
    fixed = math.ceil(math.log(1 / alpha) / -math.log(m))
    assert fixed < at <= math.ceil(math.log(1 / (betting.W_BOLD * alpha)) / math.log(1 + betting.BOLD * (1 - m) / m))
    assert at < SequentialGate(m, alpha).update(np.ones(1000)).at


def _gate_rates(p, threshold, alpha, reps, cap, seed, mixture=False):
    """Rates of pass / fail / undecided over ``reps`` Bernoulli(p) streams of ``cap`` draws, for the
    plug-in test or (``mixture``) the mixture test with horizon ``cap``."""
    rng = np.random.default_rng(seed)
    counts = {"pass": 0, "fail": 0, None: 0}
    for _ in range(reps):
        x = (rng.random(cap) < p).astype(np.float64)
        decision = SequentialGate(threshold, alpha, horizon=cap if mixture else None).update(x)
        counts[decision.verdict if decision else None] += 1
    return {k: v / reps for k, v in counts.items()}


@pytest.mark.parametrize("mixture", [False, True])
@pytest.mark.parametrize("threshold", [0.977, 0.9, 0.5])
@pytest.mark.parametrize("alpha", [0.05, 0.1])
def test_false_pass_rate_at_threshold(threshold, alpha, mixture):
    """At the threshold both nulls hold; near 1 (0.977 = Phi(2), the smoothing gate's r/sigma = 2)
    the mixture's bold half is most exposed: a run of all-correct draws is likely there."""
    reps = 1000
    rates = _gate_rates(threshold, threshold, alpha, reps, cap=3000, seed=7, mixture=mixture)
    se = math.sqrt(alpha * (1 - alpha) / reps)
    assert rates["pass"] <= alpha + 3 * se
    assert rates["fail"] <= alpha + 3 * se  # the true mean also sits on the fail test's null


@pytest.mark.parametrize("mixture", [False, True])
@pytest.mark.parametrize("threshold,delta", [(0.9, 0.02), (0.5, 0.03)])
@pytest.mark.parametrize("alpha", [0.05, 0.1])
def test_false_fail_rate_just_above_threshold(threshold, delta, alpha, mixture):
    reps = 1000
    rates = _gate_rates(threshold + delta, threshold, alpha, reps, cap=3000, seed=8, mixture=mixture)
    se = math.sqrt(alpha * (1 - alpha) / reps)
    assert rates["fail"] <= alpha + 3 * se
    # and the gate is not useless: it proves the requirement most of the time
    assert rates["pass"] > 0.5


@pytest.mark.parametrize("mixture", [False, True])
def test_false_pass_rate_just_below_threshold(mixture):
    reps, alpha = 1000, 0.05
    rates = _gate_rates(0.88, 0.9, alpha, reps, cap=3000, seed=9, mixture=mixture)
    se = math.sqrt(alpha * (1 - alpha) / reps)
    assert rates["pass"] <= alpha + 3 * se
    assert rates["fail"] > 0.5


@pytest.mark.parametrize("p,alpha", [(0.9, 0.05), (0.5, 0.1)])
def test_anytime_lower_bound_coverage_over_the_whole_path(p, alpha):
    """The running lower bound stays below p at *every* time with probability >= 1 - alpha:
    equivalently, the betting test of E[X] <= p never rejects on the whole path."""
    rng = np.random.default_rng(10)
    reps, n = 1000, 2000
    covered = 0
    for _ in range(reps):
        x = (rng.random(n) < p).astype(float)
        covered += rejects_at(x, p, alpha) is None
    se = math.sqrt(alpha * (1 - alpha) / reps)
    assert covered / reps >= 1 - alpha - 3 * se


def test_running_sum_is_numpys_cumsum_exactly():
    """``running_sum`` (torch's cumsum on NumPy memory) gives np.cumsum's sequential float64 sums
    bit for bit along the last axis: 1-D and 2-D, in place, on strided (also reversed) and read-only input, and
    on no elements; so the betting tests' numbers do not depend on which library summed them."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 50_001)) * 10.0 ** rng.integers(-8, 8, (3, 50_001))
    running_sum = betting.running_sum
    assert np.array_equal(running_sum(x[0]), np.cumsum(x[0]))
    assert np.array_equal(running_sum(x), np.cumsum(x, axis=-1))
    assert np.array_equal(running_sum(x[:, ::3]), np.cumsum(x[:, ::3], axis=-1))
    assert np.array_equal(running_sum(x[:, ::-2]), np.cumsum(x[:, ::-2], axis=-1))  # negative strides
    frozen = x[1].copy()
    frozen.flags.writeable = False
    assert np.array_equal(running_sum(frozen), np.cumsum(frozen))
    same = x.copy()
    assert running_sum(same, out=same) is same and np.array_equal(same, np.cumsum(x, axis=-1))
    assert running_sum(np.array([True, False, True])).tolist() == [1.0, 1.0, 2.0]
    assert running_sum(np.empty((2, 0))).shape == (2, 0)
