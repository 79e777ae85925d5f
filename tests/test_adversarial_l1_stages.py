"""The L1 stages that follow APGD: FAB-T (the L1-shortest move onto a hyperplane within a box,
checked against scipy's linear programmes; every point it reports inside the ball and the box and
misclassified; on a two-class linear model it breaks exactly the inputs whose smallest perturbation
lies inside the ball, up to its overshoot) and Square-L1 (its profile, points inside the ball and
the box, and the break of a model whose gradient is zero everywhere); and the wide phases of L1's
APGD runs, which ascend to their end without labels (``apgd(y=None)``) where L2's stop at a break."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from toy_models import SmallNet, image_data

from pytest_robust import adversarial_accuracy
from pytest_robust.attacks.fab import ETA, fab, onto_hyperplane
from pytest_robust.attacks.norms import L1Ball, L2Ball
from pytest_robust.attacks.square import eta, square
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.streams import RowStreams
from pytest_robust.errors import RobustWarning
from pytest_robust.perturbations.base import feasible_box


def _l1(v: torch.Tensor) -> torch.Tensor:
    return v.flatten(1).abs().sum(dim=1)


def _shortest(w: np.ndarray, c: float, q: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float | None:
    """min ||d||_1 subject to w.d = c and lo <= q + d <= hi (d = u - v, u, v >= 0), by scipy's
    linear programme; None where no such d exists."""
    k = len(w)
    res = linprog(np.ones(2 * k), A_eq=np.concatenate([w, -w])[None], b_eq=[c],
                  bounds=[(0, h) for h in hi - q] + [(0, v) for v in q - lo], method="highs")
    return res.fun if res.status == 0 else None


def test_the_hyperplane_move_is_the_l1_shortest_within_the_box():
    """Where the hyperplane is within the box's reach the move reaches it (w.d = c) at the linear
    programme's optimal L1 length; where it is not, every coordinate moves as far as the box allows
    towards it. Float64, so the tolerance is a few ulps of the sums (1e-9 relative)."""
    g = torch.Generator().manual_seed(0)
    n, k = 40, 12
    q = torch.rand(n, k, generator=g, dtype=torch.float64)
    lo, hi = (q - 0.3).clamp(0, 1), (q + 0.3).clamp(0, 1)
    w = torch.randn(n, k, generator=g, dtype=torch.float64) * (torch.rand(n, k, generator=g) > 0.2)  # some zeros
    c = torch.randn(n, generator=g, dtype=torch.float64) * 1.5
    d = onto_hyperplane(q, w, c, lo, hi)
    assert ((q + d >= lo - 1e-12) & (q + d <= hi + 1e-12)).all()
    reached = 0
    for i in range(n):
        best = _shortest(w[i].numpy(), float(c[i]), q[i].numpy(), lo[i].numpy(), hi[i].numpy())
        if best is None:  # out of reach: the largest w.d of c's sign the box allows
            room = torch.where(w[i] * c[i].sign() > 0, hi[i] - q[i], lo[i] - q[i])
            assert torch.allclose(d[i][w[i] != 0], room[w[i] != 0], rtol=0, atol=1e-12)
        else:
            reached += 1
            assert float(w[i] @ d[i]) == pytest.approx(float(c[i]), rel=1e-9, abs=1e-12)
            assert float(_l1(d[i : i + 1])) == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert 10 < reached < n  # both cases occur


def _binary_linear(n=80, k=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(k, 2).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(2, k, generator=g, dtype=torch.float64))
        model.bias.copy_(torch.randn(2, generator=g, dtype=torch.float64))
    x = torch.rand(n, k, generator=g, dtype=torch.float64)
    return model, x, model(x).argmax(1).detach()


def test_fab_breaks_a_binary_linear_model_where_the_shortest_flip_is_inside_the_ball():
    """On f(x) = Wx + b with two classes the boundary is a hyperplane, so FAB's first step lands on
    it, ETA past it. Every input whose L1-shortest flip within the box is at most eps / ETA is
    broken, no input whose flip needs more than eps is (soundness), and every point reported is
    misclassified, in the box and in the ball."""
    model, x, y = _binary_linear()
    eps = 0.6
    lo, hi = feasible_box(x, eps, (0.0, 1.0))
    broken, found = fab(Forward(model, batch_size=64), x, y, 1 - y, lo, hi, eps, steps=20)
    w = (model.weight[1] - model.weight[0]).detach()
    gap = (model(x)[:, 1] - model(x)[:, 0]).detach()
    shortest = []
    for i in range(len(y)):
        wi = w if y[i] == 0 else -w
        need = -(gap[i] if y[i] == 0 else -gap[i])  # wi.d must reach this for the other class to tie
        s = _shortest(wi.numpy(), float(need), x[i].numpy(), np.zeros(16), np.ones(16))
        shortest.append(np.inf if s is None else s)
    shortest = torch.tensor(shortest, dtype=torch.float64)
    assert broken[shortest <= eps / ETA - 1e-9].all()
    assert not broken[shortest > eps].any()
    assert 5 < int(broken.sum()) < len(y) - 5  # the radius matters
    hit = found[broken]
    assert (_l1(hit - x[broken]) <= eps + 1e-12).all() and ((hit >= lo[broken]) & (hit <= hi[broken])).all()
    assert (model(hit).argmax(1) != y[broken]).all()


def test_fab_stage_points_stay_in_the_ball_and_box_in_low_precision():
    """FAB-T's iterates are float32 whatever the model's dtype: the points the check keeps for a
    bfloat16 model lie in the L1 ball and the box."""
    x, y = image_data(n=24)
    r = adversarial_accuracy(SmallNet().eval().bfloat16(), (x, y), eps=1.0, norm="l1", steps=10, restarts=1,
                             fab_steps=15, square_queries=0, threshold=None)
    fab_row = next(s for s in r.details["stages"] if s["name"] == "fab-t")
    assert fab_row["attacked"] > 0 and r.details["evaluations"]["fab-t"] > 0


def test_the_l1_profile_is_two_opposite_halves_of_sharp_nested_squares_of_equal_mass():
    """Over 3 x 3 the first half (one row) is 1 + 1/16 at its centre and 1/16 beside it (the
    profile sum_{k >= r} 1/(k+1)^4), and each half carries half of the unit L1 mass."""
    e = eta(3, 3, 1)
    assert torch.allclose(e[0] / e[0, 1], torch.tensor([1 / 17, 1, 1 / 17], dtype=e.dtype))
    assert (e[0] > 0).all() and (e[1:] < 0).all()
    assert abs(e.abs().sum().item() - 1) < 1e-12 and abs(e[0].abs().sum().item() - e[1:].abs().sum().item()) < 1e-12


def test_square_l1_points_stay_in_the_ball_and_the_box():
    """Every point Square-L1 reports lies within L1 distance eps of its input (its proposals are
    rescaled to mass eps in float32, so a point rounded just outside is not counted) and in the
    box, and is misclassified."""
    x, y = image_data(n=16)
    model, eps = SmallNet().eval(), 2.0
    lo, hi = feasible_box(x, eps, (0.0, 1.0))
    streams = RowStreams([torch.Generator().manual_seed(i) for i in range(2)], [8, 8], x.device, x.dtype)
    fooled, found = square(Forward(model, batch_size=64), x, y, lo, hi, torch.arange(16), L1Ball(eps), 60, streams)
    assert fooled.any()
    assert (_l1(found - x) <= eps).all() and ((found >= lo) & (found <= hi)).all()
    assert (model(found[fooled]).argmax(1) != y[fooled]).all()


class Peak(torch.nn.Module):
    """Class 1 iff some pixel, quantised to steps of 1/20, reaches 0.9: the gradient is zero
    everywhere, but the margin still falls as the largest pixel rises, which a random search can
    follow. From 0.3 a sparse L1 move of 0.6 breaks it; a random start, spread over every pixel,
    does not."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        top = (torch.floor(x * 20) / 20).flatten(1).amax(1) - 0.875
        return torch.stack([-top, top], dim=1) + self.bias


