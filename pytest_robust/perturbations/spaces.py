"""Parameter spaces: the coordinates a sampler (HMC, Metropolis) moves in for a perturbation,
with their box and reflection (``BoxSpace`` for additive noise in a box, ``NoiseSpace`` for
unbounded noise)."""

from __future__ import annotations

import math

import torch

from pytest_robust.errors import ArgumentError
from pytest_robust.perturbations.base import ParameterSpace, Perturbation, feasible_box

# ---------------------------------------------------------------------------------------------
# parameter spaces: a perturbation as theta ~ mu, x' = apply(theta), for MCMC (intermediate-q)
# ---------------------------------------------------------------------------------------------




class BoxSpace(ParameterSpace):
    """``UniformLinf``: theta = x', uniform on [max(x - eps, lo), min(x + eps, hi)]; scale eps."""

    def __init__(self, x: torch.Tensor, eps: float, bounds):
        super().__init__(x)
        self.lo, self.hi = feasible_box(x, eps, bounds)
        if torch.any(self.lo > self.hi):
            raise ArgumentError(
                f"inputs lie outside the perturbation's box {bounds!r}: fix the data or the bounds"
            )
        self.scale = float(eps.max()) if isinstance(eps, torch.Tensor) else float(eps)  # the widest feature's

    def sample(self, streams):
        return self.lo + streams.rand(*self.x.shape[1:]).to(self.x.dtype) * (self.hi - self.lo)

    def apply(self, theta):
        return theta


class NoiseSpace(ParameterSpace):
    """Additive noise x' = clip(x + size * z): z ~ N(0, I) ("gaussian") or i.i.d. standard Cauchy."""

    def __init__(self, perturbation: Perturbation, x: torch.Tensor, size: float, kind: str):
        super().__init__(x)
        self.perturbation, self.kind = perturbation, kind
        self.size = size if isinstance(size, torch.Tensor) else float(size)  # per feature, or one number

    def sample(self, streams):
        shape = self.x.shape[1:]
        if self.kind == "gaussian":
            return streams.randn(*shape).to(self.x.dtype)
        return torch.tan(math.pi * (streams.rand(*shape).to(self.x.dtype) - 0.5))

    def apply(self, theta):
        return self.perturbation.clip(self.x + self.size * theta)

    def log_prior(self, theta):
        flat = theta.flatten(1)
        if self.kind == "gaussian":
            return -0.5 * flat.pow(2).sum(1)
        return -torch.log1p(flat.pow(2)).sum(1)

    def grad_log_prior(self, theta):
        return -theta if self.kind == "gaussian" else -2.0 * theta / (1.0 + theta.pow(2))
