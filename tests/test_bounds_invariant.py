"""Every check reports bounds that hold its estimate: lower <= estimate <= upper, over many seeds
and thresholds near the estimate (where gates decide early and later draws may disagree), on tiny
models and budgets. And the Bernoulli summary keeps it when a stream goes on past its decision
(NPPR's ``at_least``) and the later draws contradict the gate."""

import numpy as np
import pytest
from toy_models import SmallNet, image_data

import pytest_robust as pr
from pytest_robust.procedures.bernoulli import Stream, summary
from pytest_robust.stats import SequentialGate

BOX = pr.UniformLinf(eps=0.3)
SEEDS = range(8)
pytestmark = pytest.mark.filterwarnings("ignore::pytest_robust.errors.RobustWarning")  # a random model is near chance

#: One tiny call per check: (model, data, threshold, seed) -> Result.
CHECKS = {
    "tsrm": lambda m, d, t, s: pr.tsrm(m, d, perturbation=BOX, threshold=t, budget=1500, seed=s),
    "corruption_accuracy": lambda m, d, t, s: pr.corruption_accuracy(
        m, d, threshold=t, corruptions=["gaussian_noise", "contrast"], severities=[1, 5], budget=1500, seed=s),
    "intermediate_q": lambda m, d, t, s: pr.intermediate_q(
        m, d, perturbation=BOX, q=1, estimator="mc", max_loss=1.0 + t, chains=4, steps=8, inputs=8, budget=5000,
        seed=s),
    "certified_accuracy": lambda m, d, t, s: pr.certified_accuracy(
        m, d, threshold=t, radius=0.05, sigma=0.25, max_draws=300, budget=20_000, seed=s),
    "nppr": lambda m, d, t, s: pr.nppr(
        m, d, threshold=t, eps=0.2, latent_dim=4, components=2, fit_steps=3, fit_batch_size=8, fit_draws=2,
        draws_per_input=40, budget=8000, seed=s),
    "adversarial_accuracy": lambda m, d, t, s: pr.adversarial_accuracy(
        m, d, threshold=t, eps=0.05, steps=3, restarts=1, targets=1, square_queries=10, seed=s),
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_check_s_bounds_hold_its_estimate_over_seeds(name):
    x, y = image_data(n=32)
    model = SmallNet().eval()
    for seed in SEEDS:
        for threshold in (0.3, 0.45):
            r = CHECKS[name](model, (x, y), threshold, seed)
            assert r.lower <= r.estimate <= r.upper, (name, seed, threshold, r.lower, r.estimate, r.upper)


def test_a_stream_that_goes_on_past_its_decision_and_contradicts_it_keeps_its_estimate_inside():
    """The gate fails early on a bad start (p = 0.3 for one block), the stream goes on to its
    ``at_least`` draws at p = 0.62: the bounds rest on every draw and hold the estimate (before the
    fix the gate's "upper <= threshold" was joined to the later draws' lower bound: [0.59, 0.35])."""
    rng = np.random.default_rng(0)
    outcomes = np.concatenate([rng.random(256) < 0.3, rng.random(5120) < 0.62])
    gate = SequentialGate(0.55, 0.05)
    gate.update(outcomes[:256])
    assert gate.decision.verdict == "fail"
    stream = Stream(outcomes, np.zeros(len(outcomes), dtype=int), gate.decision, gate.p_values(), at_least=5120)
    estimate, lower, upper, _ = summary(stream, 0.05, 0.55)
    assert estimate == pytest.approx(outcomes[:5120].mean())
    assert lower <= estimate <= upper


def test_a_decided_stream_s_bounds_still_agree_with_its_gate():
    """On the gate's own draws the bounds start from its threshold on the decided side."""
    outcomes = np.ones(512, dtype=bool)
    gate = SequentialGate(0.5, 0.05)
    gate.update(outcomes)
    stream = Stream(outcomes, np.zeros(512, dtype=int), gate.decision, gate.p_values())
    estimate, lower, upper, _ = summary(stream, 0.05, 0.5)
    assert gate.decision.verdict == "pass" and 0.5 <= lower <= estimate == 1.0 == upper
