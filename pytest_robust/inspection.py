"""Cheap inspections of what a user hands a check: the model, the data, the perturbation.

Each function looks for one common mistake and either raises an error that names the mistake and
its fix (``RobustDataError`` / ``RobustModelError`` / ``TypeError``) or, where the tool cannot be
sure, issues a ``RobustWarning``. ``records_warnings`` wraps a metric function so that every
RobustWarning raised while it runs is also listed in its Result's ``details["warnings"]``.

Where they run: ``check_model`` when a check first touches the model (``engine.guarded`` and
``engine.resolve_device``), ``check_finite`` and ``check_loader_order`` when data is
materialised (``engine.load_data``), ``check_perturbation_object`` when a perturbation is
accepted (``perturbations.as_perturbation``), ``inspect_inputs`` once per check where the data
meets its perturbation, ``check_outputs`` on the first batch of logits and
``explain_model_error`` when the model fails on its first batch (``engine.Forward``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import sys
import warnings

import torch

from .errors import ArgumentError, RobustDataError, RobustModelError, RobustWarning
from .reading import host_rng, input_and_label

#: Relative slack of the box check: data this close outside the box is float noise, not a mistake.
BOX_SLACK = 1e-5
#: How close to 1 a row of non-negative outputs must sum to be read as probabilities.
PROBABILITY_TOLERANCE = 1e-3
#: Rows used to probe a perturbation for reproducibility.
PROBE_ROWS = 4

NORMALISATION_ADVICE = (
    "keep inputs in [0, 1] pixel space and pass the model's normalisation as normalize=(mean, std) "
    "(--robust-normalize; recommended: the check normalises inside the model call, so eps stays in pixel "
    "units), or pass the perturbation bounds= in your data's units (e.g. UniformLinf(eps=..., bounds=(lo, "
    "hi))), or bounds=None for no box"
)
#: The advice instead when normalize= is set: the data is expected in pixel units already.
NORMALISED_INSIDE_ADVICE = (
    "normalize= is set, so the check normalises inside the model call and expects the data in [0, 1] "
    "pixel units: give it the images before normalisation (e.g. ToTensor() alone)"
)
#: Attributes through which a data object reaches its transforms (DataLoader, Subset, ConcatDataset,
#: torchvision datasets and Compose), searched for a normalising transform.
PIPELINE_ATTRIBUTES = ("dataset", "datasets", "transform", "transforms")


def check_model(model) -> None:
    """Raise RobustModelError unless ``model`` is an ``nn.Module`` instance, with the likely fix."""
    if isinstance(model, torch.nn.Module):
        return
    if isinstance(model, type) and issubclass(model, torch.nn.Module):
        hint = f"pass an instance, e.g. {model.__name__}(...), with its weights loaded"
    elif isinstance(model, dict):
        hint = "this looks like a state_dict: build the model and call model.load_state_dict(...)"
    elif isinstance(model, (tuple, list)):
        hint = "return the model alone from the model fixture (data belongs in the data fixture)"
    elif isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        hint = "load the model from this path in the fixture (torch.load or your model class)"
    elif callable(model):
        hint = "wrap the function in a torch.nn.Module whose forward returns logits"
    else:
        hint = "return a torch.nn.Module that maps a batch of inputs to logits"
    raise RobustModelError(f"the model must be a torch.nn.Module, got {type(model).__name__}: {hint}")


def check_finite(x: torch.Tensor) -> None:
    """Raise RobustDataError naming the first input with NaN or infinite values."""
    bad = ~torch.isfinite(x.reshape(len(x), -1)).all(dim=1)
    if bad.any():
        rows = bad.nonzero().flatten()
        first = int(rows[0])
        kind = "NaN" if torch.isnan(x[first]).any() else "infinite"
        raise RobustDataError(
            f"the data contains NaN or infinite values: input {first} has {kind} values "
            f"({len(rows)} of {len(x)} inputs affected); clean or drop them before the check"
        )


def check_loader_order(loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
    """A loader that yields the whole dataset in index order: a shuffling (or otherwise sampled)
    map-style loader is re-read with a sequential sampler, so that which input sits at which
    index, and hence every number, depends only on the check's seed, not on the global RNG; one
    with ``drop_last=True`` is re-read without it, so no input is silently left out."""
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset) or (
        isinstance(loader.sampler, torch.utils.data.SequentialSampler) and not loader.drop_last
    ):
        return loader
    return torch.utils.data.DataLoader(
        dataset, batch_size=loader.batch_size or 512, shuffle=False, collate_fn=loader.collate_fn,
        num_workers=loader.num_workers,
    )


def check_reads_repeat(dataset) -> None:
    """RobustWarning when a map-style dataset returns a different input on a second read of
    item 0 (a random augmentation left in the evaluation data)."""
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        return
    try:
        if len(dataset) == 0:
            return
    except TypeError:
        return
    with host_rng(0):
        first = dataset[0]
    with host_rng(1):
        second = dataset[0]
    a, b = (torch.as_tensor(input_and_label(item)[0]) for item in (first, second))
    if a.shape != b.shape or not torch.equal(a, b):
        warnings.warn(
            "the dataset returns a different input each time item 0 is read (a random augmentation "
            "in the evaluation data?): pytest-robust reads it under a fixed RNG so runs repeat, but "
            "the check then measures one random augmentation of each input; remove random "
            "transforms from the evaluation dataset",
            RobustWarning,
            stacklevel=4,
        )


def box_for(bounds, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The box ``bounds`` = (lo, hi) as two tensors in x's dtype on x's device that broadcast
    against the batch x of shape (N, ...), or None for no box.

    Each bound is a number, a per-channel sequence or tensor of length C (one value per channel
    of (N, C, ...) inputs: the shape of mean/std lists; reshaped to (C, 1, ...)), or a tensor that
    broadcasts to one input (e.g. (C, 1, 1) or the input's shape). Any other shape is an
    ArgumentError naming the bounds' shape, the inputs' shape and the accepted shapes: a bound
    must never broadcast along the wrong dimension (a length-4 bound on 4 px wide images)."""
    if bounds is None:
        return None
    return tuple(_bound_like(b, x) for b in bounds)


