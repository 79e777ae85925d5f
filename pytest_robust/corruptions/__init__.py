"""Common corruptions (Hendrycks & Dietterich, ICLR 2019) as batched, seeded perturbations.

``Corruption(name, severity)`` is a ``Perturbation``: ``corruption(x, generator)`` corrupts a
batch of images x of shape (n, channels, height, width), channels 1 or 3, with pixel values in
the box (default [0, 1]; other boxes are mapped to [0, 1] and back), on x's device, in x's dtype
(half precision is computed in float32). Every random choice (noise, per-image directions,
snow, frost, fog and spatter layers, elastic fields, glass-blur offsets) is drawn from the
generator, in a fixed order per call: the same generator state and the same batch give the same
output on the same device. (The evaluation engine draws perturbations in fixed blocks of inputs,
each with its own generator, so a check's numbers do not depend on the batch size.)

The severity tables are those of ImageNet-C for images larger than 64 px and of CIFAR-10-C for
64 px or less (``preset=`` forces one); see ``tables``. The families live in ``noise``, ``blur``,
``weather`` and ``digital``; each function there documents its math.
"""

from __future__ import annotations

import difflib
import numbers

import torch

from ..perturbations import Perturbation, _bounds_repr, _check_bounds
from . import blur, digital, noise, weather
from .tables import BENCHMARK, EXTRA, PRESETS, TABLES, default_preset

ALL = BENCHMARK + EXTRA

_FUNCTIONS = {
    name: getattr(module, name)
    for module in (noise, blur, weather, digital)
    for name in ALL
    if hasattr(module, name)
}

#: Corruptions whose tables give lengths of tens of pixels (streaks, flakes, crystals, drops,
#: pixel swaps); like ``imagecorruptions`` they need images of at least this many px per side.
MIN_SIDE = 32
NEEDS_MIN_SIDE = ("glass_blur", "motion_blur", "snow", "frost", "spatter")
#: Every corruption needs at least this many px per side (pixelate keeps int(0.25 side) px).
ANY_MIN_SIDE = 4
#: Corruptions that change colour and so need 3 channels.
NEEDS_COLOUR = ("saturate",)
#: Slack when checking that images lie in the box (rounding of normalised data).
BOX_SLACK = 1e-5


def corruption_names(subset: str = "all") -> list[str]:
    """Names of the corruptions: ``"benchmark"`` (the 15 of ImageNet-C / CIFAR-10-C), ``"extra"``
    (the 4 held-out ones) or ``"all"`` (both, 19)."""
    subsets = {"benchmark": BENCHMARK, "extra": EXTRA, "all": ALL}
    if subset not in subsets:
        raise ValueError(f"subset must be one of {', '.join(subsets)}, got {subset!r}")
    return list(subsets[subset])


