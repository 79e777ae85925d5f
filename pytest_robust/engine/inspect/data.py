"""Inspections of the data: finite values (``check_finite``), a loader that reads in a fixed
order and a dataset that reads the same twice, values inside the box (``check_in_box``) and a
normalization hidden in the data pipeline (``check_data_normalization``)."""

from __future__ import annotations

import warnings

import torch

from pytest_robust.engine.items import input_and_label
from pytest_robust.engine.streams import host_rng
from pytest_robust.errors import RobustDataError, RobustWarning


def is_image_batch(x: torch.Tensor) -> bool:
    """Whether inputs look like images: (N, C, H, W) with 1 or 3 channels. Image advice (ToTensor,
    /255, pixels, channel order) and image-only perturbations are for these inputs only; the
    gallery shows them."""
    return x.ndim == 4 and x.shape[1] in (1, 3)

NORMALIZATION_ADVICE = (
    "keep inputs in [0, 1] pixel space and pass the model's normalization as normalize=(mean, std) "
    "(--robust-normalize; recommended: the check normalizes inside the model call, so eps stays in pixel "
    "units), or pass the perturbation bounds= in your data's units (e.g. UniformLinf(eps=..., bounds=(lo, "
    "hi))), or bounds=None for no box"
)


#: The advice for inputs that are not images (tabular rows, sequences, embeddings) outside the box.
FEATURES_BOX_ADVICE = (
    "these inputs are not images, so the default box (0, 1) of pixel units rarely fits: give bounds= in your "
    "features' units (bounds=(lo, hi), either end may be infinite, or one value per feature), or bounds=None for "
    "no box (standardized features, embeddings)"
)


#: The advice instead when normalize= is set: the data is expected in pixel units already.
NORMALIZED_INSIDE_ADVICE = (
    "normalize= is set, so the check normalizes inside the model call and expects the data in [0, 1] "
    "pixel units: give it the inputs before normalization (for images, e.g. ToTensor() alone)"
)


#: Attributes through which a data object reaches its transforms (DataLoader, Subset, ConcatDataset,
#: torchvision datasets and Compose), searched for a normalizing transform.
PIPELINE_ATTRIBUTES = ("dataset", "datasets", "transform", "transforms")


def check_finite(x: torch.Tensor) -> None:
    """Raise RobustDataError naming the first input with NaN or infinite values (one pass when
    there are none: the smallest and largest values are finite exactly when every value is, as
    NaN carries through both)."""
    if x.is_floating_point() and x.numel() and bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):
        return
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


def check_reads_repeat(dataset, keys: tuple[str, str] | None = None) -> None:
    """RobustWarning when a map-style dataset returns a different input on a second read of
    item 0 (a random augmentation left in the evaluation data); mapping items are read by ``keys``."""
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
    a, b = (torch.as_tensor(input_and_label(item, keys)[0]) for item in (first, second))
    if a.shape != b.shape or not torch.equal(a, b):
        warnings.warn(
            "the dataset returns a different input each time item 0 is read (a random augmentation "
            "in the evaluation data?): pytest-robust reads it under a fixed RNG so runs repeat, but "
            "the check then measures one random augmentation of each input; remove random "
            "transforms from the evaluation dataset",
            RobustWarning,
            stacklevel=4,
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


def check_data_normalization(data, perturbation, normalize) -> None:
    """A Dataset or DataLoader whose transforms normalize its inputs: with ``normalize=`` as well
    it would be normalized twice, and with the pixel box (0, 1) (or no box: smoothing noise) eps,
    sigma and the box would silently be in normalized units, so both raise RobustDataError
    naming the transform and the fix; a perturbation with a box of its own (the user chose
    normalized units) gets a RobustWarning with the same advice."""
    found = find_normalize(data)
    if found is None:
        return
    mean, std = (tuple(round(float(v), 6) for v in torch.as_tensor(p).flatten()) for p in (found.mean, found.std))
    fix = (f"drop it from the data (keep inputs in [0, 1] pixel units, e.g. ToTensor() alone) and pass its mean "
           f"and std to the check: normalize=({mean}, {std}) (--robust-normalize '[{list(mean)}, {list(std)}]'); "
           "the check then normalizes inside the model call and eps, sigma, radius and box stay in pixel units")
    what = f"the data's transform pipeline contains {type(found).__name__}(mean={list(mean)}, std={list(std)})"
    if normalize is not None:
        raise RobustDataError(f"{what} and normalize= is set too, so inputs would be normalized twice: {fix}")
    bounds = getattr(perturbation, "bounds", None)
    if perturbation is None or _is_pixel_box(bounds):
        raise RobustDataError(f"{what}: perturbation sizes and the box (0, 1) would be in normalized units, not "
                              f"pixel units: {fix}")
    warnings.warn(f"{what}; the perturbation's box {bounds!r} is taken to be in normalized units, and so are its "
                  f"sizes. Recommended instead: {fix}", RobustWarning, stacklevel=4)
