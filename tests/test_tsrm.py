"""tsrm() against closed forms: synthetic models whose TSRM under a known perturbation is exact.

``toy_models.ThresholdModel(t)`` on inputs 0.5 under ``UniformLinf(eps=0.5)`` is right iff
U < t with U ~ U[0, 1], so TSRM = t (exactly, for dyadic t, even with float32 uniforms).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from toy_models import FULL_BOX, MixedModel, RecordingModel, ThresholdModel, mixed_data, threshold_data

from pytest_robust.checks.tsrm.check import tsrm
from pytest_robust.perturbations import UniformLinf
from pytest_robust.procedures.bernoulli import BLOCK
from pytest_robust.stats import SequentialGate, clopper_pearson_lower, clopper_pearson_upper, confidence_sequence

TOL = 1e-6  # bisection tolerance of stats.confidence_sequence


def se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def check_details(r):
    """Invariants every result satisfies."""
    d = r.details
    alpha = 1 - r.confidence
    assert d["correct"] == round(r.estimate * r.draws)
    assert r.estimate == d["correct"] / r.draws
    assert d["cp_lower"] == clopper_pearson_lower(d["correct"], r.draws, alpha)
    assert d["cp_upper"] == clopper_pearson_upper(d["correct"], r.draws, alpha)
    assert 0.0 <= d["cp_lower"] <= r.estimate <= d["cp_upper"] <= 1.0
    assert 0.0 <= r.lower <= 1.0 and 0.0 <= r.upper <= 1.0
    assert 1 <= d["inputs_seen"] <= r.n_inputs
    assert r.draws <= r.forward_passes
    assert r.draws <= r.budget


@pytest.mark.parametrize("t", [0.875, 0.3])
def test_estimate_matches_closed_form(t):
    budget = 50_000
    r = tsrm(ThresholdModel(t), threshold_data(), perturbation=FULL_BOX, budget=budget, seed=1)
    assert r.verdict == "estimate"
    assert r.draws == r.forward_passes == budget
    assert abs(r.estimate - t) <= 4 * se(t, budget)
    assert r.lower <= t <= r.upper
    assert r.upper - r.lower < 0.03
    check_details(r)
    assert r.details["cp_lower"] <= t <= r.details["cp_upper"]


@pytest.mark.parametrize("q", [0.5, 0.25])
def test_mixed_dataset_closed_form(q):
    """Half the inputs always right, half right with probability q: TSRM = (1 + q) / 2."""
    budget = 50_000
    expected = (1 + q) / 2
    x, y = mixed_data()
    r = tsrm(MixedModel(q), (x, y), perturbation=FULL_BOX, budget=budget, seed=2)
    assert abs(r.estimate - expected) <= 4 * se(expected, budget)
    assert r.n_inputs == 16 and r.details["inputs_seen"] == 16
    check_details(r)
    # per half: evaluate the halves separately
    always = tsrm(MixedModel(q), (x[:8], y[:8]), perturbation=FULL_BOX, budget=2000, seed=2)
    sometimes = tsrm(MixedModel(q), (x[8:], y[8:]), perturbation=FULL_BOX, budget=budget, seed=2)
    assert always.estimate == 1.0
    assert abs(sometimes.estimate - q) <= 4 * se(q, budget)


@pytest.mark.parametrize("t", [0.875, 0.5])
def test_pass_and_fail_away_from_the_truth(t):
    passed = tsrm(ThresholdModel(t), threshold_data(), perturbation=FULL_BOX, threshold=t - 0.05, seed=3)
    failed = tsrm(ThresholdModel(t), threshold_data(), perturbation=FULL_BOX, threshold=t + 0.05, seed=3)
    assert passed.verdict == "pass" and passed.passed
    assert failed.verdict == "fail" and not failed.passed
    for r in (passed, failed):
        assert r.draws < r.budget
        check_details(r)
    assert passed.lower >= t - 0.05 - TOL
    assert failed.upper <= t + 0.05 + TOL
    assert ">= required" in passed.message() and "< required" in failed.message()


def test_gate_verdict_and_bounds_match_the_stats_layer_on_the_same_stream():
    """Rebuild the outcome stream from the inputs the model saw; the gate and the confidence
    sequence computed on it reproduce tsrm's verdict, draw count and bounds exactly."""
    t, threshold = 0.875, 0.84
    model = RecordingModel(ThresholdModel(t))
    r = tsrm(model, threshold_data(), perturbation=FULL_BOX, threshold=threshold, seed=4, batch_size=300)
    stream = (model.seen(r)[:, 0] < t).numpy().astype(np.float64)
    assert len(stream) == r.forward_passes
    gate = SequentialGate(threshold, 1 - r.confidence)
    decision = gate.update(stream)
    assert decision is not None
    assert (decision.verdict, decision.at) == (r.verdict, r.draws)
    assert r.details["correct"] == int(stream[: r.draws].sum())
    known = {"lower_at_least": threshold} if r.verdict == "pass" else {"upper_at_most": threshold}
    assert (r.lower, r.upper) == confidence_sequence(stream[: r.draws], 1 - r.confidence, **known)
    assert (r.lower >= threshold) if r.verdict == "pass" else (r.upper <= threshold)


