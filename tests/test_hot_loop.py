"""The hot loops' faster paths give exactly the numbers of the plain computations they replace:
blocks of draws perturbed in one call (``Perturbation.draw_blocks``) against block by block, the
confidence sequence's bracketed bisection over cached running means against the plain bisection
with ``rejects_at``, and the forward pass's top-two logits (``Forward.ranked``) against
``correct_predictions`` and the tie count of ``Forward.logits``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pytest_robust as pr
from pytest_robust.engine.forward import Forward, correct_predictions
from pytest_robust.stats import confidence_sequence, rejects_at

PER_FEATURE = torch.tensor([0.0, 0.05, 0.2])


@pytest.mark.parametrize("perturbation", [
    pr.UniformLinf(eps=0.1), pr.UniformLinf(eps=PER_FEATURE, bounds=None), pr.GaussianNoise(sigma=0.2),
    pr.GaussianNoise(sigma=PER_FEATURE, bounds=None), pr.CauchyNoise(scale=0.05), pr.UniformL2(eps=0.3),
], ids=repr)
def test_blocks_drawn_in_one_call_are_the_blocks_drawn_alone(perturbation):
    x = torch.rand(3 * 8, 5, 3, generator=torch.Generator().manual_seed(0))
    generators = lambda: [torch.Generator().manual_seed(s) for s in (11, 12, 13)]  # noqa: E731
    index, y = torch.arange(len(x)), torch.zeros(len(x), dtype=torch.long)
    together = perturbation.draw_blocks(x, generators(), index, y)
    alone = torch.cat([perturbation.draw(x[j * 8:(j + 1) * 8], g, index[j * 8:(j + 1) * 8], y[:8])
                       for j, g in enumerate(generators())])
    assert torch.equal(together, alone) and not torch.equal(together, x)
    assert torch.equal(x, torch.rand(3 * 8, 5, 3, generator=torch.Generator().manual_seed(0)))  # x untouched


def _plain(x: np.ndarray, alpha: float, known: float = 0.0, tol: float = 1e-6) -> float:
    """The lower bound by the plain bisection on ``rejects_at`` (the definition)."""
    lo = max(known, 0.0)
    if len(x) == 0 or rejects_at(x, max(lo, tol), alpha) is None:
        return lo
    lo, hi = max(lo, tol), 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rejects_at(x, mid, alpha) is not None else (lo, mid)
    return lo


@pytest.mark.parametrize("seed", range(12))
def test_the_confidence_sequence_is_the_plain_bisections(seed):
    rng = np.random.default_rng(seed)
    n, p = int(rng.integers(1, 30_000)), float(rng.choice([0.02, 0.3, 0.5, 0.87, 0.995, 1.0]))
    x = (rng.random(n) < p).astype(float) if seed % 4 else rng.random(n)  # outcomes, or values in [0, 1]
    alpha, known = (0.05, 0.0) if seed % 2 else (0.001, 0.5 * x.mean())
    lower, upper = confidence_sequence(x, alpha, lower_at_least=known)
    assert lower == _plain(x, alpha, known)
    assert upper == 1.0 - _plain(1.0 - x, alpha)


def test_the_top_two_logits_give_the_correct_predictions_and_ties_of_the_logits():
    z = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))
    z[::7, 1] = z[::7, 0] = 5.0  # ties, counted as errors
    model = torch.nn.Identity()
    y = torch.randint(0, 4, (300,), generator=torch.Generator().manual_seed(1))
    plain, ranked = Forward(model, batch_size=64), Forward(model, batch_size=64)
    expected = correct_predictions(plain.logits(z), y)
    assert torch.equal(ranked.correct(z, y), expected)
    assert int(ranked.ties) == int(plain.ties) == len(range(0, 300, 7))
    assert ranked.passes == plain.passes == 300
