"""Common corruptions (Hendrycks & Dietterich, ICLR 2019) as batched, seeded perturbations.

``Corruption(name, severity)`` is a ``Perturbation``: ``corruption(x, generator)`` corrupts a
batch of images x of shape (n, channels, height, width), channels 1 or 3, with pixel values in
the box (default [0, 1]; other boxes are mapped to [0, 1] and back), on x's device, in x's dtype
(half precision is computed in float32). Every random choice (noise, per-image directions,
snow, frost, fog and spatter layers, elastic fields, glass-blur offsets) is drawn from the
generator, in a fixed order per call: the same generator state and the same batch give the same
output on the same device. (The evaluation engine draws perturbations in fixed blocks of inputs,
each with its own generator, so a check's numbers do not depend on the batch size.)

On a GPU the corruptions do not wait for the device: no value is read back to the host (JPEG too is coded on the
device, ``jpeg``; on a CPU, by libjpeg-turbo, Pillow's codec, with the same numbers). The box check of
``Corruption.sample`` reads the batch's extremes; the engine's ``draw`` skips it, as the data were checked once.

Arguments and images a corruption cannot take raise ``ArgumentError`` (a ``ValueError``) naming
the problem and the fix. A ``CorruptionGrid`` whose corruptions were not named (the default grid)
leaves out those that cannot apply to the images (too small, or grey), with a ``RobustWarning``
naming them and why (``CorruptionGrid.left_out``); corruptions named explicitly must all apply.

The severity tables are those of ImageNet-C for images larger than 64 px and of CIFAR-10-C for
64 px or less (``preset=`` forces one); see ``tables``. The families live in ``noise``, ``blur``,
``weather`` and ``digital``; each function there documents its math.
"""

from __future__ import annotations

import difflib
import itertools
import numbers
import warnings

import torch

from pytest_robust.engine.device import upload
from pytest_robust.engine.inspect.perturbation import BOX_SLACK, box_for
from pytest_robust.engine.precision import at_least_float32
from pytest_robust.engine.streams import stream_generator
from pytest_robust.errors import ArgumentError, RobustWarning
from pytest_robust.perturbations.base import Perturbation, bounds_repr, checked_box
from pytest_robust.perturbations.corruptions import blur, digital, noise, weather
from pytest_robust.perturbations.corruptions.tables import BENCHMARK, EXTRA, PRESETS, TABLES, default_preset

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
#: Corruptions whose result lies in [0, 1] whatever the input (JPEG's decoded levels k / 255): not clamped.
IN_UNIT_BOX = ("jpeg_compression",)
#: Every corruption needs at least this many px per side (pixelate keeps int(0.25 side) px).
ANY_MIN_SIDE = 4
#: Corruptions that change colour and so need 3 channels.
NEEDS_COLOUR = ("saturate",)
#: Corruptions that draw nothing and whose function also takes a list of one parameter per image:
#: a grid corrupts the images of all their cells in one call (one codec call per batch instead of
#: one per severity).
PER_IMAGE = ("jpeg_compression",)


def corruption_names(subset: str = "all") -> list[str]:
    """Names of the corruptions: ``"benchmark"`` (the 15 of ImageNet-C / CIFAR-10-C), ``"extra"``
    (the 4 held-out ones) or ``"all"`` (both, 19)."""
    subsets = {"benchmark": BENCHMARK, "extra": EXTRA, "all": ALL}
    if subset not in subsets:
        raise ArgumentError(f"subset must be one of {', '.join(subsets)}, got {subset!r}")
    return list(subsets[subset])


def check_name(name) -> str:
    """``name`` if it is a corruption name, else an ArgumentError suggesting the closest one."""
    if isinstance(name, str) and name in _FUNCTIONS:
        return name
    text = str(name).lower().replace("-", "_").replace(" ", "_")
    close = difflib.get_close_matches(text, ALL, n=1) or [n for n in ALL if text and text in n][:1]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ArgumentError(f"unknown corruption {name!r}{hint}; known: {', '.join(ALL)}")


