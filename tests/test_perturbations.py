"""pytest_robust.perturbations: box constraints, distributions, reproducibility, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch

from pytest_robust.perturbations import (
    CallablePerturbation,
    CauchyNoise,
    GaussianNoise,
    Perturbation,
    UniformLinf,
    as_perturbation,
)

KINDS = [
    lambda bounds=(0.0, 1.0): UniformLinf(eps=0.2, bounds=bounds),
    lambda bounds=(0.0, 1.0): GaussianNoise(sigma=0.3, bounds=bounds),
    lambda bounds=(0.0, 1.0): CauchyNoise(scale=0.3, bounds=bounds),
]
KIND_IDS = ["uniform", "gaussian", "cauchy"]


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def images(n=64, c=3, h=5, w=5, seed=123):
    return torch.rand(n, c, h, w, generator=gen(seed))


# ---------------------------------------------------------------------------------------------
# the box
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", KINDS, ids=KIND_IDS)
def test_default_box_is_unit_interval(make):
    x = images()
    x[0] = 0.0  # rows sitting on the edges of the box
    x[1] = 1.0
    out = make()(x, gen(1))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert not torch.equal(out, x)


@pytest.mark.parametrize("make", KINDS, ids=KIND_IDS)
def test_custom_scalar_box(make):
    x = images() * 4 - 2  # inputs in [-2, 2]
    out = make((-2.0, 2.0))(x, gen(2))
    assert out.min() >= -2.0 and out.max() <= 2.0
    # a narrower box than the data clips the data into it
    out = make((-1.0, 0.5))(x, gen(2))
    assert out.min() >= -1.0 and out.max() <= 0.5


@pytest.mark.parametrize("make", KINDS, ids=KIND_IDS)
def test_per_channel_tensor_box(make):
    lo = torch.tensor([0.0, -1.0, 2.0]).view(3, 1, 1)
    hi = torch.tensor([1.0, 1.0, 2.5]).view(3, 1, 1)
    x = lo + images() * (hi - lo)  # each channel inside its own box
    out = make((lo, hi))(x, gen(3))
    assert out.shape == x.shape
    assert (out >= lo).all() and (out <= hi).all()
    for c in range(3):  # each channel keeps to its own box, not to the union of the boxes
        assert out[:, c].min() < lo[c] + 0.25 * (hi[c] - lo[c])
        assert out[:, c].max() > hi[c] - 0.25 * (hi[c] - lo[c])
    assert not torch.equal(out, x)


def test_box_off_lets_values_leave_unit_interval():
    x = torch.full((2000, 1), 0.95)
    out = GaussianNoise(sigma=0.2, bounds=None)(x, gen(4))
    assert out.max() > 1.0 and out.min() < 0.95


def test_box_clipping_with_gaussian_piles_mass_on_the_edge():
    # documented: Gaussian noise is a clipped draw (unlike UniformLinf)
    x = torch.full((10_000, 1), 0.95)
    out = GaussianNoise(sigma=0.2)(x, gen(5))
    at_edge = (out == 1.0).float().mean().item()
    assert at_edge == pytest.approx(scipy.stats.norm.sf(0.05 / 0.2), abs=0.02)


# ---------------------------------------------------------------------------------------------
# UniformLinf
# ---------------------------------------------------------------------------------------------


def test_uniform_linf_stays_within_eps():
    x = images(n=200)
    for eps in (0.0, 1e-3, 8 / 255, 0.3, 2.0):
        out = UniformLinf(eps=eps)(x, gen(6))
        assert (out - x).abs().max() <= eps + 1e-6
        assert out.min() >= 0.0 and out.max() <= 1.0
    assert torch.equal(UniformLinf(eps=0.0)(x, gen(6)), x)


@pytest.mark.parametrize("x0,eps,lo,hi", [(0.5, 0.1, 0.4, 0.6), (0.05, 0.2, 0.0, 0.25), (0.9, 0.3, 0.6, 1.0),
                                          (0.5, 0.5, 0.0, 1.0), (0.3, 2.0, 0.0, 1.0)])
def test_uniform_linf_is_uniform_on_the_intersection(x0, eps, lo, hi):
    """x' ~ U[max(x - eps, 0), min(x + eps, 1)]: KS test, mean and variance, no atom on the edge."""
    x = torch.full((20_000, 1), x0, dtype=torch.float64)
    out = UniformLinf(eps=eps)(x, gen(7)).squeeze(1).numpy()
    assert out.min() >= lo and out.max() <= hi
    assert scipy.stats.kstest(out, scipy.stats.uniform(loc=lo, scale=hi - lo).cdf).pvalue > 0.001
    width = hi - lo
    se_mean = width / math.sqrt(12 * len(out))
    assert out.mean() == pytest.approx((lo + hi) / 2, abs=5 * se_mean)
    assert out.var() == pytest.approx(width**2 / 12, rel=0.05)
    assert np.mean(out == lo) + np.mean(out == hi) < 1e-3  # not a clipped draw