def test_square_l1_breaks_what_zero_gradients_hide_and_the_masking_warning_fires():
    """APGD and FAB-T cannot move on a zero gradient; Square-L1 concentrates its mass on one pixel
    and breaks half of the inputs (8 of 16 on this seed; at least 4 asked), and the check warns."""
    x, y = torch.full((16, 1, 4, 4), 0.3), torch.zeros(16, dtype=torch.long)
    with pytest.warns(RobustWarning, match="gradient masking suspected"):
        r = adversarial_accuracy(Peak(), (x, y), eps=1.0, norm="l1", steps=10, restarts=1, fab_steps=10,
                                 square_queries=300)
    assert r.details["per_input"]["stage"].count("square") >= 4
    assert set(r.details["per_input"]["stage"]) <= {"square", ""}
    assert r.details["gradient_masking"]["broken_only_by_square"] >= 4


@pytest.mark.parametrize("ball", [L1Ball(3.0), L2Ball(1.0)], ids=["l1", "l2"])
def test_square_never_counts_a_point_rounded_outside_the_ball(ball):
    """A 10-class linear model on (3, 16, 16) inputs, where float32 rescaling to length (L1: mass)
    eps leaves some proposals a few ulps outside the ball (at L2 1.0, one of 64 rows without the
    check), and float32 sums of 768 coordinates err by more than that: no reported point lies
    outside the ball, its length summed in float64, for any of the models (seeds) tried."""
    for seed in range(12):
        torch.manual_seed(seed)
        _square_points_inside(ball)


