"""Random input corruptions p(x' | x) for statistical robustness checks.

A perturbation maps a batch ``x`` of shape (n, ...) and a ``torch.Generator`` to a perturbed batch
of the same shape, drawing every random number from that generator (so results are reproducible
and do not depend on how samples are batched). All sizes (``eps``, ``sigma``, ``scale``) are in the
units of the tensors your data yields: for inputs in [0, 1] pixel space, eps=8/255 is 8 grey levels.
If your data is normalised (x - mean) / std, either move the normalisation into the model
(recommended: then eps stays in pixel units) or pass ``bounds`` in normalised units and scale eps
by 1/std yourself.

``bounds=(lo, hi)`` is the input box (default [0, 1]); each of lo and hi a number, a per-channel
sequence of length C (one per channel of (N, C, ...) inputs, like mean/std lists), or a tensor that
broadcasts to one input (e.g. shape (C, 1, 1)); ``None`` switches the box off. Bounds of another
shape are an ArgumentError naming both shapes when they meet the inputs (``inspection.box_for``).

Submodules (imported on use, not by this package): ``gmm``, NPPR's Gaussian-mixture perturbation
model; ``gmm_fit``, its fit loop, fit cache and the frozen fitted mixture; ``gmm_data``, the
fit/evaluation split and the classifier features it reads; ``projected``, Gaussian noise
projected into a norm ball.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from abc import ABC, abstractmethod
from typing import Callable

import torch

from ..errors import ArgumentError, RobustWarning
from ..results import NO_IDENTITY
from ..inspection import box_for, check_perturbation_object


def _check_size(name: str, value: float, *, allow_zero: bool) -> float:
    if isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        raise ArgumentError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        need = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ArgumentError(f"{name} must be {need}, got {value!r}")
    return value


def _check_bounds(bounds):
    if bounds is None:
        return None
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise ArgumentError(f"bounds must be a pair (lo, hi) or None, got {bounds!r}") from None
    try:
        a, b = torch.as_tensor(lo), torch.as_tensor(hi)
        a, b = (t.reshape(-1, *[1] * (max(a.ndim, b.ndim) - 1)) if t.ndim == 1 else t for t in (a, b))
        ordered = not torch.any(a >= b)  # a per-channel sequence against a (C, 1, 1) tensor: channel by channel
    except (TypeError, ValueError, RuntimeError):
        raise ArgumentError(f"bounds must be numbers or tensors (lo, hi): each a number, a per-channel sequence or a "
                            f"tensor, of shapes that broadcast together, got {bounds!r}") from None
    if not ordered:
        raise ArgumentError(f"bounds must satisfy lo < hi everywhere, got {bounds!r}")
    return lo, hi


def feasible_box(x: torch.Tensor, eps: float, bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinate-wise [max(x - eps, lo), min(x + eps, hi)] for a batch x (bounds None: no box;
    per-channel bounds as ``inspection.box_for``)."""
    lo, hi = x - eps, x + eps
    if bounds is not None:
        box_lo, box_hi = box_for(bounds, x)
        lo, hi = torch.maximum(lo, box_lo), torch.minimum(hi, box_hi)
    return lo, hi


