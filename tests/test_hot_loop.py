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


def test_smoothing_noise_written_in_pieces_is_the_streams():
    """Draws start..stop-1 of an input are rows of its stream blocks (BLOCK draws each, seeded
    from (seed, "smoothing", input, block)), however the ranges split the blocks."""
    from pytest_robust.checks.smoothing.draws import BLOCK, Noise
    from pytest_robust.engine.streams import stream_seed

    def stream(index: int, blocks: int) -> torch.Tensor:
        return torch.cat([torch.randn((BLOCK, 3, 2), generator=torch.Generator().manual_seed(
            stream_seed(7, "smoothing", index, b))) for b in range(blocks)])

    noise = Noise((3, 2), torch.float32, 7, "cpu")
    for index, ranges in ((4, [(0, 1), (1, 64), (64, 200), (200, 201)]), (9, [(3, 130), (130, 140)]),
                          (4, [(5, 70)])):
        for start, stop in ranges:
            out = noise.write(index, start, stop, torch.empty((stop - start, 3, 2)))
            assert torch.equal(out, stream(index, 4)[start:stop])


def _plain_betaincinv(a: float, b: float, y: float) -> float:
    from pytest_robust.stats.binomial import betainc

    lo, hi = 0.0, 1.0
    while (mid := 0.5 * (lo + hi)) not in (lo, hi):
        lo, hi = (mid, hi) if betainc(a, b, mid) < y else (lo, mid)
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("k, n, y", [(1, 1, 0.05), (3, 10, 0.001), (127, 128, 1e-6), (5000, 10_000, 0.5),
                                     (99_990, 100_000, 0.05), (2, 5, 0.999)])
def test_the_bracketed_beta_inverse_is_the_plain_bisections(k, n, y):
    """The same bisection to the last bit; where I_x itself is noisy (about 1e-12 near the root)
    the two may settle on neighbouring points of that noise, hence rel 1e-12."""
    from pytest_robust.stats.binomial import betaincinv

    assert betaincinv(k, n - k + 1, y) == pytest.approx(_plain_betaincinv(k, n - k + 1, y), rel=1e-12)
