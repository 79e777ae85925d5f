"""Randomized smoothing against closed forms, reference implementations and simulation.

The workhorse is a half-space classifier on 1-D inputs: ``ThresholdModel(0.0)`` predicts class 1
iff x' < 0, so under x' = x + sigma * eps the probability of class 1 is exactly
p = Phi(-x / sigma). An input x = -sigma * Phi^-1(p) therefore has p_y = p for the label 1, the
case in which Cohen's bound is tight. ``scipy`` serves as the reference (a test dependency only).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch
from scipy.stats import beta, binom, binomtest, norm
from toy_models import RecordingModel, ThresholdModel

from pytest_robust.checks.smoothing import certificates as smoothing
from pytest_robust.checks.smoothing.check import certified_accuracy
from pytest_robust.checks.smoothing.cohen import ABSTAIN, certify, predict
from pytest_robust.checks.smoothing.draws import CHECK_EVERY
from pytest_robust.checks.smoothing.pa_report import ACR_WARNING, pa_report
from pytest_robust.engine.host_syncs import count_host_syncs
from pytest_robust.errors import RobustDataError, SettingError
from pytest_robust.stats import clopper_pearson_lower, clopper_pearson_upper

PHI = NormalDist()
HALF_SPACE = ThresholdModel(0.0)


def inputs_with_pa(pa, sigma: float):
    """1-D inputs on which HALF_SPACE is right (label 1) with probability exactly pa[i] under noise sigma."""
    x = torch.tensor([[-sigma * PHI.inv_cdf(p)] for p in pa], dtype=torch.float32)
    return x, torch.ones(len(pa), dtype=torch.long)


class ConstantClassifier(torch.nn.Module):
    """Always predicts class ``cls`` of ``n_classes`` (the trivial classifier of the seed's Theorem 1)."""

    def __init__(self, cls: int = 0, n_classes: int = 3):
        super().__init__()
        self.logits = torch.nn.Parameter(2.0 * torch.nn.functional.one_hot(torch.tensor(cls), n_classes).float())

    def forward(self, x):
        return self.logits.expand(len(x), -1).clone()


# ----------------------------------------------------------------------------------------------
# Closed forms
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k, n, alpha", [(81, 100, 0.01), (5, 20, 0.05), (99_000, 100_000, 0.001), (1, 7, 0.2)])
def test_clopper_pearson_and_radius_match_scipy(k, n, alpha):
    lower = beta.ppf(alpha, k, n - k + 1)
    assert clopper_pearson_lower(k, n, alpha) == pytest.approx(lower, abs=1e-12)
    expected = 0.5 * norm.ppf(lower) if lower > 0.5 else 0.0
    assert smoothing.radius_from_counts(k, n, alpha, 0.5) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("n, alpha, sigma", [(100, 0.001, 0.25), (100_000, 0.001, 1.0), (50, 0.01, 0.5)])
def test_all_correct_draws_give_the_closed_form_radius(n, alpha, sigma):
    """k = n: p_lower = alpha^(1/n), radius = sigma Phi^-1(alpha^(1/n)) (3.8 sigma at Cohen's budget)."""
    assert clopper_pearson_lower(n, n, alpha) == alpha ** (1 / n)
    assert smoothing.radius_from_counts(n, n, alpha, sigma) == pytest.approx(sigma * PHI.inv_cdf(alpha ** (1 / n)))
    assert smoothing.radius_from_counts(0, n, alpha, sigma) == 0.0


def test_seed_appendix_b_example_boundary_is_81_of_100():
    """r=0.5, sigma=1, n=100, alpha=0.01 needs an observed p_A of 0.81: 81 certifies, 80 does not."""
    assert smoothing.min_count_to_certify(0.5, 1.0, 100, 0.01) == 81
    assert smoothing.radius_from_counts(81, 100, 0.01, 1.0) >= 0.5 > smoothing.radius_from_counts(80, 100, 0.01, 1.0)
    assert beta.ppf(0.01, 81, 20) >= norm.cdf(0.5) > beta.ppf(0.01, 80, 21)


def test_min_count_to_certify_is_none_when_n_is_too_small():
    assert smoothing.min_count_to_certify(0.5, 0.25, 300, 0.001) is None
    assert smoothing.min_count_to_certify(0.5, 0.25, 301, 0.001) == 301


def test_min_samples_to_certify_301_and_its_boundary():
    n = smoothing.min_samples_to_certify(0.5, 0.25, 1e-3)
    assert n == 301
    assert n == math.floor(math.log(1e3) / -math.log(norm.cdf(2.0))) + 1
    assert smoothing.radius_from_counts(n, n, 1e-3, 0.25) >= 0.5
    assert smoothing.radius_from_counts(n - 1, n - 1, 1e-3, 0.25) < 0.5


@pytest.mark.parametrize("radius, sigma, alpha", [(0.0, 0.25, 1e-3), (1.0, 0.5, 1e-3), (0.25, 0.25, 0.01)])
def test_min_samples_boundary_elsewhere(radius, sigma, alpha):
    n = smoothing.min_samples_to_certify(radius, sigma, alpha)
    need = norm.cdf(radius / sigma)
    assert alpha ** (1 / n) > need >= alpha ** (1 / (n - 1))


def test_sequential_minimum_is_where_an_always_right_model_is_certified():
    """The mixture betting test needs a few more all-correct draws than a fixed-size test (343 vs 301
    here, within 1.15x), and the gate certifies an always-right input at exactly that draw, with
    no evaluation wasted (its chunks end there)."""
    fewest = smoothing.min_sequential_draws(0.5, 0.25, 1e-3)
    fixed = smoothing.min_samples_to_certify(0.5, 0.25, 1e-3)
    assert fixed < fewest <= 1.15 * fixed
    r = certified_accuracy(ConstantClassifier(1, 2), (torch.zeros(3, 1), torch.ones(3, dtype=torch.long)),
                           threshold=None, radius=0.5, sigma=0.25)
    assert r.details["per_input"]["draws"] == [fewest] * 3
    assert r.details["per_input"]["evaluations"] == [fewest] * 3
    assert r.details["min_draws_to_certify"] == fewest


@pytest.mark.parametrize("count_a, count_b", [(0, 0), (1, 0), (5, 5), (6, 4), (10, 0), (60, 40), (512, 488),
                                              (700, 300), (3, 97), (9_990, 10), (50_123, 49_877)])
def test_predict_pvalue_matches_scipy_binomtest(count_a, count_b):
    expected = 1.0 if count_a + count_b == 0 else binomtest(count_a, count_a + count_b, 0.5).pvalue
    assert smoothing.predict_pvalue(count_a, count_b) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_certified_accuracy_from_pa_matches_monte_carlo():
    """Seed appendix B: mean_i P_{k ~ Bin(n, pA_i)}(CP_lower(k, n, alpha) >= Phi(r/sigma)), simulated."""
    pa = np.array([0.55, 0.7, 0.8, 0.83, 0.9, 0.97, 1.0, 0.3])
    n, alpha, radius, sigma = 100, 0.01, 0.5, 1.0
    rng = np.random.default_rng(0)
    k = rng.binomial(n, pa, size=(20_000, len(pa)))
    certified = beta.ppf(alpha, np.maximum(k, 1), n - k + 1) >= norm.cdf(radius / sigma)
    certified &= k > 0
    simulated = certified.mean()
    se = certified.mean(axis=1).std() / math.sqrt(len(k))
    exact = smoothing.certified_accuracy_from_pa(pa, radius, sigma, n, alpha)
    assert abs(exact - simulated) < 4 * se
    # closed form for an input with the same p_A everywhere: a binomial tail at the seed's 81
    assert smoothing.certified_accuracy_from_pa([0.85], radius, sigma, n, alpha) == pytest.approx(binom.sf(80, n, 0.85))
    assert smoothing.certified_accuracy_from_pa(pa, 5.0, sigma, n, alpha) == 0.0


def test_dataset_bounds_formula():
    lower, upper = smoothing.certified_accuracy_bounds(30, 5, 50, 0.001, 0.95)
    assert lower == pytest.approx(clopper_pearson_lower(30, 50, 0.05) - 0.001)
    assert upper == pytest.approx(clopper_pearson_upper(35, 50, 0.05) + 0.001)
    assert smoothing.certified_accuracy_bounds(0, 0, 10, 0.01, 0.95)[0] == 0.0
    assert smoothing.certified_accuracy_bounds(10, 0, 10, 0.01, 0.95)[1] == 1.0


def test_dataset_bounds_cover_the_true_certified_accuracy():
    """Finite test set with a true certified fraction of 0.6 and per-input decisions at their
    worst allowed error rates (false certification and false refutation both exactly alpha):
    each bound covers the truth with probability >= confidence."""
    rng = np.random.default_rng(1)
    n, alpha, confidence, reps = 40, 0.05, 0.9, 3000
    certifiable = np.arange(n) < 24
    u = rng.random((reps, n))
    # certifiable inputs: refuted w.p. alpha, else certified; the others: certified w.p. alpha, else undecided
    certified = np.where(certifiable, u >= alpha, u < alpha)
    undecided = ~certifiable & ~certified
    outcomes = list(zip(certified.sum(1).tolist(), undecided.sum(1).tolist()))
    bounds = {o: smoothing.certified_accuracy_bounds(*o, n, alpha, confidence) for o in set(outcomes)}
    lowers, uppers = zip(*(bounds[o] for o in outcomes))
    slack = 3 * math.sqrt(confidence * (1 - confidence) / reps)
    assert np.mean(np.array(lowers) <= 0.6) >= confidence - slack
    # the upper bound is tested where undecided inputs make it bite: all non-certifiable undecided
    assert np.mean(np.array(uppers) >= 0.6) >= confidence - slack


# ----------------------------------------------------------------------------------------------
# CERTIFY and PREDICT
# ----------------------------------------------------------------------------------------------


def test_constant_classifier_certifies_its_class_at_the_budget_radius():
    """The seed's Theorem 1: a constant classifier gets radius sigma Phi^-1(alpha^(1/n)) everywhere
    (it never abstains); it is right, hence certified, only on its own class, and its ACR grows
    without bound with n while its certified accuracy stays the class frequency."""
    x = torch.rand(12, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2] * 4)
    sigma, alpha = 0.5, 1e-3
    for n in (100, 1000):
        c = certify(ConstantClassifier(0), (x, y), sigma, n0=10, n=n, alpha=alpha)
        radius = sigma * PHI.inv_cdf(alpha ** (1 / n))
        assert np.all(c.prediction == 0)
        assert np.allclose(c.radius, radius)
        assert list(c.correct) == [label == 0 for label in y.tolist()]
        assert c.certified_accuracy(radius) == pytest.approx(1 / 3)
        assert c.certified_accuracy(radius + 1e-6) == 0.0
        assert np.all(c.draws == 10 + n)
    small = pa_report(ConstantClassifier(0), (x, y), sigma, n=100, alpha=alpha)
    large = pa_report(ConstantClassifier(0), (x, y), sigma, n=1000, alpha=alpha)
    assert large.details["acr"] > small.details["acr"] > 0
    assert large.details["acr_warning"] == ACR_WARNING
    gate = certified_accuracy(ConstantClassifier(0), (x, y), threshold=None, radius=1.0, sigma=sigma)
    assert gate.details["per_input"]["outcome"] == ["certified" if v == 0 else "not certifiable" for v in y.tolist()]