def _bound_like(bound, x: torch.Tensor) -> torch.Tensor:
    """One bound of ``box_for``."""
    t = torch.as_tensor(bound, dtype=x.dtype, device=x.device)
    one = tuple(x.shape[1:])
    if t.ndim == 1 and len(t) > 1 and x.ndim >= 3 and len(t) == x.shape[1]:
        return t.reshape((len(t),) + (1,) * (x.ndim - 2))  # per channel
    try:
        fits = torch.broadcast_shapes(t.shape, x.shape) == x.shape and (t.ndim < x.ndim or t.shape[0] == 1)
    except RuntimeError:
        fits = False
    if fits and not (t.ndim == 1 and len(t) > 1 and x.ndim >= 3):
        return t
    channels = one[0] if one else 1
    per_channel = (f"a sequence of {channels} numbers (one per channel, the shape of mean/std lists), "
                   f"a tensor of shape ({channels}, {', '.join('1' for _ in one[1:])}) "
                   if len(one) >= 2 else f"a sequence of {channels} numbers (one per feature), ")
    raise ArgumentError(
        f"bounds of shape {tuple(t.shape)} do not fit inputs of shape {one} (a batch {tuple(x.shape)}): each of "
        f"lo and hi must be a number, {per_channel}or a tensor that broadcasts to one input's shape {one}"
    )


def box_width(bounds, x: torch.Tensor) -> tuple[float, str]:
    """(width, what it is) of the range a size is compared with: the narrowest side of the box
    ``bounds`` (per channel or per element), or without a box the range the data ``x`` spans."""
    if bounds is None:
        low, high = (float(v) for v in torch.aminmax(x.detach()))
        return high - low, f"the data's range [{low:.4g}, {high:.4g}]"
    lo, hi = box_for(bounds, x[:1])
    return float((hi - lo).min()), "the input box"


