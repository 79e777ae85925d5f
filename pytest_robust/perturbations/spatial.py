"""Spatial transforms as a perturbation (``Spatial``: flip, rotation, scale, crop; the
intermediate-q paper's section 5.2) and their parameter space for Metropolis-Hastings."""

from __future__ import annotations

import math

import torch

from pytest_robust.errors import ArgumentError
from pytest_robust.perturbations.base import ParameterSpace, Perturbation, bounds_repr, checked_size

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

    images_only = "flips, rotations, zooms and shifts of images"

    def __init__(self, flip: bool = True, rotation: float = 10.0, scale=(0.9, 1.1), translate: int = 4,
                 padding_mode: str = "reflection", bounds=(0.0, 1.0)):
        super().__init__(bounds)
        if not isinstance(flip, bool):
            raise ArgumentError(f"flip must be True or False, got {flip!r}")
        self.flip = flip
        self.rotation = checked_size("rotation", rotation, allow_zero=True)
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
        # normalized coordinates: entry (0, 1) scales by h / w, entry (1, 0) by w / h.
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
        from pytest_robust.engine.streams import RowStreams

        self._check_images(x)
        return self.transform(x, self.sample_params(RowStreams.single(generator, len(x), x.device, x.dtype)))

    def parameter_space(self, x):
        self._check_images(x)
        return SpatialSpace(self, x)

    def __repr__(self):
        lo, hi = self.scale
        return (
            f"Spatial(flip={self.flip}, rotation={self.rotation:g}, scale=({lo:g}, {hi:g}), "
            f"translate={self.translate}, padding_mode={self.padding_mode!r}{bounds_repr(self.bounds)})"
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
        from pytest_robust.perturbations.base import reflect

        u, z = streams.rand(1), streams.randn(5)
        move = step[:, None] * self.sd * z
        move[:, SHIFT_X:] = torch.round(move[:, SHIFT_X:])
        out = theta + move
        if self.spatial.flip:
            out[:, FLIP] = torch.where(u[:, 0] < 0.5, 1.0 - theta[:, FLIP], theta[:, FLIP])
        return reflect(out, self.lo, self.hi)[0]