def test_certify_on_known_probabilities():
    sigma = 0.25
    pa = [0.2, 0.6, 0.9, 0.999]
    c = certify(HALF_SPACE, inputs_with_pa(pa, sigma), sigma, n=4000, alpha=0.001)
    assert list(c.prediction) == [0, 1, 1, 1]  # class 0 wins where p_1 = 0.2
    assert list(c.correct) == [False, True, True, True]
    p = np.array(pa[1:])
    assert np.all(np.abs(c.pa_estimate[1:] - p) < 4 * np.sqrt(p * (1 - p) / 4000) + 1e-3)
    assert np.all(c.pa_lower <= c.pa_estimate)
    assert np.all(np.diff(c.radius[1:]) > 0)
    assert c.certified_accuracy(0.0) == 0.75
    assert c.certified_accuracy(0.5) == 0.25  # needs p_1 > Phi(2) = 0.977: only 0.999


def test_certify_abstains_at_a_coin_flip_and_counts_do_not_depend_on_batch_size():
    sigma = 0.25
    data = inputs_with_pa([0.5, 0.95, 0.99], sigma)
    results = [certify(HALF_SPACE, data, sigma, n0=20, n=500, batch_size=b) for b in (7, 1000)]
    a, b = results
    assert a.prediction[0] == ABSTAIN and a.radius[0] == 0.0 and not a.correct[0]
    assert np.array_equal(a.count, b.count) and np.array_equal(a.prediction, b.prediction)
    assert a.forward_passes == b.forward_passes == 3 * 520