def test_uniform_linf_per_channel_box_intersection():
    lo = torch.tensor([0.0, 0.5]).view(2, 1, 1)
    hi = torch.tensor([1.0, 0.6]).view(2, 1, 1)
    x = torch.tensor([0.02, 0.58]).view(1, 2, 1, 1).expand(30_000, 2, 1, 1).contiguous()
    out = UniformLinf(eps=0.1, bounds=(lo, hi))(x, gen(8)).reshape(30_000, 2).numpy()
    # channel 0: U[0, 0.12]; channel 1: U[0.5, 0.6]
    for col, (a, b) in enumerate([(0.0, 0.12), (0.5, 0.6)]):
        v = out[:, col]
        assert v.min() >= a - 1e-7 and v.max() <= b + 1e-7
        assert scipy.stats.kstest(v, scipy.stats.uniform(loc=a, scale=b - a).cdf).pvalue > 0.001


def test_uniform_linf_coordinates_are_independent():
    x = torch.full((20_000, 2), 0.5, dtype=torch.float64)
    out = UniformLinf(eps=0.5)(x, gen(9)).numpy()
    assert abs(np.corrcoef(out[:, 0], out[:, 1])[0, 1]) < 0.03


# ---------------------------------------------------------------------------------------------
# Gaussian and Cauchy noise
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.05, 0.5, 3.0])
def test_gaussian_unclipped_mean_and_std(sigma):
    n = 50_000
    x = torch.full((n, 1), 0.3, dtype=torch.float64)
    noise = (GaussianNoise(sigma=sigma, bounds=None)(x, gen(10)) - x).squeeze(1).numpy()
    assert noise.mean() == pytest.approx(0.0, abs=5 * sigma / math.sqrt(n))
    assert noise.std() == pytest.approx(sigma, rel=0.02)
    assert scipy.stats.kstest(noise, scipy.stats.norm(scale=sigma).cdf).pvalue > 0.001


def test_gaussian_zero_sigma_is_identity():
    x = images()
    assert torch.equal(GaussianNoise(sigma=0)(x, gen(11)), x)


@pytest.mark.parametrize("scale", [0.01, 0.2, 5.0])
def test_cauchy_unclipped_quantiles(scale):
    n = 200_000
    x = torch.full((n, 1), -1.0, dtype=torch.float64)
    out = CauchyNoise(scale=scale, bounds=None)(x, gen(12)).squeeze(1).numpy()
    ref = scipy.stats.cauchy(loc=-1.0, scale=scale)
    for q in (0.05, 0.25, 0.5, 0.75, 0.95):
        # sampling sd of the q-quantile: sqrt(q (1 - q) / n) / density at that quantile
        sd = math.sqrt(q * (1 - q) / n) / ref.pdf(ref.ppf(q))
        assert np.quantile(out, q) == pytest.approx(ref.ppf(q), abs=4 * sd), q
    assert np.median(out) == pytest.approx(-1.0, abs=5 * scale * math.pi / 2 / math.sqrt(n))
    assert scipy.stats.kstest(out, ref.cdf).pvalue > 0.001
    assert np.isfinite(out).all()


# ---------------------------------------------------------------------------------------------
# reproducibility and the global RNG
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", KINDS, ids=KIND_IDS)
def test_same_generator_seed_same_output(make):
    x = images()
    p = make()
    a = p(x, gen(42))
    b = p(x, gen(42))
    c = p(x, gen(43))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("make", KINDS, ids=KIND_IDS)
def test_perturbation_does_not_touch_global_rng(make):
    state = torch.get_rng_state()
    make()(images(), gen(0))
    assert torch.equal(torch.get_rng_state(), state)


# ---------------------------------------------------------------------------------------------
# repr
# ---------------------------------------------------------------------------------------------