def _square_points_inside(ball):
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(768, 10))
    x = torch.rand(64, 3, 16, 16, generator=g)
    with torch.no_grad():
        y = model(x).argmax(1)
    lo, hi = feasible_box(x, ball.eps, (0.0, 1.0))
    streams = RowStreams([torch.Generator().manual_seed(i) for i in range(8)], [8] * 8, x.device, x.dtype)
    fooled, found = square(Forward(model, batch_size=64), x, y, lo, hi, torch.arange(64), ball, 200, streams)
    offsets = found[fooled].flatten(1).double() - x[fooled].flatten(1).double()
    assert fooled.any() and (offsets.norm(p=1 if ball.name == "l1" else 2, dim=1) <= ball.eps).all()


def test_more_targets_than_the_ranking_pool_are_ranked():
    """With 12 classes, 10 FAB-T targets: the first-order ranking covers them all (10 gradients)."""
    g = torch.Generator().manual_seed(1)
    model = torch.nn.Linear(20, 12)
    x = torch.rand(16, 20, generator=g)
    with torch.no_grad():
        y = model(x).argmax(1)
    r = adversarial_accuracy(model, (x, y), eps=0.5, norm="l1", steps=10, restarts=1, fab_targets=10, fab_steps=5,
                             square_queries=0, bounds=(0.0, 1.0))
    assert "FAB-T 5 steps x 10 target(s)" in r.perturbation
    assert r.forward_passes <= r.budget


def test_apgd_without_labels_ascends_every_row_to_its_end_and_returns_its_best_point():
    """``apgd(y=None)``, a wide L1 phase: no row counts as broken or leaves the run, even where the
    start is already misclassified, each takes every step (steps + 1 evaluations) and hands on the
    point of highest loss it visited, inside the ball and the box."""
    from pytest_robust.attacks.apgd import apgd
    from pytest_robust.attacks.losses import cross_entropy

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 3)
    x, y = torch.rand(30, 16), torch.randint(0, 3, (30,))
    ball, steps = L1Ball(2.0), 12
    lo, hi = feasible_box(x, 2.0, (0.0, 1.0))
    forward = Forward(model, batch_size=64)
    broken, _, best = apgd(forward, x.clone(), x, None, y, lo, hi, cross_entropy, ball, steps)
    assert not broken.any() and forward.passes == len(x) * (steps + 1)
    loss = lambda p: torch.nn.functional.cross_entropy(model(p), y, reduction="none")  # noqa: E731
    with torch.no_grad():
        assert (loss(best) >= loss(x) - 1e-6).all() and (loss(best) > loss(x) + 1e-3).any()
        assert (_l1(best - x) <= 2.0 * (1 + 1e-5)).all() and ((best >= 0) & (best <= 1)).all()
        judged = Forward(model, batch_size=64)
        apgd(judged, x.clone(), x, y, y, lo, hi, cross_entropy, ball, steps)
        assert judged.passes < forward.passes  # with labels, the misclassified rows leave early


@pytest.mark.parametrize("norm, judged", [("l1", [False, False, False, True]), ("l2", [True] * 4)])
def test_wide_l1_phases_ascend_to_their_end_and_l2_ones_stop_at_the_first_break(monkeypatch, norm, judged):
    """L1's wide phases (8, 4, 2 eps) run without labels and hand on their best point, as
    AutoAttack's large-radius start does; only the eps phase judges. L2's judge every phase."""
    from pytest_robust.checks.adversarial import ensemble

    calls, apgd = [], ensemble.apgd

    def recorded(forward, x0, center, y, *args):
        calls.append(y is not None)
        return apgd(forward, x0, center, y, *args)

    monkeypatch.setattr(ensemble, "apgd", recorded)
    model, (x, y) = SmallNet().eval(), image_data(n=8)
    adversarial_accuracy(model, (x, y), eps=0.05 if norm == "l2" else 0.2, norm=norm, restarts=1, targets=0,
                         fab_targets=0, square_queries=0, steps=20, seed=0)
    assert calls == judged