def test_fixed_size_draws_are_packed_into_full_batches_across_inputs():
    recorder = RecordingModel(HALF_SPACE)
    certify(recorder, inputs_with_pa([0.9, 0.95, 0.99], 0.25), 0.25, n0=30, n=1000, batch_size=256)
    assert recorder.batch_sizes == [256] * 12 + [3 * 1030 - 12 * 256]


def test_predict_abstains_on_ties_and_returns_the_majority_elsewhere():
    sigma = 0.25
    p = predict(HALF_SPACE, inputs_with_pa([0.5, 0.9, 0.05], sigma), sigma, n=2000, alpha=0.001)
    assert list(p.prediction) == [ABSTAIN, 1, 0]
    assert list(p.correct) == [False, True, False]
    assert p.top_count[1] + p.runner_up_count[1] == 2000
    assert p.p_value[0] > 0.001 > max(p.p_value[1:])
    assert p.p_value[1] == smoothing.predict_pvalue(int(p.top_count[1]), int(p.runner_up_count[1]))


def test_labels_out_of_range_are_an_error():
    with pytest.raises(RobustDataError, match="label 5 is out of range"):
        certify(HALF_SPACE, (torch.zeros(2, 1), torch.tensor([0, 5])), 0.25, n0=5, n=10)


# ----------------------------------------------------------------------------------------------
# The gate
# ----------------------------------------------------------------------------------------------


