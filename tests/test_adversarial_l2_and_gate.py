"""Adversarial accuracy in L2, the first-order target ranking, the early decision of a threshold,
``inputs=`` subsets and the gallery of the points found (issue 28). The L-inf closed form and the
stage accounting at large are in test_adversarial.py."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from test_adversarial import QUICK, Separated, exact_robust, linear_problem
from toy_models import SmallNet, image_data

from pytest_robust import adversarial_accuracy
from pytest_robust.attacks.apgd import EARLY
from pytest_robust.attacks.norms import L2Ball
from pytest_robust.checks.adversarial import check as adversarial_check
from pytest_robust.checks.adversarial.check import CHUNK
from pytest_robust.checks.adversarial.ensemble import Schedule
from pytest_robust.errors import SettingError
from pytest_robust.stats import SequentialGate


def exact_robust_l2(model: torch.nn.Linear, x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """Closed form for f(x) = Wx + b in the L2 ball of radius eps without a box (the check gets a box far
    wider than the ball): the input is robust
    iff for every class j != y the margin (w_y - w_j) x + b_y - b_j exceeds eps ||w_y - w_j||_2 (the
    largest gain of class j over y in the ball; reaching it exactly is a tie, an error)."""
    w = model.weight.detach()
    z = model(x).detach()
    robust = torch.ones(len(y), dtype=torch.bool)
    for j in range(w.shape[0]):
        gap = z[:, j] - z.gather(1, y[:, None]).squeeze(1)
        robust &= (gap + eps * (w[j] - w[y]).norm(dim=1) < 0) | (y == j)
    return robust


@pytest.mark.parametrize("classes", [2, 3, 10])
def test_l2_is_exact_on_linear_models_without_a_box(classes):
    model, x, y = linear_problem(classes)
    robust = []
    for eps in (0.1, 0.3, 0.6):
        truth = exact_robust_l2(model, x, y, eps)
        robust.append(int(truth.sum()))
        r = adversarial_accuracy(model, (x, y), eps=eps, norm="l2", bounds=(-100.0, 100.0), targets=1, **QUICK)
        assert [o == "robust" for o in r.details["per_input"]["outcome"]] == truth.tolist(), (classes, eps)
        assert r.details["attack"]["norm"] == "l2" and r.perturbation.startswith(f"L2 eps={eps:g}")
    assert any(0 < k < len(y) - len(y[::10]) for k in robust)  # the radii matter: some robust, some broken


def test_the_first_order_ranking_makes_one_target_exact_in_linf_where_the_logit_order_is_not():
    """With the box, the linear model's worst class for an input is the one with the largest
    reachable gap, not always the one with the second-highest clean logit."""
    model, x, y = linear_problem(10)
    truth = exact_robust(model, x, y, 0.1)
    ranked = adversarial_accuracy(model, (x, y), eps=0.1, targets=1, **QUICK)
    by_logits = adversarial_accuracy(model, (x, y), eps=0.1, targets=1, ranking="logits", restarts=1, **QUICK)
    assert [o == "robust" for o in ranked.details["per_input"]["outcome"]] == truth.tolist()
    assert by_logits.details["robust_inputs"] >= ranked.details["robust_inputs"]
    assert ranked.details["attack"]["ranking"] == "linear" and by_logits.details["attack"]["ranking"] == "logits"


def test_l2_points_stay_in_the_ball_and_box():
    ball, g = L2Ball(0.5), torch.Generator().manual_seed(0)
    x = torch.rand(64, 3, 5, 5, generator=g)
    lo, hi = (x - 0.5).clamp(0, 1), (x + 0.5).clamp(0, 1)
    z = x + 3 * torch.randn(x.shape, generator=g)
    p = ball.project(z, x, lo, hi)
    assert ((p - x).flatten(1).norm(dim=1) <= 0.5 + 1e-6).all() and (p >= 0).all() and (p <= 1).all()
    start = ball.random_start(x, lo, hi, torch.rand(x.shape, generator=g))
    assert ((start - x).flatten(1).norm(dim=1) <= 0.5 + 1e-6).all()
    d = torch.randn(x.shape, generator=g)
    assert torch.allclose(ball.gain(d, x, lo, hi), 0.5 * d.flatten(1).norm(dim=1))


def test_l2_stage_accounting_and_the_class_count_budget():
    """The stage accounting of test_adversarial in L2 (sum(x) moves by at most eps sqrt(4) = 0.1):
    an L2 APGD run of 20 steps has four phases (radii 8, 4, 2 and 1 eps), so it costs steps + 4
    evaluations;
    the far inputs pay the whole schedule, the near ones break within two steps of the widest phase
    and then pay one evaluation per later phase (its start, already misclassified); a 2-class model
    pays for one target, one ranking gradient and one evaluation of the target's first-order
    worst point of the eps ball (before the run widens) however many targets are asked for."""
    far, near, wrong = torch.full((5, 4), 0.9), torch.full((3, 4), 0.27), torch.full((2, 4), 0.1)
    x, y = torch.cat([far, near, wrong]), torch.zeros(10, dtype=torch.long)
    steps, queries = 20, 30
    r = adversarial_accuracy(Separated(), (x, y), eps=0.05, norm="l2", steps=steps, restarts=2, targets=9,
                             square_queries=queries)
    spent = dict(r.details["evaluations"])
    run = steps + len(L2Ball.widening)
    near = spent.pop("apgd-ce") - 5 * 2 * run
    assert spent == {"probe": 1, "clean": 10, "apgd-t": 5 * (1 + 1 + run), "square": 5 * queries}
    later = len(L2Ball.widening) - 1
    assert 3 * (EARLY[0] + 1 + later) <= near <= 3 * (EARLY[1] + 1 + later)
    assert r.details["per_input"]["outcome"] == ["robust"] * 5 + ["broken"] * 3 + ["misclassified"] * 2
    assert r.details["attack"]["worst_case_per_input"] == 1 + 2 * run + 1 + 1 + run + queries


class Threshold(torch.nn.Module):
    """Two classes on 64 features: class 1's logit 20 (x_0 - 0.45)+ - 1 beats class 0's 0 once
    x_0 > 0.5. From x = 0.3 everywhere that point lies within L2 distance 0.2, but the gradient is
    exactly zero wherever x_0 < 0.45, which a random direction of length 0.25 in 64 dimensions
    almost never reaches (its x_0 component is about 0.25 / 8)."""

    def forward(self, x):
        z1 = 20 * torch.relu(x[:, 0] - 0.45) - 1
        return torch.stack([torch.zeros_like(z1), z1], dim=1)


def test_the_widening_start_breaks_what_a_flat_neighbourhood_hides_from_apgd(monkeypatch):
    """Every input is breakable at eps 0.25 (x_0 = 0.55), yet APGD-CE confined to the ball sees a
    zero gradient and breaks none; started at 8 eps, where random directions reach x_0 > 0.45, and
    walked back through 4 and 2 eps, it breaks some (5 of 40 at seed 0; at least 2 asked, so that
    another CPU's rounding cannot flip the result)."""
    x, y = torch.full((40, 64), 0.3), torch.zeros(40, dtype=torch.long)
    run = lambda: adversarial_accuracy(Threshold(), (x, y), eps=0.25, norm="l2", targets=0,  # noqa: E731
                                       square_queries=0, seed=0)
    widened = run()
    monkeypatch.setattr(L2Ball, "widening", ((1.0, 1.0),))
    confined = run()
    assert confined.details["per_input"]["outcome"].count("broken") == 0
    assert widened.details["per_input"]["outcome"].count("broken") >= 2


@pytest.mark.parametrize("norm, steps, phases", [
    ("l2", 50, [(8, 5), (4, 5), (2, 5), (1, 35)]),
    ("l2", 10, [(8, 1), (4, 1), (2, 1), (1, 7)]),
    ("l2", 9, [(1, 9)]),  # a tenth of 9 steps rounds down to none: no wide phase
    ("l1", 50, [(8, 5), (4, 5), (2, 5), (1, 35)]),
    ("linf", 50, [(1, 50)]),
])
def test_an_apgd_run_s_phases_share_its_steps(norm, steps, phases):
    schedule = Schedule(eps=0.5, steps=steps, restarts=1, targets=0, square_queries=0, bounds=None, norm=norm)
    assert schedule.phases() == [(m * 0.5, n) for m, n in phases]
    assert schedule.run_cost() == steps + len(phases)


def _population(n: int, robust: int):
    """n inputs for ``Separated``: ``robust`` far from the boundary (robust at eps 0.05), the others
    within eps of it (broken by the first APGD-CE steps), in a fixed shuffled order."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    x = torch.where((order < robust)[:, None], 0.9, 0.26) * torch.ones(n, 4)
    return x, torch.zeros(n, dtype=torch.long)


FAST = dict(eps=0.05, steps=2, targets=0, square_queries=0)


def test_a_threshold_far_from_the_truth_decides_after_a_third_of_the_inputs_or_fewer():
    x, y = _population(600, 540)  # robust accuracy 0.9
    passed = adversarial_accuracy(Separated(), (x, y), threshold=0.5, **FAST)
    failed = adversarial_accuracy(Separated(), (x, y), threshold=0.98, **FAST)
    for r, verdict in ((passed, "pass"), (failed, "fail")):
        early = r.details["early_decision"]
        assert r.verdict == verdict and early["attacked"] <= 600 // 3 and early["attacked"] % CHUNK == 0
        assert early["decided_after"] <= early["attacked"] == len(r.details["per_input"]["index"])
        assert r.details["p_values"][verdict] <= 0.05 and r.draws == early["decided_after"]
        assert r.details["evaluations"]["clean"] == early["attacked"]
    assert passed.lower >= 0.5 and failed.upper <= 0.98
    estimate = adversarial_accuracy(Separated(), (x, y), threshold=None, **FAST)
    assert len(estimate.details["per_input"]["index"]) == 600 and estimate.estimate == pytest.approx(0.9)
    near = adversarial_accuracy(Separated(), (x, y), threshold=0.9, **FAST)
    assert near.verdict == "inconclusive" and near.details["early_decision"]["attacked"] == 600


def test_an_input_s_outcome_depends_on_its_place_in_the_order_alone(monkeypatch):
    """A gated run attacks the first inputs of the estimate-only run's order with the same outcomes
    and stages, and the estimate-only run's chunking changes no number (the streams are numbered by
    the blocks' places in the order, not by chunk)."""
    x, y = image_data(n=96)
    settings = dict(eps=0.05, steps=3, targets=1, square_queries=10, seed=4)
    full = adversarial_accuracy(SmallNet().eval(), (x, y), **settings)
    gated = adversarial_accuracy(SmallNet().eval(), (x, y), threshold=0.6, **settings)  # the truth is 0.05
    assert gated.details["early_decision"]["attacked"] < 96
    whole = dict(zip(full.details["per_input"]["index"], zip(full.details["per_input"]["outcome"],
                                                              full.details["per_input"]["stage"])))
    for i, outcome, stage in zip(*(gated.details["per_input"][k] for k in ("index", "outcome", "stage"))):
        assert whole[i] == (outcome, stage)
    monkeypatch.setattr(adversarial_check, "ESTIMATE_CHUNK", 24)
    again = adversarial_accuracy(SmallNet().eval(), (x, y), **settings)
    assert again.details["per_input"] == full.details["per_input"] and again.estimate == full.estimate
    assert again.forward_passes == full.forward_passes


def test_the_early_decision_keeps_its_false_pass_rate_at_the_threshold():
    """The check's gate on simulated outcomes: inputs robust with probability exactly the threshold,
    looks after every CHUNK inputs as in the check; false passes stay within alpha (plus three
    Monte Carlo standard errors), and the betting gate decides far from the threshold quickly."""
    rng, alpha, n, reps = np.random.default_rng(0), 0.05, 640, 1000
    for tau in (0.5, 0.9):
        passes = 0
        for _ in range(reps):
            gate = SequentialGate(tau, alpha, horizon=n)
            outcomes = (rng.random(n) < tau).astype(float)
            for start in range(0, n, CHUNK):
                if gate.update(outcomes[start : start + CHUNK]) is not None:
                    break
            passes += gate.decision is not None and gate.decision.verdict == "pass"
        assert passes / reps <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / reps), tau


