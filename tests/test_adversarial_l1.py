"""The adversarial-accuracy check in L1: the ball's projection, first-order maximiser and sparse
step, exactness on linear models with the box (checked against linear programmes), the noise of
the L1 ball, and the stage layout and defaults."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from test_adversarial import QUICK, linear_problem

from pytest_robust import UniformL1, adversarial_accuracy
from pytest_robust.attacks.norms import SPARSITY, L1Ball
from pytest_robust.errors import SettingError


def _problem(n=64, shape=(3, 4, 4), eps=1.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, *shape, generator=g, dtype=torch.float64)
    lo, hi = (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)
    return L1Ball(eps), x, lo, hi, g


def _l1(v: torch.Tensor) -> torch.Tensor:
    return v.flatten(1).abs().sum(dim=1)


def _lp_gain(c: np.ndarray, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, eps: float) -> float:
    """max c.d over ||d||_1 <= eps, lo <= x + d <= hi, by scipy's linear programme (d = p - q)."""
    k = len(c)
    res = linprog(np.concatenate([-c, c]), A_ub=np.ones((1, 2 * k)), b_ub=[eps],
                  bounds=[(0, h) for h in hi - x] + [(0, v) for v in x - lo], method="highs")
    assert res.status == 0
    return -res.fun


def test_the_projection_is_feasible_and_the_closest_feasible_point():
    """p = P(z) lies in the ball and the box, and satisfies the projection's variational inequality
    (z - p).(q - p) <= 0 for feasible points q: random starts and the set's vertices (the greedy
    maximisers of random directions). Points already feasible do not move."""
    ball, x, lo, hi, g = _problem()
    z = x + 0.5 * torch.randn(x.shape, generator=g, dtype=x.dtype)
    p = ball.project(z, x, lo, hi)
    assert (_l1(p - x) <= ball.eps * (1 + 1e-9)).all() and (p >= lo).all() and (p <= hi).all()
    assert (_l1(z - x) > ball.eps).all()  # every row needed the threshold, not only the clamp
    for _ in range(40):
        q = ball.random_start(x, lo, hi, torch.rand(x.shape, generator=g, dtype=x.dtype))
        vertex = ball.best(torch.randn(x.shape, generator=g, dtype=x.dtype), x, lo, hi)
        for point in (q, vertex):
            assert ((z - p) * (point - p)).flatten(1).sum(dim=1).max() <= 1e-9
    inside = x + (p - x) * 0.5
    assert torch.allclose(ball.project(inside, x, lo, hi), inside, atol=1e-12)


def test_the_first_order_maximiser_matches_a_linear_programme():
    """gain(d) = max d.(x' - x) over the ball and the box, reached at best(d): against scipy's
    linear programme, for radii where the box binds and where it does not."""
    for eps in (0.3, 1.5, 6.0):
        ball, x, lo, hi, g = _problem(n=12, shape=(10,), eps=eps, seed=1)
        d = torch.randn(x.shape, generator=g, dtype=x.dtype)
        gain, best = ball.gain(d, x, lo, hi), ball.best(d, x, lo, hi)
        assert torch.allclose((d * (best - x)).sum(dim=1), gain, atol=1e-9)
        assert (_l1(best - x) <= eps + 1e-9).all() and (best >= lo).all() and (best <= hi).all()
        for i in range(len(x)):
            assert gain[i].item() == pytest.approx(_lp_gain(d[i].numpy(), x[i].numpy(), lo[i].numpy(),
                                                            hi[i].numpy(), eps), abs=1e-7)


def test_the_sparse_step_has_unit_l1_norm_on_few_coordinates():
    """The step is sign(g) on the k coordinates of largest |g|, k = ceil(min(support / 1.5,
    SPARSITY D)) (at least 1), scaled to L1 norm 1."""
    ball, x, lo, hi, g = _problem(n=8, shape=(50,))
    grad = torch.randn(x.shape, generator=g, dtype=x.dtype)
    for support, k in ((0, 1), (3, 2), (15, 10), (50, 10)):
        d = torch.zeros_like(x)
        d[:, :support] = 0.01
        step = ball.ascent(grad, x + d, x)
        assert torch.allclose(_l1(step), torch.ones(len(x), dtype=x.dtype))
        assert ((step != 0).sum(dim=1) == k).all() and k == max(1, min(int(np.ceil(support / 1.5)),
                                                                       int(SPARSITY * 50)))
        top = grad.abs().topk(k, dim=1).indices
        assert torch.equal(step.gather(1, top).sign(), grad.gather(1, top).sign())