def test_per_input_test_is_calibrated_at_the_boundary():
    """p_y exactly Phi(r/sigma): neither "certified" nor "not certifiable" may come out more often
    than alpha (here 0.05 so that it is testable with 300 inputs)."""
    sigma, radius, alpha, n = 0.5, 0.25, 0.05, 300
    data = inputs_with_pa([PHI.cdf(radius / sigma)] * n, sigma)
    r = certified_accuracy(HALF_SPACE, data, threshold=None, radius=radius, sigma=sigma, alpha=alpha, max_draws=600,
                           budget=10**6)
    decisions = r.details["per_input"]["outcome"]
    limit = binom.ppf(0.999, n, alpha)
    assert decisions.count("certified") <= limit
    assert decisions.count("not certifiable") <= limit
    assert r.details["undecided_at_max_draws"] == decisions.count("undecided")


def test_gate_decisions_on_known_probabilities():
    """Inputs far above and far below Phi(r/sigma) = 0.977 are decided correctly and early."""
    sigma, radius = 0.25, 0.5
    pa = [0.999] * 6 + [0.3, 0.6, 0.9, 0.95]
    r = certified_accuracy(HALF_SPACE, inputs_with_pa(pa, sigma), threshold=None, radius=radius, sigma=sigma,
                           budget=10**6)
    assert r.details["per_input"]["outcome"] == ["certified"] * 6 + ["not certifiable"] * 4
    assert r.estimate == 0.6 and r.verdict == "estimate"
    assert r.draws == sum(r.details["per_input"]["draws"]) <= r.forward_passes
    assert max(r.details["per_input"]["draws"][6:9]) < 300  # hopeless inputs stop quickly (p=0.9: 126 on average)
    assert r.lower == pytest.approx(clopper_pearson_lower(6, 10, 0.05) - 0.001)
    assert r.perturbation == "Gaussian smoothing sigma=0.25, L2 radius 0.5, alpha=0.001"
    assert r.details["required_pa"] == pytest.approx(norm.cdf(2.0))