def check_scale(owner: str, name: str, size: float, x: torch.Tensor, bounds, *, norm: str = "linf",
                share: float = 1.0, effect: str = "", below: float | None = None) -> None:
    """RobustWarning when a size parameter (an L-inf radius, a per-coordinate noise level, an
    L2 radius with ``norm="l2"``) is at least ``share`` of the range it lives in: the width of the
    box ``bounds`` (without a box: of the data's range), or for L2 sizes the box's L2 diameter
    (width x sqrt(coordinates)). Such sizes are almost always a unit mistake (eps=8 meant as
    8/255). ``effect`` says what the size does then (", so ..."); sizes of at least ``below``
    times the range are left to another warning (the perturbation's own, ``check_size``). One
    helper for every check's sizes: a perturbation's (``check_size``), smoothing's sigma and
    radius, an attack's eps, NPPR's ball."""
    width, where = box_width(bounds, x)
    if norm == "l2":
        scale = width * math.sqrt(math.prod(x.shape[1:]))
        reach = f"the L2 diameter {scale:.4g} of {where} (width {width:.4g})"
    else:
        scale, reach = width, f"the width {width:.4g} of {where}"
    if not scale > 0 or size < share * scale or (below is not None and size >= below * scale):
        return
    part = "" if share == 1 else "half " if share == 0.5 else f"{share:g} x "
    warnings.warn(
        f"{owner}: {name}={size:g} is at least {part}{reach}{effect}; {name} is in the units of your inputs "
        "(8 grey levels in [0, 1] pixel space is 8/255, not 8)",
        RobustWarning,
        stacklevel=3,
    )


def check_in_box(x: torch.Tensor, bounds, name: str = "data") -> None:
    """Raise RobustDataError when inputs lie outside the perturbation's box ``bounds``: a
    perturbed input is clipped to the box, so such inputs would be silently moved (by more than
    eps) before the model sees them. 0..255 images get the conversion as their fix; with
    ``normalize=`` in force, normalised data gets "give the images before normalisation".
    Bounds of a shape that does not fit the inputs are an ArgumentError (``box_for``)."""
    if bounds is None:
        return
    lo, hi = box_for(bounds, x)
    slack = BOX_SLACK * float((hi - lo).abs().max())
    low, high = float(x.min()), float(x.max())
    if not bool((x < lo - slack).any() or (x > hi + slack).any()):
        return
    shown = f"bounds=({float(lo.min()):g}, {float(hi.max()):g})" if lo.numel() * hi.numel() > 1 else (
        f"bounds=({float(lo):g}, {float(hi):g})"
    )
    if low >= 0 and 10.0 < high <= 255.0 and float(hi.max()) <= 1.0:
        raise RobustDataError(
            f"{name}: inputs range from {low:g} to {high:g}, which looks like 0..255 images, but the "
            f"perturbation's box is {shown}: divide the images by 255 (torchvision's ToTensor() does) "
            "so that inputs and eps are in [0, 1] pixel units"
        )
    from .model_io import current

    advice = NORMALISATION_ADVICE if current().normalize is None else NORMALISED_INSIDE_ADVICE
    raise RobustDataError(
        f"{name}: inputs range from {low:g} to {high:g}, outside the perturbation's box {shown}; every "
        f"perturbed input would be clipped into the box, silently changing the data. {advice}"
    )


def find_normalize(data, depth: int = 6):
    """The first transform named ``Normalize`` with ``mean`` and ``std`` (torchvision's, v1 or v2,
    and look-alikes) in the transform pipeline of a Dataset or DataLoader, or None."""
    if depth == 0 or isinstance(data, (str, bytes)) or hasattr(data, "shape"):
        return None
    if type(data).__name__ == "Normalize" and hasattr(data, "mean") and hasattr(data, "std"):
        return data
    if isinstance(data, (list, tuple)):
        parts = list(data)
    elif isinstance(data, torch.nn.Sequential):
        parts = list(data.children())
    else:
        parts = [getattr(data, name, None) for name in PIPELINE_ATTRIBUTES]
    for part in parts:
        found = None if part is None else find_normalize(part, depth - 1)
        if found is not None:
            return found
    return None