def test_inputs_attacks_a_seeded_random_subset_and_a_short_budget_the_same_first_inputs():
    x, y = _population(200, 150)
    r = adversarial_accuracy(Separated(), (x, y), inputs=50, **FAST)
    again = adversarial_accuracy(Separated(), (x, y), inputs=50, **FAST)
    other = adversarial_accuracy(Separated(), (x, y), inputs=50, seed=1, **FAST)
    index = r.details["per_input"]["index"]
    assert len(index) == 50 == r.details["inputs_attacked"] and r.details["inputs_available"] == 200
    assert index == sorted(index) and index != list(range(50)) and index == again.details["per_input"]["index"]
    assert index != other.details["per_input"]["index"]
    per_input = 1 + 2 * 3  # clean + 2 restarts x (2 + 1) APGD-CE evaluations; no targets, no Square
    short = adversarial_accuracy(Separated(), (x, y), budget=1 + 50 * per_input, **FAST)
    attacked = short.details["budget_stop"]["attacked"]  # inputs broken early leave budget for more
    assert 50 <= attacked < 200 and short.forward_passes <= short.budget
    same = adversarial_accuracy(Separated(), (x, y), inputs=attacked, **FAST)  # the first of the same order
    assert short.details["per_input"]["index"] == same.details["per_input"]["index"]
    assert (short.estimate, short.lower, short.upper) == (same.estimate, same.lower, same.upper)