@pytest.mark.parametrize("threshold, verdict", [(0.5, "pass"), (0.97, None), (0.99, None)])
def test_gate_verdicts(threshold, verdict):
    """60 inputs: 48 certifiable with a wide margin, 12 hopeless (true certified accuracy 0.8)."""
    sigma = 0.25
    data = inputs_with_pa([0.9995] * 48 + [0.5] * 12, sigma)
    if verdict is None:  # 0.97 and 0.99 cannot pass with 60 inputs at all; 0.9 is a plain fail
        with pytest.raises(SettingError, match="use at least"):
            certified_accuracy(HALF_SPACE, data, threshold=threshold, radius=0.5, sigma=sigma, budget=10**6)
        return
    r = certified_accuracy(HALF_SPACE, data, threshold=threshold, radius=0.5, sigma=sigma, budget=10**6)
    full = certified_accuracy(HALF_SPACE, data, threshold=None, radius=0.5, sigma=sigma, budget=10**6)
    assert r.verdict == verdict and full.estimate == 0.8
    assert "48 of 60 inputs certified, 12 proven not certifiable" in full.message()
    assert r.details["settled_early"] and r.estimate <= 0.8 and "a lower estimate" in r.message()


def test_gate_stops_once_the_bounds_over_inputs_decide_and_stays_within_the_full_runs_bounds():
    """48 easy inputs, 12 hopeless ones and 4 just above Phi(2) that no test decides within 20 000
    draws: with a threshold the gate stops after the round whose bounds decide, long before the
    hard inputs spend their draws; the full run (no threshold) decides every input it can."""
    sigma = 0.25
    data = inputs_with_pa([0.9995] * 48 + [0.5] * 12 + [0.978] * 4, sigma)
    kw = dict(radius=0.5, sigma=sigma, max_draws=20_000, budget=10**7)
    full = certified_accuracy(HALF_SPACE, data, threshold=None, **kw)
    for threshold, verdict in ((0.5, "pass"), (0.9, "fail")):
        r = certified_accuracy(HALF_SPACE, data, threshold=threshold, **kw)
        assert r.verdict == verdict and r.details["settled_early"]
        assert r.forward_passes < full.forward_passes / 4
        assert r.lower <= full.lower and r.upper >= full.upper
        decided = [d for d in r.details["per_input"]["outcome"] if d != "undecided"]
        assert decided == [d for d, mine in zip(full.details["per_input"]["outcome"],
                                                r.details["per_input"]["outcome"]) if mine != "undecided"]
        assert "left open once the bounds over inputs decided the check" in r.note
    assert full.details["undecided_at_max_draws"] == 4 and not full.details["settled_early"]


def test_gate_fails_and_is_inconclusive_when_it_should():
    sigma = 0.25
    data = inputs_with_pa([0.9995] * 48 + [0.5] * 12, sigma)
    fail = certified_accuracy(HALF_SPACE, data, threshold=0.9, radius=0.5, sigma=sigma, budget=10**6)
    assert fail.verdict == "fail" and fail.upper < 0.9
    assert "< required 0.9 under Gaussian smoothing sigma=0.25, L2 radius 0.5, alpha=0.001" in fail.message()
    close = certified_accuracy(HALF_SPACE, data, threshold=0.8, radius=0.5, sigma=sigma, budget=10**6)
    assert close.verdict == "inconclusive"
    assert "every input was decided and the bounds still straddle the threshold: only more inputs" in close.message()


def test_undecided_inputs_count_as_not_certified_and_are_reported():
    """p_y = 0.98, just above 0.977, cannot be decided within 1000 draws."""
    sigma = 0.25
    data = inputs_with_pa([0.9995] * 5 + [0.98] * 3, sigma)
    r = certified_accuracy(HALF_SPACE, data, threshold=None, radius=0.5, sigma=sigma, max_draws=1000, budget=10**6)
    assert r.details["per_input"]["outcome"] == ["certified"] * 5 + ["undecided"] * 3
    assert r.estimate == 5 / 8
    assert r.upper == pytest.approx(min(1.0, clopper_pearson_upper(8, 8, 0.05) + 0.001))
    assert "3 undecided and counted as not certified (3 reached max_draws=1000" in r.note