def _is_pixel_box(bounds) -> bool:
    """Whether ``bounds`` is the default box (0, 1), scalar or constant per element."""
    if bounds is None:
        return False
    lo, hi = (torch.as_tensor(b, dtype=torch.float64) for b in bounds)
    return bool((lo == 0).all() and (hi == 1).all())


def check_data_normalisation(data, perturbation, normalize) -> None:
    """A Dataset or DataLoader whose transforms normalise its inputs: with ``normalize=`` as well
    it would be normalised twice, and with the pixel box (0, 1) (or no box: smoothing noise) eps,
    sigma and the box would silently be in normalised units, so both raise RobustDataError
    naming the transform and the fix; a perturbation with a box of its own (the user chose
    normalised units) gets a RobustWarning with the same advice."""
    found = find_normalize(data)
    if found is None:
        return
    mean, std = (tuple(round(float(v), 6) for v in torch.as_tensor(p).flatten()) for p in (found.mean, found.std))
    fix = (f"drop it from the data (keep inputs in [0, 1] pixel units, e.g. ToTensor() alone) and pass its mean "
           f"and std to the check: normalize=({mean}, {std}) (--robust-normalize '[{list(mean)}, {list(std)}]'); "
           "the check then normalises inside the model call and eps, sigma, radius and box stay in pixel units")
    what = f"the data's transform pipeline contains {type(found).__name__}(mean={list(mean)}, std={list(std)})"
    if normalize is not None:
        raise RobustDataError(f"{what} and normalize= is set too, so inputs would be normalised twice: {fix}")
    bounds = getattr(perturbation, "bounds", None)
    if perturbation is None or _is_pixel_box(bounds):
        raise RobustDataError(f"{what}: perturbation sizes and the box (0, 1) would be in normalised units, not "
                              f"pixel units: {fix}")
    warnings.warn(f"{what}; the perturbation's box {bounds!r} is taken to be in normalised units, and so are its "
                  f"sizes. Recommended instead: {fix}", RobustWarning, stacklevel=4)


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


def check_uses_generator(perturbation, x: torch.Tensor) -> None:
    """RobustWarning when the same generator state gives different outputs: the perturbation
    draws from another source (the global RNG, numpy, random), so runs do not repeat."""
    probe = x[:PROBE_ROWS]
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
    if bounds is None or not name:
        return
    check_scale(repr(perturbation), name, getattr(perturbation, name), x, bounds,
                effect=", so draws spread over the whole box")


def inspect_inputs(ds, perturbation) -> None:
    """The checks that need both data and perturbation: inputs inside its box, a size that fits
    the box, and a perturbation that draws from its generator. Runs once per check, before any
    evaluation."""
    check_in_box(ds.x, getattr(perturbation, "bounds", None))
    check_size(perturbation, ds.x)
    check_uses_generator(perturbation, ds.x)


def check_outputs(z: torch.Tensor) -> None:
    """RobustWarning when the model's outputs look like probabilities (non-negative rows that
    sum to 1): losses (the q-loss's cross-entropy, NPPR's margin) need logits."""
    if bool((z >= 0).all()) and bool(((z.sum(dim=1) - 1).abs() <= PROBABILITY_TOLERANCE).all()):
        warnings.warn(
            "the model's outputs are non-negative and every row sums to 1: they look like "
            "probabilities (a softmax at the end of the model?). pytest-robust expects logits; "
            "accuracies are unaffected, but losses computed from probabilities (the q-loss's "
            "cross-entropy, NPPR's margin) are wrong: remove the final softmax",
            RobustWarning,
            stacklevel=4,
        )


def looks_channels_last(x: torch.Tensor) -> bool:
    """An image batch (N, H, W, C) with C in {1, 3, 4} and H, W larger than C."""
    return x.ndim == 4 and x.shape[-1] in (1, 3, 4) and min(x.shape[1], x.shape[2]) > 4


