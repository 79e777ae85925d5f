"""Gaussian noise projected into a norm ball (``ProjectedGaussian``): delta = proj(sigma z), z ~ N(0, I),
proj clamping each coordinate to [-eps, eps] (L-inf) or scaling delta to L2 norm <= eps, then
clipped to the input box. NPPR compares its learned distribution with it. ``eps`` and ``sigma``
are in the units of the inputs.
"""

from __future__ import annotations

import torch

from pytest_robust.perturbations.base import Perturbation, size_like, size_repr


class ProjectedGaussian(Perturbation):
    """Gaussian noise projected into the budget ball, then clipped to the box: delta = proj(sigma z),
    z ~ N(0, I), proj clamping each coordinate to [-eps, eps] (L-inf) or scaling delta to norm <= eps
    (L2), as the NPPR reference's ``g_ball`` does; so every draw lies in the ball like NPPR's own."""

    def __init__(self, eps: float, sigma: float, norm: str, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps, self.sigma, self.norm = eps, sigma, norm

    def sample(self, x, generator):
        sigma, eps = (size_like(v, x, self._placed) for v in (self.sigma, self.eps))  # per feature in L-inf
        delta = sigma * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        if self.norm == "linf":
            return x + delta.clamp(-eps, eps)
        norms = delta.flatten(start_dim=1).norm(dim=1).clamp(min=1e-12)
        return x + delta * (self.eps / norms).clamp(max=1.0).reshape(-1, *([1] * (x.ndim - 1)))

    def __repr__(self):
        return f"ProjectedGaussian(sigma={size_repr(self.sigma)}, {self.norm} ball eps={size_repr(self.eps)})"