def _bounds_repr(bounds) -> str:
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
        from ..cache import tensor_fingerprint

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
    #: The attribute holding a per-coordinate size (eps, sigma, scale), which ``inspection.check_size``
    #: compares with the box's width; None for perturbations without one.
    coordinate_size: str | None = None

    def __init__(self, bounds=(0.0, 1.0)):
        self.bounds = _check_bounds(bounds)

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

    def clip(self, x: torch.Tensor) -> torch.Tensor:
        """The batch x clamped coordinate-wise to the box (scalar bounds take the cheaper scalar
        clamp; per-channel bounds as ``inspection.box_for``)."""
        if self.bounds is None:
            return x
        lo, hi = self.bounds
        if isinstance(lo, numbers.Real) and isinstance(hi, numbers.Real):
            return x.clamp(float(lo), float(hi))
        lo, hi = box_for(self.bounds, x)
        return torch.maximum(torch.minimum(x, hi), lo)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.clip(self.sample(x, generator))

    def draw(self, x: torch.Tensor, generator: torch.Generator, index: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One perturbed copy of the rows x, which are rows ``index`` of the data with labels ``y``."""
        if self.conditional:
            return self(x, generator, index=index, y=y)
        return self(x, generator)


class UniformLinf(Perturbation):
    """Uniform noise on the L-inf ball of radius eps intersected with the input box.

    x' ~ U([max(x - eps, lo), min(x + eps, hi)]) coordinate-wise: a uniform draw on the
    intersection (as in the TSRM reference code), not a clipped draw that piles mass on the edge.
    """

    differentiable = True
    coordinate_size = "eps"

    def __init__(self, eps: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps = _check_size("eps", eps, allow_zero=True)

    def parameter_space(self, x):
        """theta = x' itself, uniform on the box [max(x - eps, lo), min(x + eps, hi)]."""
        return BoxSpace(x, self.eps, self.bounds)

    def sample(self, x, generator):
        lo, hi = self.clip(x - self.eps), self.clip(x + self.eps)  # the ball intersected with the box
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return lo + u * (hi - lo)

    def __repr__(self):
        return f"UniformLinf(eps={self.eps:g}{_bounds_repr(self.bounds)})"


class GaussianNoise(Perturbation):
    """Additive isotropic Gaussian noise x' = clip(x + sigma * z), z ~ N(0, I)."""

    differentiable = True
    coordinate_size = "sigma"

    def __init__(self, sigma: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.sigma = _check_size("sigma", sigma, allow_zero=True)

    def parameter_space(self, x):
        """theta = z ~ N(0, I), x' = clip(x + sigma z)."""
        return NoiseSpace(self, x, self.sigma, "gaussian")

    def sample(self, x, generator):
        z = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return x + self.sigma * z

    def __repr__(self):
        return f"GaussianNoise(sigma={self.sigma:g}{_bounds_repr(self.bounds)})"


class CauchyNoise(Perturbation):
    """Additive i.i.d. Cauchy noise x' = clip(x + scale * tan(pi (u - 1/2))), u ~ U(0, 1)."""

    differentiable = True
    coordinate_size = "scale"

    def __init__(self, scale: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.scale = _check_size("scale", scale, allow_zero=True)

    def parameter_space(self, x):
        """theta = z ~ standard Cauchy i.i.d., x' = clip(x + scale z)."""
        return NoiseSpace(self, x, self.scale, "cauchy")

    def sample(self, x, generator):
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return x + self.scale * torch.tan(math.pi * (u - 0.5))

    def __repr__(self):
        return f"CauchyNoise(scale={self.scale:g}{_bounds_repr(self.bounds)})"


class UniformL2(Perturbation):
    """Uniform noise in the L2 ball of radius eps: delta = eps U^(1/D) g / ||g||, g ~ N(0, I),
    U ~ U(0, 1), D the number of coordinates of an input; clipped to the box."""

    def __init__(self, eps: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps = _check_size("eps", eps, allow_zero=False)

    def sample(self, x, generator):
        g = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        u = torch.rand((len(x),), generator=generator, device=x.device, dtype=x.dtype)
        width = math.prod(x.shape[1:])
        radius = self.eps * u ** (1.0 / width) / g.flatten(start_dim=1).norm(dim=1).clamp(min=1e-12)
        return x + g * radius.reshape(-1, *([1] * (x.ndim - 1)))

    def __repr__(self):
        return f"UniformL2(eps={self.eps:g}{_bounds_repr(self.bounds)})"


class CallablePerturbation(Perturbation):
    """A user's function ``fn(x, generator) -> x'``; no clipping (the function owns its box)."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Generator], torch.Tensor]):
        super().__init__(bounds=None)
        self.fn = fn

    def sample(self, x, generator):
        out = self.fn(x, generator)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ArgumentError(
                f"perturbation {self!r} must return a tensor of the input's shape {tuple(x.shape)}, "
                f"got {got}"
            )
        return out

    def __repr__(self):
        return stable_identity(self.fn)


def as_perturbation(p) -> Perturbation:
    """Accept a Perturbation or a callable ``(x, generator) -> x'``; reject anything else clearly
    (a class instead of an instance, a callable of another signature: ``inspection``). A
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


# ---------------------------------------------------------------------------------------------
# parameter spaces: a perturbation as theta ~ mu, x' = apply(theta), for MCMC (intermediate-q)
# ---------------------------------------------------------------------------------------------


class ParameterSpace(ABC):
    """The perturbation of a batch of rows x written as x' = apply(theta) with theta ~ mu.

    theta has shape (rows, *shape). ``scale`` is a length in theta units: MCMC step sizes are
    multiples of it. ``lo``/``hi`` (tensors broadcastable to theta) bound the support of mu, or
    are None (unbounded). ``log_prior`` is log mu(theta) up to an additive constant;
    ``propose`` is a symmetric random-walk proposal (q(theta' | theta) = q(theta | theta')) of
    size ``step`` (in units of ``scale``) that stays in the support. Randomness comes from a
    ``mcmc.RowStreams`` (one generator per block of rows).
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
        from ..mcmc import reflect

        move = streams.randn(*theta.shape[1:]).to(theta.dtype)
        out = theta + step.reshape((-1,) + (1,) * (theta.ndim - 1)) * self.scale * move
        return out if self.lo is None else reflect(out, self.lo, self.hi)[0]


class BoxSpace(ParameterSpace):
    """``UniformLinf``: theta = x', uniform on [max(x - eps, lo), min(x + eps, hi)]; scale eps."""

    def __init__(self, x: torch.Tensor, eps: float, bounds):
        super().__init__(x)
        self.lo, self.hi = feasible_box(x, eps, bounds)
        if torch.any(self.lo > self.hi):
            raise ArgumentError(
                f"inputs lie outside the perturbation's box {bounds!r}: fix the data or the bounds"
            )
        self.scale = float(eps)

    def sample(self, streams):
        return self.lo + streams.rand(*self.x.shape[1:]).to(self.x.dtype) * (self.hi - self.lo)

    def apply(self, theta):
        return theta


class NoiseSpace(ParameterSpace):
    """Additive noise x' = clip(x + size * z): z ~ N(0, I) ("gaussian") or i.i.d. standard Cauchy."""

    def __init__(self, perturbation: Perturbation, x: torch.Tensor, size: float, kind: str):
        super().__init__(x)
        self.perturbation, self.size, self.kind = perturbation, float(size), kind

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


#: Columns of a ``Spatial`` parameter vector.
FLIP, ANGLE, ZOOM, SHIFT_X, SHIFT_Y = range(5)


class Spatial(Perturbation):
    """Random spatial transform per image (Rice et al. 2021, section 5.2): horizontal flip,
    rotation, scaling and translation, applied through ``affine_grid``/``grid_sample`` with each
    sample's own parameters, so a whole batch is transformed at once on any device.

    Parameters per image (one row of ``params``, columns FLIP, ANGLE, ZOOM, SHIFT_X, SHIFT_Y):
    flip in {0, 1} (mirror left-right, probability 1/2 when ``flip``), angle in degrees uniform
    on [-rotation, rotation] (counter-clockwise as displayed), zoom uniform on ``scale`` (> 1
    enlarges the content) and integer shifts in pixels uniform on {-translate, ..., translate}
    (positive: right / down). The reference code pads 4 px and crops at an offset (the paper's
    "cropping 0-4 px"), which is a translation by up to 4 px each way. Content is mapped as
    shift . rotate . zoom . flip, about the image centre; pixels that come from outside the image
    follow ``padding_mode`` ("reflection" as the reference's reflect padding, "zeros", "border").

    Not differentiable in its parameters (flip and integer shifts are discrete): intermediate-q
    path sampling uses random-walk Metropolis with the reference's proposals (flip toggled with
    probability 1/2, angle + N(0, (rotation/2)^2), zoom + N(0, ((hi - lo)/2)^2), shifts +
    round(N(0, (translate/2)^2)), each mirrored back into range) scaled by an adapted factor.
    """

    def __init__(self, flip: bool = True, rotation: float = 10.0, scale=(0.9, 1.1), translate: int = 4,
                 padding_mode: str = "reflection", bounds=(0.0, 1.0)):
        super().__init__(bounds)
        if not isinstance(flip, bool):
            raise ArgumentError(f"flip must be True or False, got {flip!r}")
        self.flip = flip
        self.rotation = _check_size("rotation", rotation, allow_zero=True)
        if self.rotation >= 180:
            raise ArgumentError(f"rotation must be below 180 degrees, got {rotation!r}")
        try:
            lo, hi = (float(s) for s in scale)
        except (TypeError, ValueError):
            raise ArgumentError(f"scale must be a pair (lo, hi) of zoom factors, got {scale!r}") from None
        if not (0 < lo <= hi and math.isfinite(hi)):
            raise ArgumentError(f"scale must satisfy 0 < lo <= hi, got {scale!r}")
        self.scale = (lo, hi)
        if isinstance(translate, bool) or not isinstance(translate, int) or translate < 0:
            raise ArgumentError(f"translate must be an integer number of pixels >= 0, got {translate!r}")
        self.translate = translate
        if padding_mode not in ("reflection", "zeros", "border"):
            raise ArgumentError(f"padding_mode must be 'reflection', 'zeros' or 'border', got {padding_mode!r}")
        self.padding_mode = padding_mode

    @staticmethod
    def _check_images(x: torch.Tensor) -> None:
        if x.ndim != 4:
            raise ArgumentError(
                f"Spatial transforms images of shape (n, channels, height, width), got shape {tuple(x.shape)}"
            )

    def sample_params(self, streams) -> torch.Tensor:
        """Parameters drawn from the perturbation's distribution, shape (rows, 5)."""
        u = streams.rand(5)
        lo, hi = self.scale
        params = torch.empty_like(u)
        params[:, FLIP] = (u[:, FLIP] < 0.5).to(u.dtype) if self.flip else 0.0
        params[:, ANGLE] = (2 * u[:, ANGLE] - 1) * self.rotation
        params[:, ZOOM] = lo + u[:, ZOOM] * (hi - lo)
        span = 2 * self.translate + 1
        params[:, SHIFT_X:] = torch.clamp(torch.floor(u[:, SHIFT_X:] * span), max=span - 1) - self.translate
        return params

    def transform(self, x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """Apply the transform of each row of ``params`` (shape (n, 5)) to the image in the same row.

        In pixel coordinates centred on the image (x right, y down) the output at u samples the
        input at F Z^-1 R(-angle) (u - shift), with F the flip, Z the zoom and R the rotation;
        bilinear interpolation, ``align_corners=False`` (pixel centres), so a flip or an integer
        shift moves pixels exactly.
        """
        self._check_images(x)
        if params.shape != (len(x), 5):
            raise ArgumentError(f"params must have shape ({len(x)}, 5), got {tuple(params.shape)}")
        n, _, h, w = x.shape
        params = params.to(device=x.device, dtype=x.dtype)
        a = torch.deg2rad(params[:, ANGLE])
        cos, sin = torch.cos(a), torch.sin(a)
        sign = 1.0 - 2.0 * params[:, FLIP]
        inv_zoom = 1.0 / params[:, ZOOM]
        # pixel-space matrix M = F Z^-1 R(-a), R(-a) = [[cos, -sin], [sin, cos]], conjugated into
        # normalised coordinates: entry (0, 1) scales by h / w, entry (1, 0) by w / h.
        m00 = sign * inv_zoom * cos
        m01 = -sign * inv_zoom * sin * (h / w)
        m10 = inv_zoom * sin * (w / h)
        m11 = inv_zoom * cos
        tx, ty = 2.0 * params[:, SHIFT_X] / w, 2.0 * params[:, SHIFT_Y] / h
        theta = torch.stack(
            [
                torch.stack([m00, m01, -(m00 * tx + m01 * ty)], dim=1),
                torch.stack([m10, m11, -(m10 * tx + m11 * ty)], dim=1),
            ],
            dim=1,
        )
        grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
        return torch.nn.functional.grid_sample(
            x, grid, mode="bilinear", padding_mode=self.padding_mode, align_corners=False
        )

    def sample(self, x, generator):
        from ..mcmc import RowStreams

        self._check_images(x)
        return self.transform(x, self.sample_params(RowStreams.single(generator, len(x), x.device, x.dtype)))

    def parameter_space(self, x):
        self._check_images(x)
        return SpatialSpace(self, x)

    def __repr__(self):
        lo, hi = self.scale
        return (
            f"Spatial(flip={self.flip}, rotation={self.rotation:g}, scale=({lo:g}, {hi:g}), "
            f"translate={self.translate}, padding_mode={self.padding_mode!r}{_bounds_repr(self.bounds)})"
        )


class SpatialSpace(ParameterSpace):
    """``Spatial`` as a parameter space: theta = the (n, 5) parameter rows, mu uniform on them."""

    differentiable = False

    def __init__(self, spatial: Spatial, x: torch.Tensor):
        super().__init__(x)
        self.spatial = spatial
        lo, hi = spatial.scale
        half = spatial.translate + 0.5  # integer shifts are mirrored about half-integers
        self.lo = torch.tensor([0.0, -spatial.rotation, lo, -half, -half], device=x.device, dtype=x.dtype)
        self.hi = torch.tensor([1.0, spatial.rotation, hi, half, half], device=x.device, dtype=x.dtype)
        self.sd = torch.tensor(
            [0.0, spatial.rotation / 2, (hi - lo) / 2, spatial.translate / 2, spatial.translate / 2],
            device=x.device, dtype=x.dtype,
        )

    @property
    def dim(self) -> int:
        return 5

    @property
    def mh_step(self) -> float:
        return 1.0

    def sample(self, streams):
        return self.spatial.sample_params(streams)

    def apply(self, theta):
        return self.spatial.transform(self.x, theta)

    def propose(self, theta, step, streams):
        """Flip toggled with probability 1/2; angle and zoom + step * sd * N(0, 1) and shifts +
        round(step * sd * N(0, 1)), mirrored into range (shifts about the half-integers
        -translate - 1/2 and translate + 1/2, which keeps the integer walk symmetric)."""
        from ..mcmc import reflect

        u, z = streams.rand(1), streams.randn(5)
        move = step[:, None] * self.sd * z
        move[:, SHIFT_X:] = torch.round(move[:, SHIFT_X:])
        out = theta + move
        if self.spatial.flip:
            out[:, FLIP] = torch.where(u[:, 0] < 0.5, 1.0 - theta[:, FLIP], theta[:, FLIP])
        return reflect(out, self.lo, self.hi)[0]
