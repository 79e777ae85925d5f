"""Random noise in input units: ``UniformLinf`` (uniform in the L-inf ball, the TSRM paper's
corruption), ``UniformL2``, ``UniformL1``, ``GaussianNoise`` and ``CauchyNoise``, each clipped to
the input box.

The coordinate-wise sizes (``UniformLinf``'s eps, ``GaussianNoise``'s sigma, ``CauchyNoise``'s scale)
may be one number per feature: a tensor or sequence that broadcasts against one input's shape like
the box (numpy's rule; per channel on images), 0 keeping a feature fixed. For tabular data a
natural choice is a fraction of the training scaler's ``scale_`` (eps in standard deviations).
The L2 and L1 balls are isotropic: their eps is one number."""

from __future__ import annotations

import math

import torch

from pytest_robust.perturbations.base import Perturbation, bounds_repr, checked_size, random, size_like, size_repr
from pytest_robust.perturbations.spaces import BoxSpace, NoiseSpace


class UniformLinf(Perturbation):
    """Uniform noise on the L-inf ball of radius eps intersected with the input box.

    x' ~ U([max(x - eps, lo), min(x + eps, hi)]) coordinate-wise: a uniform draw on the
    intersection (as in the TSRM reference code), not a clipped draw that piles mass on the edge.
    """

    differentiable = True
    elementwise = True
    within_box = True  # lerp(lo, hi, u) lies in [lo, hi] for u in [0, 1), and [lo, hi] in the box
    coordinate_size = "eps"

    def __init__(self, eps: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps = checked_size("eps", eps, allow_zero=True, per_feature=True)

    def parameter_space(self, x):
        """theta = x' itself, uniform on the box [max(x - eps, lo), min(x + eps, hi)]."""
        return BoxSpace(x, size_like(self.eps, x, self._placed), self.bounds)

    def sample(self, x, generator):
        """lo + u (hi - lo) (``torch.lerp``), with [lo, hi] the ball intersected with the box (in
        place, fresh tensors)."""
        eps = size_like(self.eps, x, self._placed)
        lo = self.clip(x - eps, inplace=True)
        return lo.lerp_(self.clip(x + eps, inplace=True), random("uniform", x, generator))

    def __repr__(self):
        return f"UniformLinf(eps={size_repr(self.eps)}{bounds_repr(self.bounds)})"


class GaussianNoise(Perturbation):
    """Additive isotropic Gaussian noise x' = clip(x + sigma * z), z ~ N(0, I)."""

    differentiable = True
    elementwise = True
    coordinate_size = "sigma"

    def __init__(self, sigma: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.sigma = checked_size("sigma", sigma, allow_zero=True, per_feature=True)

    def parameter_space(self, x):
        """theta = z ~ N(0, I), x' = clip(x + sigma z)."""
        return NoiseSpace(self, x, size_like(self.sigma, x, self._placed), "gaussian")

    def sample(self, x, generator):
        return random("normal", x, generator).mul_(size_like(self.sigma, x, self._placed)).add_(x)

    def __repr__(self):
        return f"GaussianNoise(sigma={size_repr(self.sigma)}{bounds_repr(self.bounds)})"


class CauchyNoise(Perturbation):
    """Additive i.i.d. Cauchy noise x' = clip(x + scale * tan(pi (u - 1/2))), u ~ U(0, 1)."""

    differentiable = True
    elementwise = True
    coordinate_size = "scale"

    def __init__(self, scale: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.scale = checked_size("scale", scale, allow_zero=True, per_feature=True)

    def parameter_space(self, x):
        """theta = z ~ standard Cauchy i.i.d., x' = clip(x + scale z)."""
        return NoiseSpace(self, x, size_like(self.scale, x, self._placed), "cauchy")

    def sample(self, x, generator):
        u = random("uniform", x, generator)
        return x + size_like(self.scale, x, self._placed) * torch.tan(math.pi * (u - 0.5))

    def __repr__(self):
        return f"CauchyNoise(scale={size_repr(self.scale)}{bounds_repr(self.bounds)})"


class UniformL2(Perturbation):
    """Uniform noise in the L2 ball of radius eps: delta = eps U^(1/D) g / ||g||, g ~ N(0, I),
    U ~ U(0, 1), D the number of coordinates of an input; clipped to the box."""

    def __init__(self, eps: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps = checked_size("eps", eps, allow_zero=False)

    def sample(self, x, generator):
        g = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        u = torch.rand((len(x),), generator=generator, device=x.device, dtype=x.dtype)
        width = math.prod(x.shape[1:])
        radius = self.eps * u ** (1.0 / width) / g.flatten(start_dim=1).norm(dim=1).clamp(min=1e-12)
        return x + g * radius.reshape(-1, *([1] * (x.ndim - 1)))

    def __repr__(self):
        return f"UniformL2(eps={self.eps:g}{bounds_repr(self.bounds)})"


class UniformL1(Perturbation):
    """Uniform noise in the L1 ball of radius eps: delta = eps U^(1/D) l / ||l||_1, l with
    independent Laplace coordinates (l / ||l||_1 follows the cone measure of the L1 sphere, Barthe
    et al. 2005), U ~ U(0, 1), D the number of coordinates of an input; clipped to the box."""

    def __init__(self, eps: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps = checked_size("eps", eps, allow_zero=False)

    def sample(self, x, generator):
        e = torch.rand((2, *x.shape), generator=generator, device=x.device, dtype=x.dtype)
        laplace = -torch.log1p(-e[0]) * torch.where(e[1] < 0.5, -1.0, 1.0)
        u = torch.rand((len(x),), generator=generator, device=x.device, dtype=x.dtype)
        width = math.prod(x.shape[1:])
        radius = self.eps * u ** (1.0 / width) / laplace.flatten(start_dim=1).abs().sum(dim=1).clamp(min=1e-12)
        return x + laplace * radius.reshape(-1, *([1] * (x.ndim - 1)))

    def __repr__(self):
        return f"UniformL1(eps={self.eps:g}{bounds_repr(self.bounds)})"