def test_a_sure_model_passes_at_the_hand_computable_draw():
    # eps = 0: no noise; the model is always right
    model = ThresholdModel(0.7)
    r = tsrm(model, threshold_data(), perturbation=UniformLinf(eps=0.0), threshold=0.9, confidence=0.95)
    expected = SequentialGate(0.9, 1 - 0.95).update(np.ones(10_000))
    assert r.verdict == "pass" and r.draws == expected.at
    assert r.estimate == 1.0 and r.details["cp_upper"] == 1.0
    assert r.details["cp_lower"] == pytest.approx((1 - 0.95) ** (1 / r.draws))
    # and an always-wrong model fails
    r = tsrm(ThresholdModel(0.3), threshold_data(), perturbation=UniformLinf(eps=0.0), threshold=0.1)
    assert r.verdict == "fail" and r.estimate == 0.0
    assert r.draws == SequentialGate(0.1, 0.05).update(np.zeros(10_000)).at


@pytest.mark.parametrize("t,confidence", [(0.875, 0.95), (0.5, 0.9)])
def test_calibration_false_pass_rate_at_the_threshold(t, confidence):
    """True TSRM exactly equal to the threshold: a pass is a false pass (and so is a fail, the
    mirror test's null holding too); each must happen in at most alpha of runs (+3 SE)."""
    reps, alpha = 150, 1 - confidence
    counts = {"pass": 0, "fail": 0, "inconclusive": 0}
    model = ThresholdModel(t)
    data = threshold_data()
    for seed in range(reps):
        r = tsrm(model, data, perturbation=FULL_BOX, threshold=t, confidence=confidence, budget=2000, seed=seed)
        counts[r.verdict] += 1
    bound = alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)
    assert counts["pass"] / reps <= bound
    assert counts["fail"] / reps <= bound
    assert counts["inconclusive"] >= reps * (1 - 2 * bound)


def test_inconclusive_with_tiny_budget_at_the_truth():
    """At the truth nothing can be proven: with 60 draws almost every run is inconclusive. (A few
    are not: the betting test may stop very early by chance; those count towards alpha.)"""
    t, budget, reps = 0.875, 60, 40
    verdicts = []
    for seed in range(reps):
        r = tsrm(ThresholdModel(t), threshold_data(), perturbation=FULL_BOX, threshold=t, budget=budget, seed=seed)
        verdicts.append(r.verdict)
        check_details(r)
        if r.verdict == "inconclusive":
            assert not r.passed
            assert r.draws == r.forward_passes == budget
            assert r.lower < t < r.upper
            message = r.message()
            assert "inconclusive against" in message and "budget of 60 model evaluations ran out" in message
        else:
            assert r.draws < budget
    assert verdicts.count("inconclusive") >= 0.85 * reps


@pytest.mark.parametrize("budget", [1, 2, BLOCK - 1, BLOCK, BLOCK + 1, 1000, 3 * BLOCK + 17])
@pytest.mark.parametrize("batch_size", [1, 100, 1024])
def test_estimate_mode_uses_exactly_the_budget(budget, batch_size):
    model = RecordingModel(ThresholdModel(0.5))
    r = tsrm(model, threshold_data(5), perturbation=FULL_BOX, budget=budget, batch_size=batch_size, seed=5)
    assert r.verdict == "estimate" and r.threshold is None
    assert r.draws == r.forward_passes == budget == len(model.seen(r))
    check_details(r)


def test_result_fields():
    r = tsrm(ThresholdModel(0.5), threshold_data(12), perturbation=FULL_BOX, threshold=0.25, confidence=0.9,
             budget=5000, seed=7, batch_size=64)
    assert r.metric == "tsrm" and r.name == "TSRM"
    assert r.threshold == 0.25 and r.confidence == 0.9 and r.budget == 5000 and r.seed == 7
    assert r.n_inputs == 12 and r.device == "cpu"
    assert r.perturbation == "UniformLinf(eps=0.5)"
    assert r.details["batch_size"] == 64 and r.details["oom_halvings"] == 0
    assert "alpha=0.1" in r.details["test"]
    assert r.seconds >= 0.0
    check_details(r)


def test_confidence_changes_decision_speed_not_direction():
    data = threshold_data()
    loose = tsrm(ThresholdModel(0.875), data, perturbation=FULL_BOX, threshold=0.8, confidence=0.8, seed=8)
    strict = tsrm(ThresholdModel(0.875), data, perturbation=FULL_BOX, threshold=0.8, confidence=0.999, seed=8)
    assert loose.verdict == strict.verdict == "pass"
    assert loose.draws < strict.draws
    assert strict.lower <= loose.lower


def test_callable_perturbation_in_the_pipeline():
    """A user callable drawing from the generator it is given gives reproducible results."""

    def shift(x, generator):
        return x + torch.rand(x.shape, generator=generator, dtype=x.dtype) - 0.5  # x' ~ U[0, 1]

    a = tsrm(ThresholdModel(0.875), threshold_data(), perturbation=shift, budget=20_000, seed=9)
    b = tsrm(ThresholdModel(0.875), threshold_data(), perturbation=shift, budget=20_000, seed=9)
    assert (a.estimate, a.lower, a.upper) == (b.estimate, b.lower, b.upper)
    assert abs(a.estimate - 0.875) <= 4 * se(0.875, 20_000)
    assert a.perturbation.endswith("shift")