def test_a_gate_the_budget_stops_is_inconclusive_saying_how_many_inputs_it_paid_for():
    x, y = _population(600, 540)  # robust accuracy 0.9
    per_input = 1 + 2 * 3
    r = adversarial_accuracy(Separated(), (x, y), threshold=0.88, budget=1 + 40 * per_input, **FAST)
    attacked = r.details["early_decision"]["attacked"]
    assert r.verdict == "inconclusive" and 40 <= attacked < 600 == r.details["budget_stop"]["chosen"]
    assert f"the budget of 281 model evaluations paid for {attacked} of the 600 inputs" in r.message()
    assert "raise budget=" in r.message() and "used every one" not in r.message()


def test_an_early_decision_says_after_how_many_inputs(tmp_path):
    x, y = _population(600, 540)
    r = adversarial_accuracy(Separated(), (x, y), threshold=0.5, **FAST)
    decided = r.details["early_decision"]["decided_after"]
    assert r.verdict == "pass" and decided < 600
    assert f"decided after {decided} of 600 inputs" in r.message()


def test_inputs_must_be_a_positive_integer():
    x, y = _population(20, 10)
    with pytest.raises(SettingError, match="inputs"):
        adversarial_accuracy(Separated(), (x, y), inputs=0, **FAST)


class Bright(torch.nn.Module):
    """Two classes on images: class 0 iff the mean pixel exceeds 0.5 (logits (m - 0.5, 0.5 - m))."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        m = x.flatten(1).mean(1) - 0.5
        return torch.stack([m, -m], dim=1) + self.bias


@pytest.mark.parametrize("norm, eps", [("linf", 0.1), ("l2", 0.6)])
def test_the_gallery_shows_the_misclassified_point_found(norm, eps):
    g = torch.Generator().manual_seed(0)
    x = (0.52 + 0.02 * torch.rand(12, 1, 6, 6, generator=g)).clamp(0, 1)  # mean just above 0.5: breakable
    y = torch.zeros(12, dtype=torch.long)
    r = adversarial_accuracy(Bright(), (x, y), eps=eps, norm=norm, steps=5, targets=1, square_queries=0)
    pictures = r.gallery
    assert pictures is not None and "the attack found" in pictures["note"]
    shape = (len(pictures["index"]), *pictures["shape"])
    clean = np.frombuffer(base64.b64decode(pictures["clean"]), np.uint8).reshape(shape).astype(float) / 255
    found = np.frombuffer(base64.b64decode(pictures["perturbed"]), np.uint8).reshape(shape).astype(float) / 255
    assert set(pictures["outcome"]) == {"broken"}
    for c, f in zip(clean, found):
        assert f.mean() <= 0.5 + 1 / 255  # misclassified (up to the 8-bit rounding of the thumbnail)
        move = np.abs(f - c).max() if norm == "linf" else np.sqrt(((f - c) ** 2).sum())
        assert 0 < move <= eps + 6 / 255


def test_a_gate_on_ten_thousand_inputs_decides_within_the_default_budget():
    """The default attack's worst case times 10 000 inputs is far above the default budget of
    1 000 000, which used to be refused up front; the gate attacks the seeded order and decides."""
    x, y = _population(10_000, 9_000)
    r = adversarial_accuracy(Separated(), (x, y), eps=0.05, threshold=0.5)
    assert r.details["attack"]["worst_case_per_input"] * 10_000 > r.budget == 1_000_000
    assert r.verdict == "pass" and r.details["early_decision"]["decided_after"] < 10_000
    assert "budget_stop" not in r.details and r.forward_passes <= r.budget


def test_the_summary_shows_on_how_many_inputs_an_early_decision_was_made():
    from pytest_robust.report.markdown import summary_markdown

    x, y = _population(600, 540)
    r = adversarial_accuracy(Separated(), (x, y), threshold=0.5, **FAST)
    decided = r.details["early_decision"]["decided_after"]
    assert f"(on {decided} of 600 inputs)" in summary_markdown([r.to_dict()], {"torch": "any"})