def exact_robust_l1(model: torch.nn.Linear, x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """Robust iff correctly classified and, for every class j != y, the clean gap z_j - z_y plus the
    largest gain of (w_j - w_y).d over the L1 ball and the [0, 1] box (a linear programme) stays
    below 0."""
    w, z = model.weight.detach(), model(x).detach()
    robust = z.argmax(dim=1) == y
    for i in range(len(y)):
        for j in range(w.shape[0]):
            if j != y[i] and robust[i]:
                c = (w[j] - w[y[i]]).numpy()
                gain = _lp_gain(c, x[i].numpy(), np.zeros(len(c)), np.ones(len(c)), eps)
                robust[i] = bool(z[i, j] - z[i, y[i]] + gain < 0)
    return robust


@pytest.mark.parametrize("classes", [2, 3])
def test_l1_is_exact_on_linear_models_with_the_box(classes):
    """The ranked start of each target is the greedy maximiser of its gap: the exact worst point of
    the L1 ball within the box, so every target settles its input at the start."""
    model, x, y = linear_problem(classes, n=60)
    counts = []
    for eps in (0.5, 1.5):
        truth = exact_robust_l1(model, x, y, eps)
        counts.append(int(truth.sum()))
        r = adversarial_accuracy(model, (x, y), eps=eps, norm="l1", **QUICK)
        assert [o == "robust" for o in r.details["per_input"]["outcome"]] == truth.tolist(), (classes, eps)
        assert r.perturbation.startswith(f"L1 eps={eps:g}")
    assert any(0 < k < len(y) - len(y[::10]) for k in counts)  # the radii matter


def test_l1_defaults_and_the_cost_of_every_stage():
    """In L1 APGD widens through 8, 4 and 2 eps before eps (one evaluation more per phase); by
    default APGD runs 20 steps and APGD-CE restarts 20 times, APGD-T is off, FAB-T runs on 2 ranked
    targets (each after its first-order point) and Square-L1 on 25 queries; the worst case counts
    every part. L-inf keeps its 50 steps."""
    model, x, y = linear_problem(3, n=20)
    r = adversarial_accuracy(model, (x, y), eps=0.5, norm="l1")
    a = r.details["attack"]
    assert (a["steps"], a["restarts"], a["targets"], a["fab_targets"], a["fab_steps"], a["square_queries"]) == (
        20, 20, 0, 2, 40, 25)
    assert r.perturbation.endswith("FAB-T 40 steps x 2 target(s), Square 25 queries; each APGD run starts wide "
                                   "(8, 4, 2 x eps)")
    run = 20 + len(L1Ball.widening)
    assert a["worst_case_per_input"] == 1 + 20 * run + 2 + 2 * (40 + 1) + 25  # 2 ranking gradients (3 classes)
    assert [s["name"] for s in r.details["stages"]] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    once = adversarial_accuracy(model, (x, y), eps=0.5, norm="l1", steps=10, restarts=1, targets=1, fab_targets=0,
                                square_queries=0)
    run = 10 + len(L1Ball.widening)
    assert once.details["attack"]["worst_case_per_input"] == 1 + 2 * run + 2
    assert "FAB-T" not in once.perturbation and "Square" not in once.perturbation
    linf = adversarial_accuracy(model, (x, y), eps=0.05, restarts=1, targets=0, square_queries=0)
    assert linf.details["attack"]["steps"] == 50


def test_fab_targets_outside_l1_is_a_setting_error():
    model, x, y = linear_problem(3, n=10)
    with pytest.raises(SettingError, match="fab_targets.*built for norm='l1' only"):
        adversarial_accuracy(model, (x, y), eps=0.1, norm="linf", fab_targets=2)
    r = adversarial_accuracy(model, (x, y), eps=0.1, norm="l2", **QUICK)
    assert [s["name"] for s in r.details["stages"]] == ["apgd-ce", "apgd-t", "square"]  # no FAB-T row


def test_uniform_l1_noise_stays_in_the_ball_and_fills_it():
    """UniformL1 draws lie in the L1 ball; their radius ||delta||_1 / eps follows U^(1/D): its mean
    is D / (D + 1) (without a box to clip)."""
    x = torch.zeros(4000, 6, dtype=torch.float64)
    delta = UniformL1(eps=0.5, bounds=None).sample(x, torch.Generator().manual_seed(0)) - x
    radius = _l1(delta) / 0.5
    assert (radius <= 1 + 1e-12).all()
    assert radius.mean().item() == pytest.approx(6 / 7, abs=4 * (6 / 8 - (6 / 7) ** 2) ** 0.5 / 4000 ** 0.5)