def test_budget_is_shared_in_rounds_and_never_exceeded():
    """A total budget smaller than n * max_draws: inputs decided early leave draws to the others."""
    sigma = 0.25
    data = inputs_with_pa([0.9995] * 10 + [0.3] * 10 + [0.98] * 4, sigma)
    r = certified_accuracy(HALF_SPACE, data, threshold=None, radius=0.5, sigma=sigma, max_draws=100_000, budget=30_000)
    assert r.draws <= 30_000
    assert r.details["rounds"] > 1
    assert r.details["per_input"]["outcome"][:20] == ["certified"] * 10 + ["not certifiable"] * 10
    assert r.details["undecided"] == 4 and r.details["undecided_at_max_draws"] == 0
    assert max(r.details["per_input"]["draws"][20:]) > 30_000 // 24  # more than an equal share
    assert "stopped by the budget of 30000 model evaluations" in r.note
    assert r.forward_passes <= 30_000


def test_per_input_decisions_do_not_depend_on_batch_size():
    sigma = 0.25
    data = inputs_with_pa([0.999, 0.5, 0.99, 0.96, 0.9999, 0.985, 0.7, 0.995], sigma)
    runs = [
        certified_accuracy(HALF_SPACE, data, threshold=None, radius=0.5, sigma=sigma, max_draws=3000, budget=12_000,
                           batch_size=b, seed=3)
        for b in (7, 64, 1000)
    ]
    assert runs[0].details["per_input"] == runs[1].details["per_input"] == runs[2].details["per_input"]
    assert runs[0].details["rounds"] == runs[2].details["rounds"]
    other_seed = certified_accuracy(HALF_SPACE, data, threshold=None, radius=0.5, sigma=sigma, max_draws=3000,
                                    budget=12_000, seed=4)
    assert other_seed.details["per_input"]["draws"] != runs[0].details["per_input"]["draws"]


def test_gate_restores_the_global_rng():
    state = torch.get_rng_state()
    certified_accuracy(HALF_SPACE, inputs_with_pa([0.999], 0.25), threshold=None, radius=0.5, sigma=0.25)
    assert torch.equal(state, torch.get_rng_state())


# ----------------------------------------------------------------------------------------------
# The pA report
# ----------------------------------------------------------------------------------------------


def test_pa_report_survival_curve_and_certified_accuracy():
    sigma, n = 0.25, 2000
    pa = [0.4, 0.7, 0.9, 0.99, 0.9999, 0.9999]
    r = pa_report(HALF_SPACE, inputs_with_pa(pa, sigma), sigma, n=n, radii=[0.0, 0.25, 0.5])
    d = r.details
    assert r.metric == "pa_report" and r.verdict == "estimate" and r.threshold is None
    assert r.draws == r.forward_passes == n * len(pa)
    assert np.allclose(d["pa"], np.array(d["correct_counts"]) / n)
    assert np.all(np.abs(np.array(d["pa"]) - pa) < 4 * np.sqrt(np.array(pa) * (1 - np.array(pa)) / n) + 1e-3)
    grid, fraction = d["pa_survival"]["p"], d["pa_survival"]["fraction"]
    assert grid[0] == 0.5 and grid[-1] == 1.0 and all(a >= b for a, b in zip(fraction, fraction[1:]))
    assert fraction[0] == pytest.approx(5 / 6)
    for p, f in zip(grid, fraction):
        assert f == np.mean(np.array(d["pa"]) >= p)
    measured = d["certified_accuracy"][f"measured at n={n}, alpha=0.001"]
    for radius, value in zip([0.0, 0.25, 0.5], measured):
        k = smoothing.min_count_to_certify(radius, sigma, n, 0.001)
        assert value == np.mean(np.array(d["correct_counts"]) >= k)
    assert measured == [5 / 6, 4 / 6, 3 / 6]
    edge = d["certified_accuracy"]["expected at n=100, alpha=0.01"]
    assert edge == [smoothing.certified_accuracy_from_pa(d["pa"], r_, sigma, 100, 0.01) for r_ in [0.0, 0.25, 0.5]]
    assert edge[2] == 0.0  # n=100 at alpha=0.01 cannot certify 2 sigma
    assert set(d["curves"]) == {"pa_survival", "certified_accuracy"}
    for curve in d["curves"].values():
        assert all(len(ys) == len(curve["x"]) for ys in curve["series"].values())
    assert d["acr_warning"] == ACR_WARNING
    assert r.lower <= r.estimate <= r.upper