def check_name(name) -> str:
    """``name`` if it is a corruption name, else a ValueError suggesting the closest one."""
    if isinstance(name, str) and name in _FUNCTIONS:
        return name
    close = difflib.get_close_matches(str(name), ALL, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown corruption {name!r}{hint}; known: {', '.join(ALL)}")


def check_severity(severity) -> int:
    """``severity`` as an int if it is 1, 2, 3, 4 or 5, else a ValueError."""
    if isinstance(severity, bool) or not isinstance(severity, numbers.Integral) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer from 1 to 5 (as in ImageNet-C), got {severity!r}")
    return int(severity)


def check_preset(preset) -> str | None:
    if preset is not None and preset not in PRESETS:
        raise ValueError(
            f"preset must be None (by image size: cifar up to 64 px, imagenet above), 'imagenet' or 'cifar', "
            f"got {preset!r}"
        )
    return preset


class Corruption(Perturbation):
    """One corruption of the benchmark at one severity, e.g. ``Corruption("fog", severity=2)``.

    ``name``: one of ``corruption_names()``; ``severity``: 1 (mild) to 5 (severe); ``preset``:
    None picks the CIFAR-10-C table for images of at most 64 px per side and the ImageNet-C
    table above, ``"cifar"`` or ``"imagenet"`` force one. ``bounds``: the pixel box of the
    images (corruptions are defined on [0, 1] images: a box (lo, hi) is mapped to it linearly).
    """

    def __init__(self, name: str, severity: int = 3, preset: str | None = None, bounds=(0.0, 1.0)):
        if bounds is None:
            raise ValueError("a Corruption needs the images' pixel box (bounds=(lo, hi)); None is not allowed")
        super().__init__(bounds)
        self.name = check_name(name)
        self.severity = check_severity(severity)
        self.preset = check_preset(preset)

    def preset_for(self, x: torch.Tensor) -> str:
        """The table used for images of x's size."""
        return self.preset or default_preset(*x.shape[-2:])

    def parameters(self, x: torch.Tensor):
        """The table row used for images of x's size (see ``tables.TABLES``)."""
        return TABLES[self.name][self.preset_for(x)][self.severity - 1]

    def check_images(self, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Raise ValueError naming the problem if this corruption cannot apply to x."""
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"{self!r} corrupts images of shape (n, channels, height, width), got {shape}: "
                "add the batch dimension (x[None]) or reshape flat inputs to images"
            )
        if not x.dtype.is_floating_point:
            raise ValueError(
                f"{self!r} needs floating-point images in the box, got dtype {x.dtype}: use x.float() / 255"
            )
        channels, h, w = x.shape[1:]
        if channels not in (1, 3):
            raise ValueError(
                f"{self!r} needs 1 (grey) or 3 (RGB) channels in dimension 1, got shape {tuple(x.shape)} "
                "(channels-last images: x.permute(0, 3, 1, 2))"
            )
        if self.name in NEEDS_COLOUR and channels != 3:
            raise ValueError(f"{self.name} changes colour saturation and needs RGB images (3 channels); "
                             f"a grey image has none: leave {self.name} out for grey images")
        need = MIN_SIDE if self.name in NEEDS_MIN_SIDE else ANY_MIN_SIDE
        if min(h, w) < need:
            raise ValueError(
                f"{self.name} cannot apply to {h}x{w} images: its table describes structures tens of pixels long "
                f"and needs at least {need}x{need} px. Leave it out for small images (corruptions that apply at any "
                f"size: {', '.join(n for n in ALL if n not in NEEDS_MIN_SIDE + NEEDS_COLOUR)})"
                if need == MIN_SIDE else f"{self.name} needs images of at least {need}x{need} px, got {h}x{w}"
            )
        lo, hi = self.bounds
        if isinstance(lo, numbers.Real) and isinstance(hi, numbers.Real):
            smallest, largest = (float(v) for v in torch.aminmax(x))  # one pass over the batch
            outside = max(float(lo) - smallest, largest - float(hi))
        else:
            lo, hi = self._box(x)
            outside = max(float((lo - x).amax()), float((x - hi).amax()))
            smallest, largest = float(x.amin()), float(x.amax())
        if outside > BOX_SLACK * float(torch.as_tensor(hi - lo).amax()):
            raise ValueError(
                f"{self!r}: images must lie in the box {self.bounds} (pixel values, e.g. [0, 1] from "
                f"ToTensor()), got values from {smallest:.4g} to {largest:.4g}. Normalise inside the model, "
                "or pass bounds=(lo, hi) for the data's range"
            )
        if generator is not None and torch.device(generator.device).type != x.device.type:
            raise ValueError(
                f"the generator is on {generator.device} but the images are on {x.device}: "
                f"use torch.Generator(device={str(x.device)!r})"
            )

    def _box(self, x):
        return tuple(torch.as_tensor(b, device=x.device, dtype=x.dtype) for b in self.bounds)

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The corrupted batch, already in the box (so ``__call__`` adds no clipping pass)."""
        self.check_images(x, generator)
        work = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        unit_box = all(isinstance(b, numbers.Real) for b in self.bounds) and tuple(self.bounds) == (0, 1)
        if unit_box:
            unit = x.to(work)  # no copy for float32/float64; values within BOX_SLACK of the box
        else:
            lo, hi = (b.to(work) for b in self._box(x))
            unit = ((x.to(work) - lo) / (hi - lo)).clamp_(0, 1)
        out = _FUNCTIONS[self.name](unit, self.parameters(x), generator, self.preset_for(x)).clamp_(0, 1)
        if not unit_box:
            out = out.mul_(hi - lo).add_(lo)
        return out.to(x.dtype)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.sample(x, generator)

    def __repr__(self):
        preset = f", preset={self.preset!r}" if self.preset else ""
        return f"Corruption({self.name!r}, severity={self.severity}{preset}{_bounds_repr(self.bounds)})"


class CorruptionGrid(Perturbation):
    """Every image gets one (corruption, severity) cell drawn uniformly from a grid, then that
    corruption: the mixture that makes "mean accuracy over the grid" one Bernoulli mean.

    ``cells(n, generator)`` are the first draws from the generator: the cell index of each of
    the n images (cell k is ``self.grid[k]``); then one seed per cell for the corruptions of that
    cell's images. So the cells of a batch are recomputed from a copy of the generator's state.
    """

    def __init__(self, corruptions=None, severities=None, preset: str | None = None, bounds=(0.0, 1.0)):
        super().__init__(_check_bounds(bounds))
        names = corruption_names("benchmark") if corruptions is None else corruptions
        levels = (1, 2, 3, 4, 5) if severities is None else severities
        if isinstance(names, str) or not list(names):
            raise ValueError(f"corruptions must be a non-empty list of names, e.g. ['fog', 'contrast'], got {names!r}")
        if isinstance(levels, (str, int)) or not list(levels):
            raise ValueError(f"severities must be a non-empty list of integers 1-5, e.g. [1, 2, 3], got {levels!r}")
        self.corruptions = tuple(dict.fromkeys(check_name(n) for n in names))
        self.severities = tuple(sorted(dict.fromkeys(check_severity(s) for s in levels)))
        self.preset = check_preset(preset)
        self.members = [Corruption(n, s, preset, bounds) for n in self.corruptions for s in self.severities]
        self.grid = [(m.name, m.severity) for m in self.members]

    def cells(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """The cell index of each of n images (consumes the first draws of ``generator``)."""
        return torch.randint(len(self.grid), (n,), generator=generator, device=generator.device)

    def sample(self, x, generator):
        cells = self.cells(len(x), generator)
        seeds = torch.randint(2**62, (len(self.grid),), generator=generator, device=generator.device).tolist()
        out = torch.empty_like(x)
        for k in torch.unique(cells).tolist():
            rows = (cells == k).nonzero().flatten()
            child = torch.Generator(device=generator.device).manual_seed(seeds[k])
            out[rows] = self.members[k](x[rows], child)
        return out

    def __repr__(self):
        names = "all 15" if self.corruptions == BENCHMARK else ", ".join(self.corruptions)
        levels = ", ".join(map(str, self.severities))
        preset = f", preset={self.preset!r}" if self.preset else ""
        return f"CorruptionGrid(corruptions=[{names}], severities=[{levels}]{preset}{_bounds_repr(self.bounds)})"
