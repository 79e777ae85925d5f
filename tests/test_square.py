"""The Square attack (attacks/square.py): the L2 proposal profile against its closed form, the
L2 windows, the L2 search inside the ball and the box, and its strength where L2 gradients are
masked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pytest_robust import adversarial_accuracy
from pytest_robust.attacks.norms import L2Ball
from pytest_robust.attacks.square import eta, l2_window_sides, square
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.streams import RowStreams
from pytest_robust.errors import RobustWarning


def test_eta_is_two_opposite_halves_of_nested_squares_of_equal_energy():
    """Over 3 x 3 the first half (one row) is 1/1 + 1/4 at its centre and 1/4 beside it; the second
    (two rows, centre at its second row) likewise: the profile sum_{k >= r} 1/(k+1)^2."""
    e = eta(3, 3)
    assert torch.allclose(e[0] / e[0, 1], torch.tensor([0.2, 1, 0.2], dtype=e.dtype))
    assert torch.allclose(e[1:] / e[2, 1], torch.tensor([[0.2, 0.2, 0.2], [0.2, 1, 0.2]], dtype=e.dtype))
    assert (e[0] > 0).all() and (e[1:] < 0).all()
    assert abs(e.norm().item() - 1) < 1e-12 and abs(e[0].norm().item() - e[1:].norm().item()) < 1e-12
    assert torch.equal(eta(2, 5), eta(5, 2).T)
    five = eta(5, 5)[2:]  # the second half: 3 x 5 around (1, 2), Chebyshev rings 0, 1, 2
    ring = torch.tensor([[2, 1, 1, 1, 2], [2, 1, 0, 1, 2], [2, 1, 1, 1, 2]])
    tail = {r: sum(1 / (k + 1) ** 2 for k in range(r, 3)) for r in range(3)}
    expected = torch.tensor([[tail[int(r)] for r in row] for row in ring], dtype=five.dtype)
    assert torch.allclose(five / five[2, 2], expected / expected[2, 2])


def test_l2_windows_are_odd_at_least_three_and_fit_the_input():
    assert l2_window_sides(0.8, 8, 8) == (7, 7)  # round(sqrt(51.2)) = 7
    assert l2_window_sides(0.8, 32, 32) == (29, 29)  # 28.6 -> 29
    assert l2_window_sides(0.01, 8, 8) == (3, 3)
    assert l2_window_sides(0.8, 2, 2) == (1, 1)  # odd, within the input: 3 does not fit
    assert l2_window_sides(0.5, 1, 30) == (1, 15)


class _Recording(torch.nn.Module):
    """A linear margin 1000 - sum(x) that no point of a small ball breaks, recording every input."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        self.seen.append(x.detach().clone())
        s = x.flatten(1).sum(1) + self.w
        return torch.stack([1000 - s, torch.zeros_like(s)], dim=1)


def _search(model, x, eps, queries, seed=0):
    y = torch.zeros(len(x), dtype=torch.long)
    lo, hi = (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)
    streams = RowStreams.single(torch.Generator().manual_seed(seed), len(x))
    return square(Forward(model, batch_size=64), x, y, lo, hi, torch.arange(len(x)), L2Ball(eps), queries, streams)


@pytest.mark.parametrize("shape", [(6, 3, 8, 8), (6, 30), (6, 2, 17), (6, 1, 5, 9)],
                         ids=["images", "tabular", "sequences", "non-square"])
def test_every_l2_point_lies_in_the_ball_and_the_box(shape):
    """Images, tabular rows (windows are intervals, seen broken by a new user's 30-feature data),
    sequences and non-square images."""
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(1))
    model = _Recording()
    broken, _ = _search(model, x, 0.7, 60)
    assert not broken.any()
    for points in model.seen:
        assert points.min() >= 0 and points.max() <= 1
        assert ((points - x[: len(points)]).flatten(1).norm(dim=1) <= 0.7 * (1 + 1e-5)).all()


def test_l2_square_breaks_the_digits_that_gradients_miss_on_the_linf_trained_model(monkeypatch):
    """The L-inf-PGD-trained digits model attacked in L2 (eps 1.0) keeps many inputs against
    APGD confined to the eps ball, whose L2 gradients it masks, as models trained against L-inf
    attacks often do; AutoAttack's Square-L2 and FAB-T break them. With the widening start turned
    off (it breaks most of them itself), on the first 96 test digits the gradient stages leave 23
    unbroken and this Square (250 queries) breaks 17 of them; the simpler square-window search it
    replaced broke none. The bar, at least half, leaves room for other CPUs' float rounding."""
    monkeypatch.setattr(L2Ball, "widening", ((1.0, 1.0),))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "digits"))
    from digits_model import digits_split, load_model

    x, y = digits_split()[1]
    model = load_model("pgd")
    with pytest.warns(RobustWarning, match="gradient masking suspected"):
        runs = {queries: adversarial_accuracy(model, (x[:96], y[:96]), eps=1.0, norm="l2", steps=20, targets=2,
                                              square_queries=queries, seed=0) for queries in (0, 250)}
    left_by_gradients = runs[0].details["robust_inputs"]
    broken_by_square = {s["name"]: s["broken"] for s in runs[250].details["stages"]}["square"]
    assert left_by_gradients >= 10, left_by_gradients
    assert broken_by_square >= left_by_gradients / 2, (broken_by_square, left_by_gradients)
    assert runs[250].details["gradient_masking"]["suspected"]  # the user is told the figure may be too high