def explain_model_error(x: torch.Tensor, err: Exception) -> None:
    """Called when the model raises on its first batch: a RobustDataError when the inputs'
    layout is the likely cause (channels-last images, a shape the model cannot take)."""
    if looks_channels_last(x):
        raise RobustDataError(
            f"the model failed on inputs of shape {tuple(x.shape[1:])} (a batch {tuple(x.shape)}: "
            f"{type(err).__name__}: {err}); they look channels-last (N, H, W, C): PyTorch models take "
            "(N, C, H, W): pass "
            "x.permute(0, 3, 1, 2) (or ToTensor() in the dataset)"
        ) from err
    text = str(err)
    if any(s in text for s in ("same dtype", "mixed dtype", "scalar type")) or (
        "type" in text and "should be the same" in text
    ):
        raise RobustDataError(
            f"the model cannot take {x.dtype} inputs ({type(err).__name__}: {text}); give the data the "
            "model's dtype (x.to(dtype) in the data fixture) or convert the model (model.float())"
        ) from err
    if any(s in text for s in ("shapes cannot be multiplied", "size mismatch", "should contain", "Expected", "expected input")):
        raise RobustDataError(
            f"the model cannot take inputs of shape {tuple(x.shape[1:])} (a batch {tuple(x.shape)}: "
            f"{type(err).__name__}: {text}); give "
            "the data the shape the model expects (one row per input: (N, C, H, W) images, (N, F) features)"
        ) from err


#: Where the pytest layer says a check's warnings belong: (file, line) of the test that declared it.
WARNING_SITE: contextvars.ContextVar = contextvars.ContextVar("robust_warning_site", default=None)


@contextlib.contextmanager
def warning_site(path, line: int):
    """Within the block, warnings of checks that run from pytest's own machinery (a marker or a
    YAML check) point at ``path``:``line``, the test that declared them."""
    token = WARNING_SITE.set((str(path), line))
    try:
        yield
    finally:
        WARNING_SITE.reset(token)


def user_site() -> tuple[str, int] | None:
    """Where a check's warnings point: the first frame outside pytest-robust (the user's test
    body or script); when that frame is pytest's own machinery, the declaring test's site
    (``warning_site``); None when neither is known."""
    frame, name = sys._getframe(1), ""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("pytest_robust") or name in ("contextlib", "functools")):
            break
        frame = frame.f_back
    if frame is None or name.startswith(("_pytest", "pluggy", "pytest")):
        return WARNING_SITE.get()
    return frame.f_code.co_filename, frame.f_lineno


@contextlib.contextmanager
def captured_warnings():
    """Capture every warning of the block into the list it yields; on exit, also when the block
    raises, re-issue each at the user's site (``user_site``), so pytest shows it with the test
    that asked for the check, not inside pytest-robust."""
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        site = user_site()
        for w in caught:
            filename, lineno = site or (w.filename, w.lineno)
            warnings.warn_explicit(w.message, w.category, filename, lineno)


def robust_messages(caught: list, earlier: list) -> list:
    """``earlier`` messages followed by the RobustWarning messages of ``caught``, each once, in order."""
    return list(dict.fromkeys(earlier + [str(w.message) for w in caught if issubclass(w.category, RobustWarning)]))


def records_warnings(fn):
    """Decorate a metric function: RobustWarnings issued while it runs still reach the caller
    (pytest shows them with the test) and are listed, in order, in ``details["warnings"]`` of
    the Result it returns. Every built-in metric function carries it, so it also gives them the
    keywords ``normalize=`` and ``logits=`` (``model_io.accepts_interface``)."""
    from .model_io import accepts_interface

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with captured_warnings() as caught:
            result = fn(*args, **kwargs)
        messages = robust_messages(caught, [])
        if messages and hasattr(result, "details"):
            result.details["warnings"] = robust_messages(caught, result.details.get("warnings", []))
        return result

    return accepts_interface(wrapper)