def test_pa_report_default_radii_reach_the_largest_certifiable_radius():
    r = pa_report(HALF_SPACE, inputs_with_pa([0.9999], 0.5), 0.5, n=200)
    radii = r.details["certified_accuracy"]["radius"]
    assert radii[0] == 0.0 and len(radii) == 21
    assert radii[-1] == pytest.approx(r.details["largest_certifiable_radius"], abs=1e-4)
    assert r.details["largest_certifiable_radius"] == pytest.approx(0.5 * PHI.inv_cdf(0.001 ** (1 / 200)))


# ----------------------------------------------------------------------------------------------
# Bad requests
# ----------------------------------------------------------------------------------------------

DATA = inputs_with_pa([0.99] * 4, 0.25)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sigma=0.0), "sigma=0.0 is invalid: expected a finite number > 0"),
        (dict(sigma=-0.25), "sigma=-0.25 is invalid"),
        (dict(radius=-0.1), "radius=-0.1 is invalid: expected a finite number >= 0"),
        (dict(threshold=0.0), "threshold=0.0 is invalid: expected a number strictly between 0 and 1"),
        (dict(threshold=1.5), "threshold=1.5 is invalid"),
        (dict(alpha=1.0), "alpha=1.0 is invalid"),
        (dict(max_draws=300), r"max_draws=300 is invalid: expected at least 319: .*the sequential test needs "
                              r"319; a fixed-size Clopper-Pearson test would need 301"),
        (dict(budget=200), "budget=200 is invalid: expected at least 343"),
        (dict(threshold=0.9), r"threshold=0.9 is invalid: expected at most 0.4719: with 4 inputs .* use at "
                              r"least 29 inputs"),
        (dict(radius=10.0), "radius=10.0 is invalid"),
    ],
)
def test_bad_gate_requests_are_setting_errors(kwargs, message):
    args = dict(threshold=0.3, radius=0.5, sigma=0.25, budget=10**6) | kwargs
    with pytest.raises(SettingError, match=message):
        certified_accuracy(HALF_SPACE, DATA, **args)


def test_budget_too_small_for_the_threshold_is_refused_before_any_forward_pass():
    data = inputs_with_pa([0.999] * 100, 0.25)
    needed = next(k for k in range(101) if clopper_pearson_lower(k, 100, 0.05) - 0.001 >= 0.6)
    with pytest.raises(SettingError, match=rf"budget=20000 is invalid: expected at least {needed * 343} model "
                                           rf"evaluations to pass: at least {needed} of 100 inputs certified and "
                                           r"each certificate at least 343"):
        certified_accuracy(RecordingModel(HALF_SPACE), data, threshold=0.6, radius=0.5, sigma=0.25, budget=20_000)
    with pytest.raises(SettingError, match=f"budget={needed * 343 - 1} is invalid"):
        certified_accuracy(HALF_SPACE, data, threshold=0.6, radius=0.5, sigma=0.25, budget=needed * 343 - 1)
    r = certified_accuracy(HALF_SPACE, data, threshold=0.6, radius=0.5, sigma=0.25, budget=needed * 343)
    assert r.draws <= needed * 343


@pytest.mark.parametrize("fn", [certify, predict, pa_report])
def test_bad_fixed_size_requests(fn):
    with pytest.raises(SettingError, match="sigma=0 is invalid"):
        fn(HALF_SPACE, DATA, 0)
    with pytest.raises(SettingError, match="n=0 is invalid"):
        fn(HALF_SPACE, DATA, 0.25, n=0)


def test_closed_form_helpers_validate_their_arguments():
    with pytest.raises(SettingError, match="sigma"):
        smoothing.radius_from_counts(5, 10, 0.01, 0.0)
    with pytest.raises(SettingError, match="radius"):
        smoothing.min_samples_to_certify(-1.0, 0.25, 0.001)
    with pytest.raises(SettingError, match="alpha"):
        smoothing.min_samples_to_certify(0.5, 0.25, 0.0)
    with pytest.raises(ValueError, match="probabilities"):
        smoothing.certified_accuracy_from_pa([1.2], 0.5, 0.25, 100, 0.01)


