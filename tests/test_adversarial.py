"""Adversarial accuracy (APGD-CE, APGD-T, Square): exact on linear models, stages that attack only
what is still unbroken, the per-input table, gradient masking, the budget, batch-size independence."""

from __future__ import annotations

import pytest
import torch
from toy_models import SmallNet, image_data

from pytest_robust import adversarial_accuracy
from pytest_robust.attacks.apgd import EARLY, checkpoints
from pytest_robust.attacks.losses import dlr_targeted
from pytest_robust.errors import RobustWarning, SettingError

QUICK = dict(steps=10, square_queries=0)  # enough for a linear model: its worst corner is one signed step away


def linear_problem(classes: int, n: int = 150, d: int = 24, seed: int = 0):
    """A float64 linear classifier and inputs in [0, 1] labelled with its own predictions, but for
    every tenth input, labelled with another class (misclassified before any attack)."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(d, classes).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(classes, d, generator=g, dtype=torch.float64))
        model.bias.copy_(torch.randn(classes, generator=g, dtype=torch.float64))
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    y = model(x).argmax(1).detach()
    y[::10] = (y[::10] + 1) % classes
    return model, x, y


def exact_robust(model: torch.nn.Linear, x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """Closed form for f(x) = Wx + b on the box B = [max(x - eps, 0), min(x + eps, 1)]: the input is
    robust iff it is classified correctly (strictly largest logit) and for every class j != y
    max_{x' in B} (w_j - w_y) x' + b_j - b_y < 0. The maximum separates per coordinate: with
    d = w_j - w_y it is sum_i max(d_i lo_i, d_i hi_i) + b_j - b_y (hi where d_i > 0, lo elsewhere)."""
    w, b = model.weight.detach(), model.bias.detach()
    lo, hi = (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)
    robust = torch.ones(len(y), dtype=torch.bool)
    for j in range(w.shape[0]):
        d = w[j] - w[y]
        worst = torch.maximum(d * lo, d * hi).sum(dim=1) + b[j] - b[y]
        robust &= (worst < 0) | (y == j)  # j == y: the clean margin is covered by the other classes
    return robust


@pytest.mark.parametrize("classes", [2, 3, 10])
def test_exact_on_linear_models_against_the_closed_form(classes):
    model, x, y = linear_problem(classes)
    for eps in (0.02, 0.05, 0.1):
        truth = exact_robust(model, x, y, eps)
        r = adversarial_accuracy(model, (x, y), eps=eps, **QUICK)
        outcome = r.details["per_input"]["outcome"]
        assert [o == "robust" for o in outcome] == truth.tolist(), (classes, eps)
        assert r.estimate == int(truth.sum()) / len(y) and r.lower <= r.estimate <= r.upper
    assert 0 < truth.sum() < len(y) - len(y[::10])  # the radii matter: some robust, some broken


def test_where_cross_entropy_saturates_the_targeted_dlr_stage_still_finds_every_break():
    """Logits scaled by 1000: softmax probabilities of the other classes underflow to 0, so the
    cross-entropy gradient vanishes on confident inputs; the targeted DLR loss is scale invariant."""
    model, x, y = linear_problem(10)
    with torch.no_grad():
        model.weight.mul_(1000)
        model.bias.mul_(1000)
    truth = int(exact_robust(model, x, y, 0.05).sum())
    with pytest.warns(RobustWarning, match=r"gradient was exactly zero at every point .* on \d+ of 150 inputs"):
        untargeted = adversarial_accuracy(model, (x, y), eps=0.05, targets=0, **QUICK)
    full = adversarial_accuracy(model, (x, y), eps=0.05, **QUICK)
    assert untargeted.details["robust_inputs"] > truth == full.details["robust_inputs"]
    assert full.details["stages"][1]["broken"] == untargeted.details["robust_inputs"] - truth
    assert not full.details["gradient_masking"]["suspected"]


class Separated(torch.nn.Module):
    """Two classes, logits (s, -s) with s = sum(x) - 1: class 0 wins iff sum(x) > 1."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        s = x.flatten(1).sum(1) - 1.0
        return torch.stack([s, -s], dim=1) + self.bias


def test_every_stage_attacks_only_the_inputs_still_unbroken():
    """Inputs far from the boundary survive everything and cost the whole schedule; inputs within
    eps of it are broken by APGD-CE within its first steps and leave; misclassified inputs
    cost their clean evaluation only."""
    far, near, wrong = torch.full((5, 4), 0.9), torch.full((3, 4), 0.27), torch.full((2, 4), 0.1)
    x = torch.cat([far, near, wrong])  # sums 3.6 (robust at eps 0.05), 1.08 (broken), 0.4 (class 1)
    y = torch.zeros(len(x), dtype=torch.long)
    steps, queries = 20, 30
    r = adversarial_accuracy(Separated(), (x, y), eps=0.05, steps=steps, restarts=2, targets=3,
                             square_queries=queries)
    spent = dict(r.details["evaluations"])
    near = spent.pop("apgd-ce") - 5 * 2 * (steps + 1)
    assert spent == {
        "probe": 1,  # the number of classes
        "clean": 10,
        "apgd-t": 5 * (1 + 1 * (steps + 1)),  # two classes: one target, one ranking gradient
        "square": 5 * queries,
    }
    # the first signed step reaches the corner where sum(x) = 0.88 < 1: each near input leaves at the
    # early exit after its start (when the start already errs) or after step 2 (EARLY), long before
    # the first checkpoint
    assert 3 * (EARLY[0] + 1) <= near <= 3 * (EARLY[1] + 1) < 3 * (checkpoints(steps)[0] + 1)
    table = r.details["per_input"]
    assert table["outcome"] == ["robust"] * 5 + ["broken"] * 3 + ["misclassified"] * 2
    assert table["stage"] == [""] * 5 + ["apgd-ce"] * 3 + [""] * 2
    assert [(s["name"], s["attacked"], s["broken"]) for s in r.details["stages"]] == [
        ("apgd-ce", 8, 3), ("apgd-t", 5, 0), ("square", 5, 0)]
    assert r.forward_passes == sum(r.details["evaluations"].values()) <= r.budget


def test_per_input_table_schema_and_counts():
    x, y = image_data(n=40)
    r = adversarial_accuracy(SmallNet().eval(), (x, y), eps=0.05, steps=5, targets=2, square_queries=20)
    table = r.details["per_input"]
    assert set(table) == {"index", "outcome", "stage"}
    assert table["index"] == list(range(40)) and len(table["outcome"]) == len(table["stage"]) == 40
    for outcome, stage in zip(table["outcome"], table["stage"]):
        assert outcome in ("robust", "broken", "misclassified")
        assert (stage in ("apgd-ce", "apgd-t", "square")) == (outcome == "broken")
        assert outcome == "broken" or stage == ""
    d = r.details
    assert table["outcome"].count("robust") == d["robust_inputs"] == round(r.estimate * 40)
    assert table["outcome"].count("misclassified") == d["misclassified_inputs"]
    assert sum(s["broken"] for s in d["stages"]) == d["broken_inputs"] > 0
    assert {s["name"]: s["evaluations"] for s in d["stages"]} == {k: v for k, v in d["evaluations"].items()
                                                                  if k not in ("clean", "probe")}
    assert "L-inf eps=0.05" in r.perturbation and "APGD-CE 5 steps" in r.perturbation
    assert "an upper estimate of the true adversarial accuracy: a fail is conclusive, a pass is only as " \
           "strong as the attack" in r.message()
    assert not d["gradient_masking"]["suspected"]
    assert not any("gradient masking" in w for w in d.get("warnings", []))  # the random net is only near chance


class Quantised(torch.nn.Module):
    """Pixels rounded to 0 or 1 (a hard threshold at 0.5, whose gradient is zero everywhere), then
    class 1 iff at least 6 of the 16 pixels are on: gradient attacks cannot move, a random search
    that pushes pixels from 0.41 to 0.51 breaks it."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        on = torch.round(x).flatten(1).sum(1) - 5.5
        return torch.stack([-on, on], dim=1) + self.bias


def test_gradient_masking_is_reported_when_only_the_random_search_breaks_inputs():
    x, y = torch.full((20, 1, 4, 4), 0.41), torch.zeros(20, dtype=torch.long)
    with pytest.warns(RobustWarning, match="gradient masking suspected"):
        r = adversarial_accuracy(Quantised(), (x, y), eps=0.1, steps=10, targets=1, square_queries=50)
    masking = r.details["gradient_masking"]
    assert masking["suspected"] and masking["broken_only_by_square"] == 20 == masking["zero_gradient_inputs"]
    assert r.details["per_input"]["stage"] == ["square"] * 20 and r.estimate == 0.0
    assert any("gradient masking suspected" in w for w in r.details["warnings"])
    assert "gradient masking suspected" in r.message()
    with pytest.warns(RobustWarning, match="gradient masking suspected"):  # without Square: zero gradients
        blind = adversarial_accuracy(Quantised(), (x, y), eps=0.1, steps=10, targets=1, square_queries=0)
    assert blind.estimate == 1.0 and blind.details["gradient_masking"]["zero_gradient_inputs"] == 20


def test_a_budget_attacks_the_inputs_it_pays_for_and_is_refused_only_below_one_input():
    """The worst case counts the targets the model has: SmallNet has 3 classes, so 2 of the 3
    targets asked for, and 2 ranking gradients. A budget below one input's worst case is refused;
    a budget for 3 of the 40 inputs (less than a block of 8) attacks the first 3 of the seeded
    order (the numbers of inputs=3) and says so; the probe is counted."""
    x, y = image_data(n=40)
    per_input = 1 + (2 + 2) * (9 + 1) + 2 + 100
    attack = dict(eps=0.1, steps=9, restarts=2, targets=3, square_queries=100)
    with pytest.raises(SettingError, match=rf"at least {1 + per_input} model evaluations to attack one input .*2 "
                                           r"target\(s\) of 3 classes"):
        adversarial_accuracy(SmallNet().eval(), (x, y), budget=per_input, **attack)
    short = adversarial_accuracy(SmallNet().eval(), (x, y), budget=1 + 3 * per_input, **attack)
    subset = adversarial_accuracy(SmallNet().eval(), (x, y), inputs=3, **attack)
    assert short.details["budget_stop"] == {"attacked": 3, "chosen": 40, "worst_case_per_input": per_input}
    assert short.details["per_input"]["index"] == subset.details["per_input"]["index"]
    assert (short.estimate, short.lower, short.upper) == (subset.estimate, subset.lower, subset.upper)
    assert short.forward_passes <= short.budget
    assert f"paid for 3 of the 40 inputs (each attack costs up to {per_input}" in short.message()
    assert f"so {short.forward_passes} were spent" in short.message()  # what was spent, beside the worst case
    r = adversarial_accuracy(SmallNet().eval(), (x, y), budget=1 + 40 * per_input, **attack)
    assert r.forward_passes <= r.budget and "budget_stop" not in r.details
    assert r.details["attack"]["worst_case_per_input"] == per_input and r.details["attack"]["classes"] == 3
    assert r.details["evaluations"]["probe"] == 1


def test_numbers_do_not_depend_on_the_batch_size():
    x, y = image_data(n=45, size=6, channels=1, n_classes=4, seed=3)
    model = SmallNet(channels=1, size=6, n_classes=4, seed=1).eval()
    run = lambda b: adversarial_accuracy(model, (x, y), eps=0.03, steps=8, targets=3,  # noqa: E731
                                         square_queries=40, batch_size=b)
    results = [run(b) for b in (1024, 16, 7)]
    first = results[0]
    assert first.details["stages"][2]["attacked"] > 0  # every stage ran
    for r in results[1:]:
        assert r.details["per_input"] == first.details["per_input"]
        assert r.forward_passes == first.forward_passes and r.details["evaluations"] == first.details["evaluations"]
    assert run(1024).details["per_input"] == first.details["per_input"]  # and repeats exactly


def test_apgd_checkpoints_and_the_dlr_loss():
    """Croce & Hein's checkpoints p_j (0.22, 0.41, 0.57, ...) and DLR's invariance to shifting and
    positively scaling the logits; with two classes it is the plain margin."""
    assert checkpoints(100) == [22, 41, 57, 70, 80, 87, 93, 99]
    assert checkpoints(4) == [1, 2, 3, 3, 4, 4, 4, 4]
    z = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 4], [4, 0], [1, 3]])
    assert torch.allclose(dlr_targeted(3 * z + 7, labels), dlr_targeted(z, labels), atol=1e-6)
    pair = torch.tensor([[2.0, 5.0]])
    assert dlr_targeted(pair, torch.tensor([[0, 1]])).item() == 3.0


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_apgd_returns_each_broken_row_at_a_misclassified_feasible_point(norm):
    """A fooled row stops moving (step size and momentum 0), so the point APGD returns for it is its
    first misclassified iterate: misclassified, inside the ball and the box; an unbroken row gets
    its best point, also feasible."""
    from pytest_robust.attacks.apgd import apgd
    from pytest_robust.attacks.norms import Ball, L2Ball
    from pytest_robust.engine.forward import Forward
    from pytest_robust.engine.ranking import correct_predictions
    from pytest_robust.perturbations.base import feasible_box

    model, x, y = linear_problem(4, n=120)
    eps = 0.25 if norm == "linf" else 0.8
    ball = Ball(eps) if norm == "linf" else L2Ball(eps)
    lo, hi = feasible_box(x, eps if norm == "linf" else 10.0, None)
    loss = lambda z, t: torch.nn.functional.cross_entropy(z, t, reduction="none")  # noqa: E731
    broken, _, found = apgd(Forward(model, batch_size=64), x.clone(), x, y, y, lo, hi, loss, ball, steps=20)
    assert 0 < int(broken.sum()) < len(x)
    with torch.no_grad():
        wrong = ~correct_predictions(model(found), y)
    assert torch.equal(wrong[broken], torch.ones(int(broken.sum()), dtype=torch.bool))
    d = (found - x).flatten(1)
    size = d.abs().amax(1) if norm == "linf" else d.norm(dim=1)
    assert (size <= eps * (1 + 1e-5)).all() and (found >= lo - 1e-6).all() and (found <= hi + 1e-6).all()


class HalfQuantised(torch.nn.Module):
    """``Quantised`` on the first 10 inputs (zero gradients), a linear model on the others."""

    def __init__(self):
        super().__init__()
        self.quantised, self.linear = Quantised(), torch.nn.Linear(16, 2)

    def forward(self, x):
        flat = torch.arange(len(x), device=x.device) < 10
        return torch.where(flat[:, None], self.quantised(x), self.linear(x.flatten(1)))


@pytest.mark.parametrize("model", [SmallNet, Quantised, HalfQuantised])
def test_flat_gradients_are_watched_only_while_a_row_still_has_them(monkeypatch, model):
    """APGD tests whether each gradient is exactly zero only while some row's every gradient was
    (the flag only turns off): the same per-input outcomes, stages and zero-gradient counts as
    testing at every step, on a model without flat gradients, one with only flat ones and a mix."""
    import pytest_robust.attacks.apgd as apgd

    torch.manual_seed(0)
    net = model().eval()
    x, y = (torch.rand(20, 1, 4, 4), torch.randint(0, 2, (20,))) if model is not SmallNet else image_data(n=20)
    run = lambda: adversarial_accuracy(net, (x, y), eps=0.1, steps=10, targets=1, square_queries=0)  # noqa: E731
    lazy = run()
    evaluate = apgd._evaluate
    monkeypatch.setattr(apgd, "_evaluate", lambda *a: evaluate(*a[:5], True))  # every step, as before
    eager = run()
    assert lazy.details["per_input"] == eager.details["per_input"]
    assert lazy.details["gradient_masking"] == eager.details["gradient_masking"]
    assert (lazy.estimate, lazy.forward_passes) == (eager.estimate, eager.forward_passes)