def test_reprs():
    assert repr(UniformLinf(eps=0.1)) == "UniformLinf(eps=0.1)"
    assert repr(UniformLinf(0.1)) == "UniformLinf(eps=0.1)"
    assert repr(UniformLinf(eps=8 / 255)) == "UniformLinf(eps=0.0313725)"
    assert repr(UniformLinf(eps=0)) == "UniformLinf(eps=0)"
    assert repr(UniformLinf(eps=0.1, bounds=(0, 1))) == "UniformLinf(eps=0.1)"
    assert repr(GaussianNoise(sigma=0.25)) == "GaussianNoise(sigma=0.25)"
    assert repr(CauchyNoise(scale=0.5)) == "CauchyNoise(scale=0.5)"
    assert repr(UniformLinf(eps=0.1, bounds=None)) == "UniformLinf(eps=0.1, bounds=None)"
    assert repr(GaussianNoise(sigma=1, bounds=(-1, 1))) == "GaussianNoise(sigma=1, bounds=(-1, 1))"
    assert repr(CauchyNoise(scale=2, bounds=(-2.5, 2.5))) == "CauchyNoise(scale=2, bounds=(-2.5, 2.5))"
    per_channel = (torch.zeros(3, 1, 1), torch.ones(3, 1, 1))
    assert repr(UniformLinf(eps=0.1, bounds=per_channel)) == "UniformLinf(eps=0.1, bounds=per-element)"


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,name", [(UniformLinf, "eps"), (GaussianNoise, "sigma"), (CauchyNoise, "scale")])
@pytest.mark.parametrize("bad", [-0.1, -1, float("nan"), float("inf"), "big", None, [0.1, -0.2], [0.0, 0.0],
                                 [float("nan")]])
def test_invalid_size_raises_value_error_naming_it(cls, name, bad):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        cls(bad)
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        cls(**{name: bad})


@pytest.mark.parametrize("cls", [UniformLinf, GaussianNoise, CauchyNoise])
def test_zero_size_is_allowed(cls):
    assert cls(0).sample(torch.zeros(2, 2), gen()).shape == (2, 2)


@pytest.mark.parametrize(
    "bounds",
    [
        (1.0, 0.0),
        (0.5, 0.5),
        (torch.tensor([0.0, 1.0]).view(2, 1, 1), torch.tensor([1.0, 1.0]).view(2, 1, 1)),
    ],
)
@pytest.mark.parametrize("cls", [UniformLinf, GaussianNoise, CauchyNoise])
def test_bounds_lo_not_below_hi_raises(cls, bounds):
    with pytest.raises(ValueError, match="lo < hi"):
        cls(0.1, bounds=bounds)


@pytest.mark.parametrize("bounds", [(0.0,), (0.0, 1.0, 2.0), 5.0, "abc"])
def test_bounds_not_a_pair_raises(bounds):
    with pytest.raises(ValueError, match=r"bounds=.* is invalid: expected None \(no box\), or \(lo, hi\)"):
        UniformLinf(0.1, bounds=bounds)


# ---------------------------------------------------------------------------------------------
# user callables
# ---------------------------------------------------------------------------------------------


def flip_sign(x, generator):
    return -x


def test_callable_is_accepted_and_used_unclipped():
    p = as_perturbation(flip_sign)
    assert isinstance(p, CallablePerturbation) and isinstance(p, Perturbation)
    x = images()
    assert torch.equal(p(x, gen()), -x)  # outside [0, 1]: the callable owns its box
    assert repr(p) == "flip_sign"


def test_callable_receives_the_generator():
    seen = []

    def noisy(x, generator):
        seen.append(generator)
        return x + torch.rand(x.shape, generator=generator)

    p = as_perturbation(noisy)
    g = gen(5)
    out = p(images(), g)
    assert seen == [g]
    assert torch.equal(out, p(images(), gen(5)))


def test_perturbation_instances_pass_through():
    p = UniformLinf(eps=0.1)
    assert as_perturbation(p) is p


@pytest.mark.parametrize(
    "fn,got",
    [
        (lambda x, g: x[:-1], r"\(63, 3, 5, 5\)"),
        (lambda x, g: x.flatten(1), r"\(64, 75\)"),
        (lambda x, g: x.numpy(), "ndarray"),
        (lambda x, g: None, "NoneType"),
    ],
)
def test_callable_with_wrong_output_raises_value_error(fn, got):
    p = as_perturbation(fn)
    with pytest.raises(ValueError, match=r"must return a tensor of the input's shape \(64, 3, 5, 5\), got " + got):
        p(images(), gen())


@pytest.mark.parametrize("bad", [0.1, "UniformLinf(eps=0.1)", None, {"eps": 0.1}])
def test_non_callable_raises_type_error(bad):
    with pytest.raises(TypeError, match="perturbation must be"):
        as_perturbation(bad)


@pytest.mark.parametrize("bad", ["0.1", True, None, ["a"]])
def test_sizes_must_be_real_numbers(bad):
    with pytest.raises(ValueError, match="eps must be a number"):
        UniformLinf(eps=bad)


def test_bounds_of_the_wrong_type_raise_value_error():
    with pytest.raises(ValueError, match=r"bounds=\('a', 'b'\) is invalid: expected None \(no box\)"):
        UniformLinf(eps=0.1, bounds=("a", "b"))