def test_long_runs_report_progress():
    from pytest_robust import progress_sink

    seen = []
    data = inputs_with_pa([0.999, 0.5], 0.25)
    with progress_sink(seen.append):
        certified_accuracy(HALF_SPACE, data, threshold=None, radius=0.5, sigma=0.25)
        certify(HALF_SPACE, data, 0.25, n0=10, n=3000)
    gate = [f for f in seen if f["metric"] == "certified accuracy"]
    assert gate and gate[-1]["inputs_done"]() == 2 and gate[-1]["draws"] <= gate[-1]["budget"]
    fixed = [f for f in seen if f["metric"] == "CERTIFY"]
    assert fixed[-1]["draws"] == fixed[-1]["budget"] == 2 * 3010


# ----------------------------------------------------------------------------------------------
# Host reads (a GPU stalls at each)
# ----------------------------------------------------------------------------------------------

# batch_size 256 (the largest chunk) keeps the gate near one model call per batch, where two reads
# per batch would exceed one per call.
GATE = dict(radius=0.25, sigma=0.5, max_draws=2000, budget=10**6, batch_size=256)
#: The smoothing modules (``count_host_syncs`` names lines as "dir/file.py:line").
SMOOTHING_FILES = ("checks/smoothing/",)
HOST_READ_CHECKS = {  # check -> (most host reads of the smoothing modules per model call, the check)
    "gate": (1, lambda data: certified_accuracy(HALF_SPACE, data, threshold=None, **GATE)),
    "gate with threshold": (1, lambda data: certified_accuracy(HALF_SPACE, data, threshold=0.05, **GATE)),
    "certify": (1 / CHECK_EVERY, lambda data: certify(HALF_SPACE, data, 0.5, n0=16, n=200, batch_size=32)),
    "predict": (1 / CHECK_EVERY, lambda data: predict(HALF_SPACE, data, 0.5, n=200, batch_size=32)),
}


@pytest.mark.parametrize("check", HOST_READ_CHECKS)
def test_host_reads_per_model_call(check):
    """Host reads made by the smoothing modules (the CPU stand-in of ``count_host_syncs``) per extra
    model call when the inputs double, so one-off reads cancel: the gate reads each batch's outcomes
    once (its sequential tests run on the host, and the logits' finiteness comes back with them),
    CERTIFY and PREDICT count on the device and read only the finiteness flag, once per
    ``CHECK_EVERY`` batches (one more read for a partial run of batches)."""
    most, run = HOST_READ_CHECKS[check]
    counts = []
    for copies in (1, 2):
        data = inputs_with_pa([0.999, 0.9, 0.7, 0.6, 0.55, 0.3] * 4 * copies, 0.5)
        with count_host_syncs(HALF_SPACE) as count:
            run(data)
        mine = sum(n for where, n in count.where.items() if where.startswith(SMOOTHING_FILES))
        counts.append((mine, count.calls))
    (reads_1, calls_1), (reads_2, calls_2) = counts
    assert calls_2 > calls_1 + 10
    assert reads_2 - reads_1 <= most * (calls_2 - calls_1) + (most < 1)


def test_a_gate_whose_budget_left_inputs_open_says_to_raise_it():
    """Inputs still undecided when the budget's share for them ran out: the inconclusive message
    says more budget would help (a few evaluations stay unspent, so it must not read as "every
    input used, only more inputs help")."""
    sigma = 0.25
    data = inputs_with_pa([0.9995] * 30 + [0.985] * 20 + [0.5] * 10, sigma)
    r = certified_accuracy(HALF_SPACE, data, threshold=0.7, radius=0.5, sigma=sigma, budget=20_000)
    assert r.verdict == "inconclusive" and r.forward_passes < r.budget and r.details["undecided"] > 0
    assert "could pay for no more of their draws" in r.message() and "raise it (--robust-budget" in r.message()
    assert "not more budget" not in r.message()
