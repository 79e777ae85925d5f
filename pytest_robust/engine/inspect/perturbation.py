"""Inspections of a perturbation where it meets the data: the input box (``box_for``), sizes
that are implausible for the box (``check_scale``, ``check_size``), a perturbation that ignores
its generator (``check_uses_generator``) and objects that are no perturbation at all
(``check_perturbation_object``)."""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import warnings

import torch

from pytest_robust.engine.inspect.data import (
    FEATURES_BOX_ADVICE,
    NORMALIZATION_ADVICE,
    NORMALIZED_INSIDE_ADVICE,
    is_image_batch,
)
from pytest_robust.engine.inspect.model import PROBE_ROWS
from pytest_robust.engine.padding import real_values
from pytest_robust.errors import ArgumentError, RobustDataError, RobustWarning

#: Relative slack of the box check: data this close outside the box is float noise, not a mistake.
BOX_SLACK = 1e-5


def box_for(bounds, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The box ``bounds`` = (lo, hi) as two tensors in x's dtype on x's device that broadcast
    against the batch x of shape (N, ...), or None for no box.

    Each bound is a number (either may be infinite), or a sequence or tensor that broadcasts
    against one input's shape by numpy's rule (trailing dimensions first): a (D,) bound on tabular
    rows (N, D) or on sequences (N, L, D) is one value per feature of the last axis, also when
    L == D. Image batches (N, C, H, W) also take one value per channel as a sequence of C numbers
    (the shape of mean/std lists; as (C, 1, 1)); any other 1-D bound on images is refused rather
    than laid along the width by accident. Any other shape is an ArgumentError naming the bounds'
    shape, the inputs' shape and the accepted shapes."""
    if bounds is None:
        return None
    return tuple(_bound_like(b, x) for b in bounds)


def _bound_like(bound, x: torch.Tensor) -> torch.Tensor:
    """One bound of ``box_for``. A number is filled on x's device (a kernel, where ``as_tensor``
    would be a blocking host-to-device copy: two host waits per batch, seen on CUDA)."""
    if isinstance(bound, numbers.Real):
        return torch.full((), float(bound), dtype=x.dtype, device=x.device)
    t = torch.as_tensor(bound, dtype=x.dtype, device=x.device)
    one = tuple(x.shape[1:])
    images = x.ndim == 4
    if images and t.ndim == 1 and len(t) > 1:
        if len(t) == one[0]:
            return t.reshape(len(t), 1, 1)  # per channel
        raise _misfit(t, x)
    try:
        fits = torch.broadcast_shapes(t.shape, x.shape) == x.shape and (t.ndim < x.ndim or t.shape[0] == 1)
    except RuntimeError:
        fits = False
    if fits:
        return t
    raise _misfit(t, x)


def size_for(size, x: torch.Tensor) -> torch.Tensor:
    """A per-feature size (eps, sigma, scale) laid against the batch x like a bound (``box_for``):
    a tensor in x's dtype on x's device; a shape that does not fit is an ArgumentError that names
    the size, not a bound."""
    try:
        return box_for((size, size), x)[0]
    except ArgumentError as err:
        raise ArgumentError(str(err).replace("bounds of shape", "a per-feature size of shape").replace(
            "do not fit", "does not fit").replace("each of lo and hi", "it")) from None


def _misfit(t: torch.Tensor, x: torch.Tensor) -> ArgumentError:
    """The error for a bound of t's shape that does not fit the batch x, with the shapes that do."""
    one = tuple(x.shape[1:])
    if x.ndim == 4:
        accepted = (f"a sequence of {one[0]} numbers (one per channel, the shape of mean/std lists), a tensor of "
                    f"shape ({one[0]}, 1, 1), or a tensor of one image's shape {one}")
    else:
        accepted = (f"{one[-1] if one else 1} numbers (one per feature of the last axis), or a tensor that "
                    f"broadcasts to one input's shape {one} by numpy's rule (trailing dimensions first)")
    return ArgumentError(f"bounds of shape {tuple(t.shape)} do not fit inputs of shape {one} (a batch "
                         f"{tuple(x.shape)}): each of lo and hi must be a number, {accepted}")


def box_width(bounds, x: torch.Tensor) -> tuple[float, str]:
    """(width, what it is) of the range a size is compared with: the narrowest side of the box
    ``bounds`` (per channel or per element), or without a box the range the data ``x`` spans."""
    if bounds is None:
        values = real_values(x := x.detach())  # padded positions left out
        low, high = (float(v) for v in torch.aminmax(values if values is x else values[~values.isnan()]))
        return high - low, f"the data's range [{low:.4g}, {high:.4g}]"
    lo, hi = box_for(bounds, x[:1])
    return float((hi - lo).min()), "the input box"


def _tightest(size, bounds, x: torch.Tensor) -> tuple[float, float, str]:
    """(size, width, what the width is) of the feature whose size is the largest share of its own
    width (``box_width``; per feature when the box or the size is), for ``check_scale``."""
    per_feature = isinstance(size, torch.Tensor) and size.numel() > 1
    if bounds is None or not (per_feature or not isinstance(bounds[0], (int, float))):
        width, where = box_width(bounds, x)
        return (float(size.max()) if isinstance(size, torch.Tensor) else float(size)), width, where
    lo, hi = box_for(bounds, x[:1])
    widths = (hi - lo).double().expand(x[:1].shape).flatten()
    sizes = (size_for(size, x[:1].double()) if per_feature else torch.tensor(float(size), dtype=torch.float64)
             ).expand(x[:1].shape).flatten()
    shares = torch.where(torch.isfinite(widths) & (widths > 0), sizes / widths, torch.zeros_like(sizes))
    j = int(shares.argmax())
    where = "the input box" if lo.numel() * hi.numel() == 1 else f"the input box at element {j} (flattened)"
    return float(sizes[j]), float(widths[j]), where


#: A size of at least this many standard deviations of the data is warned about (``check_spread``).
SPREAD_RATIO = 5.0
#: Inputs (the first ones) the spread of the data is measured on, at most ...
SPREAD_INPUTS = 4096
#: ... and at most this many values of them (64 MiB in float32): large images use fewer inputs.
SPREAD_VALUES = 2**24


def check_spread(owner: str, name: str, size, x: torch.Tensor, norm: str = "linf", per_feature_ok: bool = True) -> None:
    """RobustWarning when a size is several times the spread of the data it was given: a unit
    mistake (eps=50 on standardized features is 50 standard deviations), never a silent number.

    The spread of feature j is s_j, the standard deviation of coordinate j over the inputs given
    (the first ``SPREAD_INPUTS``, fewer for large inputs: at most ``SPREAD_VALUES`` values, in
    float32); features that never vary (s_j = 0) are left out. The rule, with
    r = ``SPREAD_RATIO`` (5):

    - a size per coordinate (an L-inf radius, a noise level; one number or one per feature) warns
      when size_j >= r s_j for some feature j. On images one number is held against the median
      s_j instead: images have pixels that hardly vary (borders), whose spread alone would make
      every image eps look large;
    - an L2 radius (``norm="l2"``) warns when it is at least r times the smallest s_j (it would
      move that feature by r standard deviations), on images r times the data's root-mean-square
      distance from its mean, sqrt(sum_j s_j^2).

    The warning names the size, the spread it was held against and where, and the fix: one size per
    feature where the check takes one (``per_feature_ok``), else inputs on one scale."""
    rows = max(2, min(SPREAD_INPUTS, SPREAD_VALUES // max(1, x[0].numel())))
    if len(x) < 2:
        return
    spread = _std(real_values(x[:rows].float())).double()
    varies = spread > 0
    if not bool(varies.any()):
        return
    images, per_feature = is_image_batch(x), isinstance(size, torch.Tensor) and size.numel() > 1
    if norm == "l2" and images:
        against, what = float(spread.pow(2).sum().sqrt()), "the data's root-mean-square distance from its mean"
        ratio = float(size) / against
    elif images and not per_feature:
        against = float(spread[varies].median())
        ratio, what = float(size) / against, "the median standard deviation of the features"
    else:  # each feature against its own spread; an L2 radius reaches every feature
        sized = torch.broadcast_to(size_for(size, x[:1]).to(spread) if per_feature else
                                   torch.tensor(float(size), dtype=spread.dtype), spread.shape)
        ratios = torch.where(varies, sized / torch.where(varies, spread, 1.0), 0.0)
        at = int(ratios.flatten().argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), spread.shape))
        ratio, against = float(ratios.flatten()[at]), float(spread.flatten()[at])
        what = f"the standard deviation of feature {index[0] if len(index) == 1 else index}"
    if ratio < SPREAD_RATIO:
        return
    warnings.warn(_spread_warning(owner, name, None if per_feature else float(size), x, norm, per_feature_ok,
                                  (ratio, what, against, min(len(x), rows))), RobustWarning, stacklevel=3)


def _spread_warning(owner: str, name: str, size: float | None, x: torch.Tensor, norm: str, per_feature_ok: bool,
                    found: tuple) -> str:
    """The text of ``check_spread``'s warning: ``size`` (None: per feature) is ``found`` =
    (ratio, what, its value, inputs) times a spread; the fix in the data's terms."""
    ratio, what, against, inputs = found
    shown = "per feature" if size is None else f"{size:g}"
    sequences = x.ndim >= 3 and not is_image_batch(x)  # sequences, and embedding vectors of token ids
    fix = (f"for features on different scales give {name} per feature (a tensor over the last axis)" if sequences
           and per_feature_ok and norm != "l2" else
           f"for features on different scales give {name} per feature, e.g. a fraction of the training scaler's "
           "scale_" if per_feature_ok and norm != "l2" else
           f"{name} is one number here, so give the model inputs on one scale" + (
               "" if sequences else " (standardized, with the scaler as the model's first layer)"))
    docs = "text and sequences" if sequences else "tabular data"
    return (f"{owner}: {name} ({shown}) is {ratio:.3g} times {what}, {against:.4g}, over the {inputs} "
            f"inputs given (a warning from {SPREAD_RATIO:g} times on): {name} is in the units of the data, so check "
            f"that it is not meant in other units; {fix} (docs: {docs})")


def _std(x: torch.Tensor) -> torch.Tensor:
    """The standard deviation of each coordinate over the rows of x (n - 1 in the denominator,
    two passes: the mean, then the squared deviations), leaving out NaN (padded positions,
    ``padding.real_values``); NaN with fewer than two values, exactly 0 for a constant coordinate
    (the mean's rounding would give it a tiny spread)."""
    low, high = x.amin(dim=0), x.amax(dim=0)
    padded = bool(low.isnan().any())  # NaN carries through the extremes
    count = (~x.isnan()).sum(dim=0) if padded else torch.full_like(x[0], len(x))
    deviation = x - (x.nanmean(dim=0) if padded else x.mean(dim=0))
    squares = deviation.pow_(2)
    std = ((squares.nansum(dim=0) if padded else squares.sum(dim=0)) / (count - 1).clamp(min=1)).sqrt_()
    if padded:
        low, high = x.nan_to_num(nan=math.inf).amin(dim=0), x.nan_to_num(nan=-math.inf).amax(dim=0)
    return std.where(low != high, 0.0).where(count > 1, float("nan"))


def check_scale(owner: str, name: str, size, x: torch.Tensor, bounds, *, norm: str = "linf",
                share: float = 1.0, effect: str = "", below: float | None = None, per_feature_ok: bool = True) -> None:
    """RobustWarning when a size parameter (an L-inf radius, a per-coordinate noise level, an
    L2 radius with ``norm="l2"``) is at least ``share`` of the range it lives in: the width of the
    box ``bounds`` (without a box: of the data's range), or for L2 sizes the box's L2 diameter
    (width x sqrt(coordinates)). Such sizes are almost always a unit mistake (eps=8 meant as
    8/255). ``effect`` says what the size does then (", so ..."); sizes of at least ``below``
    times the range are left to another warning (the perturbation's own, ``check_size``). One
    helper for every check's sizes: a perturbation's (``check_size``), smoothing's sigma and
    radius, an attack's eps, NPPR's ball. A per-feature size (a tensor) or a per-feature box is
    compared feature by feature: the feature whose size is the largest share of its own width
    speaks. The size is also held against the spread of the data (``check_spread``; ``per_feature_ok``:
    the check takes one size per feature)."""
    check_spread(owner, name, size, x, norm, per_feature_ok)
    size, width, where = _tightest(size, bounds, x)
    if norm == "l2":
        scale = width * math.sqrt(math.prod(x.shape[1:]))
        reach = f"the L2 diameter {scale:.4g} of {where} (width {width:.4g})"
    else:
        scale, reach = width, f"the width {width:.4g} of {where}"
    if not scale > 0 or size < share * scale or (below is not None and size >= below * scale):
        return
    part = "" if share == 1 else "half " if share == 0.5 else f"{share:g} x "
    units = ("8 grey levels in [0, 1] pixel space is 8/255, not 8" if is_image_batch(x) else
             "a fraction of the features' spread, e.g. of the training scaler's scale_")
    warnings.warn(
        f"{owner}: {name}={size:g} is at least {part}{reach}{effect}; {name} is in the units of your inputs "
        f"({units})",
        RobustWarning,
        stacklevel=3,
    )


def check_perturbation_object(p) -> None:
    """Raise TypeError for a perturbation class instead of an instance, or a callable that
    cannot be called as ``fn(x, generator)``."""
    if isinstance(p, type):
        raise TypeError(
            f"perturbation must be an instance, got the class {p.__name__}: write {p.__name__}(eps=...) "
            "(with its parameters), not the class itself"
        )
    target = getattr(p, "sample", None) if hasattr(p, "parameter_space") else p
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    try:
        signature.bind(None, None)
    except TypeError:
        name = getattr(target, "__qualname__", type(p).__name__)
        raise TypeError(
            f"perturbation {name}{signature} cannot be called as (x, generator): a perturbation "
            "takes the batch x and a torch.Generator and returns x' of x's shape, drawing every "
            "random number from the generator (e.g. torch.rand(x.shape, generator=generator))"
        ) from None


def check_uses_generator(perturbation, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
    """RobustWarning when the same generator state gives different outputs: the perturbation
    draws from another source (the global RNG, numpy, random), so runs do not repeat. A
    conditional perturbation (``Perturbation.conditional``) gets the probe rows' positions and
    labels ``y``, as a check's draws give them."""
    probe = x[:PROBE_ROWS]
    if getattr(perturbation, "conditional", False) and y is not None:
        rows = torch.arange(len(probe), device=y.device)
        perturbation = functools.partial(perturbation.draw, index=rows, y=y[rows])
    outputs = []
    cuda = probe.device.type == "cuda"
    with torch.random.fork_rng(devices=[probe.device] if cuda else []):
        for global_seed in (1, 2):
            torch.default_generator.manual_seed(global_seed)
            if cuda:  # the probe device's global generator only: other GPUs are left alone
                with torch.cuda.device(probe.device):
                    torch.cuda.manual_seed(global_seed)
            gen = torch.Generator(device=probe.device)
            gen.manual_seed(12345)
            outputs.append(perturbation(probe.clone(), gen))
    a, b = outputs
    comparable = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
    if comparable and not torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True):
        warnings.warn(
            f"perturbation {perturbation!r} gave different outputs for the same generator state: it "
            "ignores the generator it is given (drawing from the global RNG, numpy or random?), so "
            "its results depend on what ran before and do not repeat with the seed; draw every "
            "random number from the generator argument (torch.rand(..., generator=generator))",
            RobustWarning,
            stacklevel=4,
        )


def check_size(perturbation, x: torch.Tensor) -> None:
    """RobustWarning when a perturbation's size (eps, sigma, scale) is at least the width of its
    box: every draw then spreads over the whole box (eps=8 meant as 8/255?); ``check_scale``."""
    bounds = getattr(perturbation, "bounds", None)
    name = getattr(perturbation, "coordinate_size", None)  # per-coordinate sizes only
    if not name:
        return
    if bounds is None:
        check_spread(repr(perturbation), name, getattr(perturbation, name), x)
        return
    check_scale(repr(perturbation), name, getattr(perturbation, name), x, bounds,
                effect=", so draws spread over the whole box")


def check_images_only(perturbation, x: torch.Tensor) -> None:
    """ArgumentError when a perturbation defined on images only (``Perturbation.images_only``)
    meets inputs that are not (n, 1 or 3, height, width) images, naming what to use instead."""
    if not getattr(perturbation, "images_only", None) or is_image_batch(x):
        return
    head = (f"{perturbation!r} is for images only ({perturbation.images_only}), and these inputs of shape "
            f"{tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise ArgumentError(
            f"{head} are token ids, not images: perturb the model's embeddings instead (embedding='<the model's "
            "embedding module>' with GaussianNoise(sigma=...) or adversarial_accuracy(eps=...)), or the ids "
            "themselves with a perturbation of your own (a callable (ids, generator) -> ids, e.g. a random token "
            "substitution)")
    raise ArgumentError(
        f"{head} are not images (n, 1 or 3 channels, height, width): for tabular features, sequences "
        "or embeddings use noise in the features' units, e.g. tsrm with UniformLinf(eps=..., bounds=None) or "
        "GaussianNoise(sigma=..., bounds=None) (one size per feature allowed), adversarial_accuracy with "
        "eps=..., or a perturbation of your own (a callable (x, generator) -> x'); images of another layout "
        "go in as (n, channels, height, width), e.g. x.permute(0, 3, 1, 2) for channels-last")


def inspect_inputs(ds, perturbation, normalized: bool = False) -> None:
    """The checks that need both data and perturbation: inputs inside its box, a size that fits
    the box, and a perturbation that draws from its generator (``normalized``: the check normalizes
    inside the model call). Runs once per check, before any evaluation."""
    check_in_box(ds.x, getattr(perturbation, "bounds", None), normalized=normalized)
    check_size(perturbation, ds.x)
    check_uses_generator(perturbation, ds.x, ds.y)


def check_in_box(x: torch.Tensor, bounds, name: str = "data", normalized: bool = False) -> None:
    """Raise RobustDataError when inputs lie outside the perturbation's box ``bounds``: a
    perturbed input is clipped to the box, so such inputs would be silently moved (by more than
    eps) before the model sees them. 0..255 images get the conversion as their fix; with
    ``normalized`` (the check has ``normalize=``), normalized data gets "give the inputs before
    normalization"; inputs that are not images get advice about bounds= in their features' units.
    Bounds of a shape that does not fit the inputs are an ArgumentError (``box_for``)."""
    if bounds is None:
        return
    lo, hi = box_for(bounds, x)
    width = (hi - lo).abs()
    finite = width[torch.isfinite(width)]
    slack = BOX_SLACK * (float(finite.max()) if finite.numel() else 1.0)  # a one-sided box: of its scale 1
    low, high = (float(v) for v in torch.aminmax(x))
    if lo.numel() == 1 and hi.numel() == 1:  # one box for every coordinate: the extremes tell
        outside = low < float(lo) - slack or high > float(hi) + slack
    else:
        outside = bool((x < lo - slack).any() or (x > hi + slack).any())
    if not outside:
        return
    shown = f"bounds=({float(lo.min()):g}, {float(hi.max()):g})" if lo.numel() * hi.numel() > 1 else (
        f"bounds=({float(lo):g}, {float(hi):g})"
    )
    images = is_image_batch(x)
    if images and low >= 0 and 128.0 < high <= 255.0 and float(hi.max()) <= 1.0:
        raise RobustDataError(
            f"{name}: inputs range from {low:g} to {high:g}, which looks like 0..255 images, but the "
            f"perturbation's box is {shown}: divide the images by 255 (torchvision's ToTensor() does) "
            "so that inputs and eps are in [0, 1] pixel units"
        )
    if images and low >= 0 and 1.0 < high <= 128.0 and float(hi.max()) <= 1.0:
        raise RobustDataError(
            f"{name}: inputs range from {low:g} to {high:g}, but the perturbation's box is {shown}: divide the "
            "images by their full scale (the largest value their format holds, e.g. 16 for scikit-learn's 8x8 "
            "digits, 255 for 8-bit images) so that inputs and eps are in [0, 1] pixel units"
        )
    advice = NORMALIZED_INSIDE_ADVICE if normalized else NORMALIZATION_ADVICE if images else FEATURES_BOX_ADVICE
    raise RobustDataError(
        f"{name}: inputs range from {low:g} to {high:g}, outside the perturbation's box {shown}; every "
        f"perturbed input would be clipped into the box, silently changing the data. {advice}"
    )
