"""Random input corruptions p(x' | x) for statistical robustness checks.

A perturbation maps a batch ``x`` of shape (n, ...) and a ``torch.Generator`` to a perturbed batch
of the same shape, drawing every random number from that generator (so results are reproducible
and do not depend on how samples are batched). All sizes (``eps``, ``sigma``, ``scale``) are in the
units of the tensors your data yields: for inputs in [0, 1] pixel space, eps=8/255 is 8 grey levels.
If your data is normalised (x - mean) / std, either move the normalisation into the model
(recommended: then eps stays in pixel units) or pass ``bounds`` in normalised units and scale eps
by 1/std yourself.

``bounds=(lo, hi)`` is the input box (default [0, 1]); scalars or tensors broadcastable to one
input (e.g. per-channel bounds of shape (C, 1, 1)); ``None`` switches the box off.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Callable

import torch


def _check_size(name: str, value: float, *, allow_zero: bool) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        need = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"{name} must be {need}, got {value!r}")
    return value


def _check_bounds(bounds):
    if bounds is None:
        return None
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be a pair (lo, hi) or None, got {bounds!r}") from None
    if torch.any(torch.as_tensor(lo) >= torch.as_tensor(hi)):
        raise ValueError(f"bounds must satisfy lo < hi everywhere, got {bounds!r}")
    return lo, hi


def _bounds_repr(bounds) -> str:
    if bounds is None:
        return ", bounds=None"
    lo, hi = bounds
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        return "" if (float(lo), float(hi)) == (0.0, 1.0) else f", bounds=({lo:g}, {hi:g})"
    return ", bounds=per-element"


class Perturbation(ABC):
    """Base class: subclasses implement ``sample(x, generator)``; the result is clipped to the box."""

    def __init__(self, bounds=(0.0, 1.0)):
        self.bounds = _check_bounds(bounds)

    @abstractmethod
    def sample(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Draw one perturbed copy of every row of x (before clipping to the box)."""

    def clip(self, x: torch.Tensor) -> torch.Tensor:
        if self.bounds is None:
            return x
        lo, hi = (torch.as_tensor(b, dtype=x.dtype, device=x.device) for b in self.bounds)
        return torch.maximum(torch.minimum(x, hi), lo)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.clip(self.sample(x, generator))


class UniformLinf(Perturbation):
    """Uniform noise on the L-inf ball of radius eps intersected with the input box.

    x' ~ U([max(x - eps, lo), min(x + eps, hi)]) coordinate-wise: a uniform draw on the
    intersection (as in the TSRM reference code), not a clipped draw that piles mass on the edge.
    """

    def __init__(self, eps: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps = _check_size("eps", eps, allow_zero=True)

    def sample(self, x, generator):
        lo, hi = x - self.eps, x + self.eps
        if self.bounds is not None:
            box_lo, box_hi = (torch.as_tensor(b, dtype=x.dtype, device=x.device) for b in self.bounds)
            lo, hi = torch.maximum(lo, box_lo), torch.minimum(hi, box_hi)
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return lo + u * (hi - lo)

    def __repr__(self):
        return f"UniformLinf(eps={self.eps:g}{_bounds_repr(self.bounds)})"


class GaussianNoise(Perturbation):
    """Additive isotropic Gaussian noise x' = clip(x + sigma * z), z ~ N(0, I)."""

    def __init__(self, sigma: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.sigma = _check_size("sigma", sigma, allow_zero=True)

    def sample(self, x, generator):
        z = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return x + self.sigma * z

    def __repr__(self):
        return f"GaussianNoise(sigma={self.sigma:g}{_bounds_repr(self.bounds)})"


class CauchyNoise(Perturbation):
    """Additive i.i.d. Cauchy noise x' = clip(x + scale * tan(pi (u - 1/2))), u ~ U(0, 1)."""

    def __init__(self, scale: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.scale = _check_size("scale", scale, allow_zero=True)

    def sample(self, x, generator):
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return x + self.scale * torch.tan(math.pi * (u - 0.5))

    def __repr__(self):
        return f"CauchyNoise(scale={self.scale:g}{_bounds_repr(self.bounds)})"


class CallablePerturbation(Perturbation):
    """A user's function ``fn(x, generator) -> x'``; no clipping (the function owns its box)."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Generator], torch.Tensor]):
        super().__init__(bounds=None)
        self.fn = fn

    def sample(self, x, generator):
        out = self.fn(x, generator)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(
                f"perturbation {self!r} must return a tensor of the input's shape {tuple(x.shape)}, "
                f"got {got}"
            )
        return out

    def __repr__(self):
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)


def as_perturbation(p) -> Perturbation:
    """Accept a Perturbation or a callable ``(x, generator) -> x'``; reject anything else clearly."""
    if isinstance(p, Perturbation):
        return p
    if callable(p):
        return CallablePerturbation(p)
    raise TypeError(
        f"perturbation must be a pytest_robust Perturbation (UniformLinf, GaussianNoise, CauchyNoise) "
        f"or a callable (x, generator) -> x', got {p!r}"
    )