def check_severity(severity) -> int:
    """``severity`` as an int if it is 1, 2, 3, 4 or 5, else an ArgumentError."""
    if isinstance(severity, bool) or not isinstance(severity, numbers.Integral) or not 1 <= severity <= 5:
        raise ArgumentError(f"severity must be an integer from 1 to 5 (as in ImageNet-C), got {severity!r}")
    return int(severity)


def check_preset(preset) -> str | None:
    if preset is not None and preset not in PRESETS:
        raise ArgumentError(
            f"preset must be None (by image size: cifar up to 64 px, imagenet above), 'imagenet' or 'cifar', "
            f"got {preset!r}"
        )
    return preset


def check_layout(owner, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """Raise ArgumentError unless x is a batch of floating-point images (n, 1 or 3, height,
    width) and ``generator`` (if given) is on x's device type: what every corruption needs, so
    no grid can leave it out. ``owner`` names the corruption (or grid) in the message."""
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ArgumentError(
            f"{owner!r} corrupts images of shape (n, channels, height, width), got {shape}: "
            "add the batch dimension (x[None]) or reshape flat inputs to images"
        )
    if not x.dtype.is_floating_point:
        raise ArgumentError(
            f"{owner!r} needs floating-point images in the box, got dtype {x.dtype}: use x.float() / 255"
        )
    if x.shape[1] not in (1, 3):
        raise ArgumentError(
            f"{owner!r} needs 1 (grey) or 3 (RGB) channels in dimension 1, got shape {tuple(x.shape)} "
            "(channels-last images: x.permute(0, 3, 1, 2))"
        )
    if generator is not None and torch.device(generator.device).type != x.device.type:
        raise ArgumentError(
            f"the generator is on {generator.device} but the images are on {x.device}: "
            f"use torch.Generator(device={str(x.device)!r})"
        )


class Corruption(Perturbation):
    """One corruption of the benchmark at one severity, e.g. ``Corruption("fog", severity=2)``.

    ``name``: one of ``corruption_names()``; ``severity``: 1 (mild) to 5 (severe); ``preset``: None picks the
    CIFAR-10-C table for images of at most 64 px per side and the ImageNet-C table above, ``"cifar"`` or
    ``"imagenet"`` force one. ``bounds``: the pixel box of the images (corruptions are defined on [0, 1] images:
    a box (lo, hi) is mapped to it linearly). A JPEG corruption imports torchvision's codec when built."""

    images_only = "common corruptions of images (blur, weather, digital artefacts)"

    def __init__(self, name: str, severity: int = 3, preset: str | None = None, bounds=(0.0, 1.0)):
        if bounds is None:
            raise ArgumentError("a Corruption needs the images' pixel box (bounds=(lo, hi)); None is not allowed")
        super().__init__(bounds)
        self.name = check_name(name)
        self.severity = check_severity(severity)
        self.preset = check_preset(preset)
        if self.name == "jpeg_compression":
            digital.libjpeg()  # now rather than at the first draw

    def preset_for(self, x: torch.Tensor) -> str:
        """The table used for images of x's size."""
        return self.preset or default_preset(*x.shape[-2:])

    def parameters(self, x: torch.Tensor):
        """The table row used for images of x's size (see ``tables.TABLES``)."""
        return TABLES[self.name][self.preset_for(x)][self.severity - 1]

    def check_images(self, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Raise ArgumentError naming the problem if this corruption cannot apply to x: its shape,
        dtype and size (``check_shape``) and its values (``check_box``)."""
        self.check_shape(x, generator)
        self.check_box(x)

    def check_shape(self, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Raise ArgumentError if x is not a batch of images this corruption applies to, or the
        generator is on another device type; reads no value of x (no host synchronisation)."""
        check_layout(self, x, generator)
        problem = self.size_problem(x)
        if problem is not None:
            fix = (f"leave {self.name} out for grey images" if self.name in NEEDS_COLOUR else
                   f"Leave it out for small images (corruptions that apply at any size: "
                   f"{', '.join(n for n in ALL if n not in NEEDS_MIN_SIDE + NEEDS_COLOUR)})"
                   if self.name in NEEDS_MIN_SIDE else "Use larger images or leave it out")
            raise ArgumentError(f"{problem}{':' if self.name in NEEDS_COLOUR else '.'} {fix}")

    def size_problem(self, x: torch.Tensor) -> str | None:
        """Why this corruption cannot apply to images of x's size and channels (too small, or
        grey for a colour corruption), or None when it can; x is a batch that ``check_layout``
        accepted."""
        channels, h, w = x.shape[1:]
        if self.name in NEEDS_COLOUR and channels != 3:
            return (f"{self.name} changes colour saturation and needs RGB images (3 channels); "
                    "a grey image has none")
        need = MIN_SIDE if self.name in NEEDS_MIN_SIDE else ANY_MIN_SIDE
        if min(h, w) >= need:
            return None
        if need == MIN_SIDE:
            return (f"{self.name} cannot apply to {h}x{w} images: its table describes structures tens of pixels "
                    f"long and needs at least {need}x{need} px")
        return f"{self.name} needs images of at least {need}x{need} px, got {h}x{w}"

    def check_box(self, x: torch.Tensor) -> None:
        """Raise ArgumentError if x has values outside the box (beyond ``BOX_SLACK``): reads the
        extremes of x back to the host, so it runs once per call of ``sample``, not per ``draw``."""
        lo, hi = self.bounds
        if isinstance(lo, numbers.Real) and isinstance(hi, numbers.Real):
            smallest, largest = (float(v) for v in torch.aminmax(x))  # one pass over the batch
            outside = max(float(lo) - smallest, largest - float(hi))
        else:
            lo, hi = self._box(x)
            outside = max(float((lo - x).amax()), float((x - hi).amax()))
            smallest, largest = float(x.amin()), float(x.amax())
        if outside > BOX_SLACK * float(torch.as_tensor(hi - lo).amax()):
            raise ArgumentError(
                f"{self!r}: images must lie in the box {self.bounds} (pixel values, e.g. [0, 1] from "
                f"ToTensor()), got values from {smallest:.4g} to {largest:.4g}. Normalize inside the model, "
                "or pass bounds=(lo, hi) for the data's range"
            )

    def _box(self, x):
        """(lo, hi) as tensors on x's device in x's dtype; numbers are filled in on the device
        (``torch.full``), tensors and per-channel sequences converted and shaped against the
        batch x (``inspect.perturbation.box_for``; a host tensor is copied there)."""
        if all(isinstance(b, numbers.Real) for b in self.bounds):
            return tuple(torch.full((), b, device=x.device, dtype=x.dtype) for b in self.bounds)
        return box_for(self.bounds, x)

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The corrupted batch, already in the box (so ``__call__`` adds no clipping pass)."""
        self.check_images(x, generator)
        return self.corrupt(x, generator)

    def draw(self, x: torch.Tensor, generator: torch.Generator, index: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The engine's draw: rows of the check's data, whose box ``inspect.perturbation.check_in_box``
        checked once per check, so only ``check_shape`` runs here (no host synchronisation)."""
        self.check_shape(x, generator)
        return self.corrupt(x, generator)

    def corrupt(self, x: torch.Tensor, generator: torch.Generator | None, parameters=None) -> torch.Tensor:
        """``sample`` without the checks: x mapped from the box to [0, 1], corrupted in float32 or wider
        with ``parameters`` (default: this severity's table row, ``parameters(x)``), clamped to [0, 1]
        (unless it lies there already, ``IN_UNIT_BOX``), mapped back to the box, in x's dtype."""
        work = at_least_float32(x.dtype)
        unit_box = all(isinstance(b, numbers.Real) for b in self.bounds) and tuple(self.bounds) == (0, 1)
        if unit_box:
            unit = x.to(work)  # no copy for float32/float64; values within BOX_SLACK of the box
        else:
            lo, hi = (b.to(work) for b in self._box(x))
            unit = ((x.to(work) - lo) / (hi - lo)).clamp_(0, 1)
        c = self.parameters(x) if parameters is None else parameters
        out = _FUNCTIONS[self.name](unit, c, generator, self.preset_for(x))
        out = out if self.name in IN_UNIT_BOX else out.clamp_(0, 1)
        if not unit_box:
            out = out.mul_(hi - lo).add_(lo)
        return out.to(x.dtype)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.sample(x, generator)

    def __repr__(self):
        preset = f", preset={self.preset!r}" if self.preset else ""
        return f"Corruption({self.name!r}, severity={self.severity}{preset}{bounds_repr(self.bounds)})"


def host_generator(generator: torch.Generator) -> torch.Generator:
    """The generator a grid draws its cells and seeds from, on the host, where they are needed.

    A CPU generator is used itself. A device generator's draws could only be read by waiting for
    the device, so the grid draws from a CPU generator seeded from the device generator's state
    (its seed and offset, which it keeps on the host: reading them does not wait) and advances
    the device generator by one draw, so that its next state gives other cells.
    """
    if generator.device.type == "cpu":
        return generator
    state = generator.get_state().tolist()  # a host tensor
    torch.empty(1, device=generator.device).uniform_(generator=generator)
    return stream_generator(0, "corruption-grid", *state)


class CorruptionGrid(Perturbation):
    """Every image gets one (corruption, severity) cell drawn uniformly from a grid, then that
    corruption: the mixture that makes "mean accuracy over the grid" one Bernoulli mean.

    ``cells(n, generator)`` are the first draws from the generator (on the host,
    ``host_generator``): the cell index of each of the n images (cell k is ``self.grid[k]``);
    then one seed per cell for the corruptions of that cell's images. So the cells of a batch are
    recomputed from a copy of the generator's state.

    Without ``corruptions`` (the default grid: the 15 of the benchmark) the corruptions that
    cannot apply to the images a grid first meets (too small, or grey for a colour corruption) are
    left out, with a RobustWarning naming them and why; ``left_out`` maps each to its reason.
    Corruptions named explicitly must all apply: one that cannot is an ArgumentError.
    """

    images_only = Corruption.images_only

    def __init__(self, corruptions=None, severities=None, preset: str | None = None, bounds=(0.0, 1.0)):
        super().__init__(checked_box(bounds))
        names = corruption_names("benchmark") if corruptions is None else corruptions
        levels = (1, 2, 3, 4, 5) if severities is None else severities
        if isinstance(names, str) or not list(names):
            raise ArgumentError(f"corruptions must be a non-empty list of names, e.g. ['fog', 'contrast'], "
                                f"got {names!r}")
        if isinstance(levels, (str, int)) or not list(levels):
            raise ArgumentError(f"severities must be a non-empty list of integers 1-5, e.g. [1, 2, 3], got {levels!r}")
        self.named = corruptions is not None  # named by the user: each must apply, none is left out
        self.left_out: dict[str, str] = {}
        self.corruptions = tuple(dict.fromkeys(check_name(n) for n in names))
        self.severities = tuple(sorted(dict.fromkeys(check_severity(s) for s in levels)))
        self.preset = check_preset(preset)
        self.members = [Corruption(n, s, preset, bounds) for n in self.corruptions for s in self.severities]
        self.grid = [(m.name, m.severity) for m in self.members]

    def cells(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """The cell index of each of n images, a CPU tensor (the first draws of
        ``host_generator(generator)``)."""
        return self._cells(n, host_generator(generator))

    def _cells(self, n: int, host: torch.Generator) -> torch.Tensor:
        """The first draws of the host generator ``host``: a cell index per image."""
        return torch.randint(len(self.grid), (n,), generator=host)

    def check_shape(self, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """``Corruption.check_shape`` for every corruption of the grid (whichever cells are drawn),
        after a default grid has left out those that cannot apply to x (``leave_out``)."""
        check_layout(self, x, generator)
        if not self.named:
            self.leave_out(x)
        for member in self.members[::len(self.severities)]:
            member.check_shape(x, generator)

    def leave_out(self, x: torch.Tensor) -> None:
        """Drop the corruptions that cannot apply to the images x (``Corruption.size_problem``)
        from the grid, with a RobustWarning naming them and why, and record them in
        ``left_out``; an ArgumentError when none applies. Nothing to do (no warning) once the
        grid fits images of x's size."""
        why = {}
        for member in self.members[::len(self.severities)]:
            if member.size_problem(x) is not None:
                need = MIN_SIDE if member.name in NEEDS_MIN_SIDE else ANY_MIN_SIDE
                why[member.name] = ("it changes colour and needs RGB images (3 channels)" if member.name in NEEDS_COLOUR
                                    else f"it needs images of at least {need}x{need} px")
        if not why:
            return
        channels, h, w = x.shape[1:]
        images = f"{h}x{w} {'grey ' if channels == 1 else ''}images"
        kept = [n for n in self.corruptions if n not in why]
        reasons = {}
        for name, reason in why.items():
            reasons.setdefault(reason, []).append(name)
        told = "; ".join(f"{', '.join(names)}: {reason.replace('it ', 'each ' if len(names) > 1 else 'it ', 1)}"
                         for reason, names in reasons.items())
        if not kept:
            raise ArgumentError(f"no corruption of the default grid applies to {images} ({told}): use images of at "
                                f"least {ANY_MIN_SIDE}x{ANY_MIN_SIDE} px, or another perturbation")
        self.left_out.update(why)
        self.corruptions = tuple(kept)
        self.members = [m for m in self.members if m.name not in why]
        self.grid = [(m.name, m.severity) for m in self.members]
        warnings.warn(
            f"the default corruption grid leaves out {len(why)} corruption(s) that cannot apply to {images} ({told}) "
            f"and runs the {len(kept)} that do: {', '.join(kept)}; name corruptions=[...] to choose them yourself",
            RobustWarning, stacklevel=3,
        )

    def sample(self, x, generator):
        """The corrupted batch (``_mix``), after the checks of ``Corruption.sample``."""
        self.check_shape(x, generator)
        self.members[0].check_box(x)
        return self._mix(x, generator)

    def draw(self, x, generator, index, y):
        """The engine's draw: as ``Corruption.draw``, no host synchronisation."""
        self.check_shape(x, generator)
        return self.clip(self._mix(x, generator))

    def _mix(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Each image corrupted by its cell's corruption: the images of cell k together, with the
        generator seeded by seed k; those of a ``PER_IMAGE`` corruption together over its
        severities, each with its own parameter. Cells and seeds are host data
        (``host_generator``): the rows of each group, in increasing order, are found on the host
        and go to the device in one asynchronous copy, so nothing waits for the device."""
        n, host = len(x), host_generator(generator)
        cells = self._cells(n, host)
        seeds = torch.randint(2**62, (len(self.grid),), generator=host)
        drawn = torch.cat([cells, seeds]).tolist()  # host memory: no device synchronisation
        cells, seeds = drawn[:n], drawn[n:]
        order = sorted(range(n), key=cells.__getitem__)  # stable: a cell's rows in increasing order
        groups = [list(group) for _, group in itertools.groupby((cells[i] for i in order), key=self._group_of)]
        rows = torch.split(upload(torch.tensor(order, dtype=torch.long), x.device), [len(g) for g in groups])
        out = torch.empty_like(x)
        for group, index in zip(groups, rows):
            member = self.members[group[0]]
            if member.name in PER_IMAGE:
                out[index] = member.corrupt(x[index], None, [self.members[k].parameters(x) for k in group])
            else:
                child = torch.Generator(device=generator.device).manual_seed(seeds[group[0]])
                out[index] = member.corrupt(x[index], child)
        return out

    def _group_of(self, cell: int):
        """The group of ``cell`` in ``_mix``: its corruption's name for a ``PER_IMAGE`` one, else itself."""
        name = self.grid[cell][0]
        return name if name in PER_IMAGE else cell

    def __repr__(self):
        names = "all 15" if self.corruptions == BENCHMARK else ", ".join(self.corruptions)
        levels = ", ".join(map(str, self.severities))
        preset = f", preset={self.preset!r}" if self.preset else ""
        return f"CorruptionGrid(corruptions=[{names}], severities=[{levels}]{preset}{bounds_repr(self.bounds)})"
