from __future__ import annotations

import hashlib
import inspect
import math
import numbers
import warnings
from abc import ABC, abstractmethod
from typing import Callable

import torch

from pytest_robust.engine.inspect.perturbation import box_for, check_perturbation_object, size_for
from pytest_robust.engine.padding import decode, keep_padded
from pytest_robust.engine.streams import RowStreams
from pytest_robust.errors import ArgumentError, RobustWarning
from pytest_robust.results import NO_IDENTITY
from pytest_robust.settings import validation


def reflect(theta: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mirror every coordinate of ``theta`` into [lo, hi]; also return where the mirror count is odd.

    Repeating "if theta > hi: theta = 2 hi - theta; if theta < lo: theta = 2 lo - theta" until
    inside is the same as folding (theta - lo) modulo 2 (hi - lo); a coordinate mirrored an odd
    number of times must have its momentum negated. Coordinates with lo == hi are pinned to lo.
    """
    width = hi - lo
    safe = torch.where(width > 0, width, torch.ones_like(width))
    u = theta - lo
    folds = torch.floor(u / safe)
    r = u - folds * safe  # in [0, width)
    odd = torch.remainder(folds, 2) == 1
    inside = lo + torch.where(odd, safe - r, r)
    inside = torch.where(width > 0, torch.minimum(torch.maximum(inside, lo), hi), lo)
    return inside, odd & (width > 0)


def checked_size(name: str, value, *, allow_zero: bool, per_feature: bool = False):
    """A size (eps, sigma, scale) in input units: a finite number >= 0 (> 0 unless ``allow_zero``),
    or with ``per_feature`` also a tensor or sequence of such numbers, one per feature: it
    broadcasts against one input's shape like the box (``inspect.perturbation.box_for``), and 0
    keeps a feature fixed (an immutable feature). A per-feature size is kept as a float64 CPU
    tensor (``size_like`` puts it on the inputs' device once per device and dtype)."""
    if per_feature and not isinstance(value, (bool, str, numbers.Real)) and hasattr(value, "__len__"):
        try:
            t = torch.as_tensor(value.detach().cpu() if hasattr(value, "detach") else value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise ArgumentError(f"{name} must be a number or one number per feature, got {value!r}") from None
        if t.ndim == 0:
            return checked_size(name, float(t), allow_zero=allow_zero)
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise ArgumentError(f"{name} must be finite numbers >= 0 per feature (0 keeps a feature fixed), got "
                                f"{size_repr(t)}")
        if not bool((t > 0).any()):
            raise ArgumentError(f"{name} must be > 0 for at least one feature (0 for every feature moves nothing)")
        return t
    if isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        kind = "a number, or a tensor of one number per feature" if per_feature else "a number"
        raise ArgumentError(f"{name} must be {kind}, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        need = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ArgumentError(f"{name} must be {need}, got {value!r}")
    return value


def size_repr(size) -> str:
    """A size as it appears in reprs and messages: the number, or for a per-feature size its shape,
    range and a digest of its values (stable across processes: baselines match on it)."""
    if not isinstance(size, torch.Tensor):
        return f"{size:g}"
    digest = hashlib.sha256(size.detach().cpu().to(torch.float64).contiguous().numpy().tobytes()).hexdigest()[:8]
    return f"per-feature {tuple(size.shape)} in [{float(size.min()):g}, {float(size.max()):g}] #{digest}"


def size_like(size, x: torch.Tensor, cache: dict | None = None):
    """``size`` ready to combine with the batch x: a number as it is; a per-feature tensor in x's
    dtype on x's device, laid against one input's shape like the box (``box_for``), kept in
    ``cache`` per (device, dtype, input shape) so a hot loop copies it once."""
    if not isinstance(size, torch.Tensor):
        return size
    key = (x.device, x.dtype, tuple(x.shape[1:]))
    if cache is not None and key in cache:
        return cache[key]
    placed = size_for(size, x)
    if cache is not None:
        cache[key] = placed
    return placed


def random(kind: str, x: torch.Tensor, generator) -> torch.Tensor:
    """Random numbers of x's shape, dtype and device: ``"uniform"`` on [0, 1) (``torch.rand``) or
    ``"normal"`` (``torch.randn``), from a generator, or from ``streams.RowStreams`` (each block of
    rows from its own generator: the numbers of drawing that block alone)."""
    if isinstance(generator, RowStreams):
        return (generator.rand if kind == "uniform" else generator.randn)(*x.shape[1:])
    draw = torch.rand if kind == "uniform" else torch.randn
    return draw(x.shape, generator=generator, device=x.device, dtype=x.dtype)


def checked_box(bounds):
    """The box (lo, hi), or None for no box, by the one rule of ``settings.validation.box``."""
    return validation.box("bounds", bounds)


def number_box(bounds) -> tuple[float, float] | None:
    """The box ``bounds`` as two floats when both ends are numbers (a scalar clamp serves it),
    else None (per-feature ends: ``inspect.perturbation.box_for``). Floats are tested first:
    ``numbers.Real`` is an ABC, whose ``isinstance`` costs a microsecond in a hot loop."""
    lo, hi = bounds
    if type(lo) is float is type(hi) or isinstance(lo, numbers.Real) and isinstance(hi, numbers.Real):
        return float(lo), float(hi)
    return None


def feasible_box(x: torch.Tensor, eps: float, bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinate-wise [max(x - eps, lo), min(x + eps, hi)] for a batch x (bounds None: no box;
    per-channel bounds as ``inspect.perturbation.box_for``; a box of two numbers clamps in place,
    the same numbers without building the box's tensors)."""
    lo, hi = x - eps, x + eps
    if bounds is None:
        return lo, hi
    if (numbers_only := number_box(bounds)) is not None:
        return lo.clamp_(min=numbers_only[0]), hi.clamp_(max=numbers_only[1])
    box_lo, box_hi = box_for(bounds, x)
    return torch.maximum(lo, box_lo), torch.minimum(hi, box_hi)


def bounds_repr(bounds) -> str:
    if bounds is None:
        return ", bounds=None"
    lo, hi = bounds
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        return "" if (float(lo), float(hi)) == (0.0, 1.0) else f", bounds=({lo:g}, {hi:g})"
    return ", bounds=per-element"


_PLAIN = (bool, int, float, str, type(None))


def stable_identity(obj) -> str:
    """Text that names ``obj`` the same way in every process: never a memory address.

    An object whose class defines ``__repr__`` without an address is named by it; a function by
    its qualified name; a tensor by its dtype, shape and a hash of its bytes; any
    other object by its class and its public attributes in name order, recursively. What cannot
    be named so (an attribute of another kind) becomes ``<no stable identity: type>``, which the
    baseline comparison reports as unmatchable rather than matching it with another object.
    """
    if isinstance(obj, _PLAIN):
        return repr(obj)
    if isinstance(obj, (tuple, list)):
        inner = ", ".join(stable_identity(v) for v in obj)
        return f"({inner},)" if isinstance(obj, tuple) and len(obj) == 1 else (
            f"({inner})" if isinstance(obj, tuple) else f"[{inner}]")
    if isinstance(obj, torch.Tensor):
        from pytest_robust.engine.cache import tensor_fingerprint

        return f"tensor({str(obj.dtype).removeprefix('torch.')}, {tuple(obj.shape)}, {tensor_fingerprint(obj)[:12]})"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj):
        return obj.__qualname__
    own_repr = type(obj).__repr__ not in (object.__repr__, Perturbation.__repr__)
    if own_repr and " at 0x" not in repr(obj):
        return repr(obj)
    if getattr(obj, "__dict__", None) is None:
        return f"{NO_IDENTITY}: {type(obj).__name__}>"
    return _by_attributes(obj)


def _by_attributes(obj) -> str:
    """``Class(name=identity, ...)`` over the object's public attributes, in name order."""
    fields = ", ".join(f"{k}={stable_identity(v)}" for k, v in sorted(vars(obj).items()) if not k.startswith("_"))
    return f"{type(obj).__qualname__}({fields})"


class Perturbation(ABC):
    """Base class: subclasses implement ``sample(x, generator)``; the result is clipped to the box.

    For intermediate-q checks a perturbation may also describe itself as a parameter space
    (``parameter_space``): a base measure mu over parameters theta and a map theta -> x', which
    lets MCMC sample from l(x')^t mu(theta). ``differentiable`` says whether gradients flow from
    x' to theta (then HMC can be used; otherwise random-walk Metropolis).
    """

    #: True when x' is differentiable in the perturbation's parameters (HMC applies).
    differentiable = False
    #: True when the distribution also depends on which data rows it perturbs (e.g. a learned
    #: label- or input-conditional distribution): ``draw`` then passes their positions in the data
    #: and their labels to ``__call__`` as the keywords ``index`` and ``y``.
    conditional = False
    #: The attribute holding a per-coordinate size (eps, sigma, scale), which ``inspect.perturbation.check_size``
    #: compares with the box's width; None for perturbations without one.
    coordinate_size: str | None = None
    #: What the perturbation acts on, when it is defined on images only ((n, 1 or 3, height, width)):
    #: named in the error ``inspect.perturbation.check_images_only`` gives on other inputs, with
    #: the perturbations to use instead. None for perturbations of any input.
    images_only: str | None = None
    #: True when the perturbation may take and return integer inputs (token ids: a substitution of
    #: the user's), which the checks declared ``discrete`` then accept (``Metric.discrete``).
    discrete = False
    #: True when ``sample`` draws each random tensor of the batch's rows with ``random`` and
    #: combines them element by element into a fresh tensor: then it takes ``streams.RowStreams``
    #: (a batch of blocks drawn in one call, ``draw_blocks``) and its output is clipped in place.
    elementwise = False
    #: True when ``sample`` returns points inside the box by construction, so ``__call__`` adds no
    #: clipping pass (the same numbers: clipping would change none).
    within_box = False

    def __init__(self, bounds=(0.0, 1.0)):
        self.bounds = checked_box(bounds)
        self._placed: dict = {}  # per-feature sizes on the inputs' device (``size_like``)

    def __repr__(self):
        """A subclass without its own ``__repr__`` is named by its class and public attributes
        (``stable_identity``), so its results match their baselines across runs."""
        return _by_attributes(self)

    def parameter_space(self, x: torch.Tensor) -> "ParameterSpace | None":
        """The perturbation of the rows of x as a ``ParameterSpace``, or None when it has none
        (then only Monte Carlo estimates of the q-norm are possible)."""
        return None

    @abstractmethod
    def sample(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Draw one perturbed copy of every row of x (before clipping to the box)."""

    def clip(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """The batch x clamped coordinate-wise to the box (scalar bounds take the cheaper scalar
        clamp; per-channel bounds as ``inspect.perturbation.box_for``), in x itself with
        ``inplace`` (the same numbers)."""
        if self.bounds is None:
            return x
        if (numbers_only := number_box(self.bounds)) is not None:
            return x.clamp_(*numbers_only) if inplace else x.clamp(*numbers_only)
        lo, hi = box_for(self.bounds, x)
        return torch.clamp(x, lo, hi, out=x) if inplace else torch.maximum(torch.minimum(x, hi), lo)

    def __call__(self, x: torch.Tensor, generator) -> torch.Tensor:
        drawn = self.sample(x, generator)
        return drawn if self.within_box else self.clip(drawn, inplace=self.elementwise)

    def draw(self, x: torch.Tensor, generator: torch.Generator, index: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One perturbed copy of the rows x, which are rows ``index`` of the data with labels ``y``."""
        if self.conditional:
            return self(x, generator, index=index, y=y)
        return self(x, generator)

    def draw_blocks(self, x: torch.Tensor, generators: list, index: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``draw`` of consecutive blocks of the rows x, block j (len(x) / len(generators) rows)
        with ``generators[j]``: the numbers of drawing each block alone. An ``elementwise``
        perturbation draws them in one call (``streams.RowStreams``), any other block by block."""
        size = x.shape[0] // len(generators)
        if self.elementwise and not self.conditional:
            return self(x, RowStreams(generators, [size] * len(generators), x.device, x.dtype))
        return torch.cat([self.draw(x[j * size:(j + 1) * size], g, index[j * size:(j + 1) * size],
                                    y[j * size:(j + 1) * size]) for j, g in enumerate(generators)])


class CallablePerturbation(Perturbation):
    """A user's function ``fn(x, generator) -> x'``; no clipping (the function owns its box). It
    may take and return integer inputs (token ids) where the check allows them (``discrete``)."""

    discrete = True

    def __init__(self, fn: Callable[[torch.Tensor, torch.Generator], torch.Tensor]):
        super().__init__(bounds=None)
        self.fn = fn

    def sample(self, x, generator):
        """The function's output; on token ids it gets the real ids and padded positions stay
        padding (``engine.padding``)."""
        ids = not x.dtype.is_floating_point
        out = self.fn(decode(x)[0] if ids else x, generator)
        if isinstance(out, torch.Tensor) and out.dtype.is_floating_point != x.dtype.is_floating_point:
            raise ArgumentError(f"perturbation {self!r} must return inputs of the input's kind: {x.dtype} in, "
                                f"{out.dtype} out (token ids stay integers; continuous inputs stay floating point)")
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ArgumentError(
                f"perturbation {self!r} must return a tensor of the input's shape {tuple(x.shape)}, "
                f"got {got}"
            )
        return keep_padded(x, out) if ids else out

    def __repr__(self):
        return stable_identity(self.fn)


def as_perturbation(p) -> Perturbation:
    """Accept a Perturbation or a callable ``(x, generator) -> x'``; reject anything else clearly
    (a class instead of an instance, a callable of another signature: ``engine.inspect.perturbation``). A
    perturbation that cannot be named the same way in every run gets a RobustWarning."""
    if callable(p):
        check_perturbation_object(p)
    if isinstance(p, Perturbation) or callable(p):
        p = p if isinstance(p, Perturbation) else CallablePerturbation(p)
        if NO_IDENTITY in repr(p):
            warnings.warn(
                f"perturbation {p!r} cannot be named the same way in every run, so its results cannot "
                "be matched with a stored baseline: give its class a __repr__ that names its parameters",
                RobustWarning, stacklevel=3,
            )
        return p
    raise ArgumentError(
        f"perturbation must be a pytest_robust Perturbation (UniformLinf, GaussianNoise, CauchyNoise) "
        f"or a callable (x, generator) -> x', got {p!r}"
    )


class ParameterSpace(ABC):
    """The perturbation of a batch of rows x written as x' = apply(theta) with theta ~ mu.

    theta has shape (rows, *shape). ``scale`` is a length in theta units: MCMC step sizes are
    multiples of it. ``lo``/``hi`` (tensors broadcastable to theta) bound the support of mu, or
    are None (unbounded). ``log_prior`` is log mu(theta) up to an additive constant;
    ``propose`` is a symmetric random-walk proposal (q(theta' | theta) = q(theta | theta')) of
    size ``step`` (in units of ``scale``) that stays in the support. Randomness comes from a
    ``streams.RowStreams`` (one generator per block of rows).
    """

    lo: torch.Tensor | None = None
    hi: torch.Tensor | None = None
    scale: float = 1.0
    differentiable = True

    def __init__(self, x: torch.Tensor):
        self.x = x

    @property
    def dim(self) -> int:
        """Number of coordinates of theta per row."""
        return math.prod(self.x.shape[1:])

    @property
    def mh_step(self) -> float:
        """Initial random-walk proposal size in units of ``scale`` (Roberts et al.: 2.38 / sqrt(d))."""
        return 2.38 / math.sqrt(self.dim)

    @abstractmethod
    def sample(self, streams) -> torch.Tensor:
        """One exact draw theta ~ mu per row."""

    @abstractmethod
    def apply(self, theta: torch.Tensor) -> torch.Tensor:
        """The perturbed rows x' for parameters theta (differentiable when ``differentiable``)."""

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """log mu(theta) per row, up to a constant (0: uniform on the support)."""
        return torch.zeros(len(theta), device=theta.device, dtype=theta.dtype)

    def grad_log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """Gradient of ``log_prior`` with respect to theta."""
        return torch.zeros_like(theta)

    def propose(self, theta: torch.Tensor, step: torch.Tensor, streams) -> torch.Tensor:
        """Gaussian random walk theta + step * scale * N(0, I), mirrored into the support."""

        move = streams.randn(*theta.shape[1:]).to(theta.dtype)
        out = theta + step.reshape((-1,) + (1,) * (theta.ndim - 1)) * self.scale * move
        return out if self.lo is None else reflect(out, self.lo, self.hi)[0]
