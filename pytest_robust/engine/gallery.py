"""Clean and perturbed pictures of a check's worst inputs, small enough to ride on its Result.

A report is written after the checks, without the data, so a per-input check on image inputs
((N, 1 or 3, H, W)) keeps what its gallery needs in ``Result.gallery``: for its ``results.WORST``
worst inputs (``results.worst``) the clean input and **one illustrative draw** of the check's
perturbation, from a random stream of its own (seed, "gallery", input index), so the picture
repeats with the seed and costs no model evaluation. It is not necessarily the draw that broke
the input (that one is not kept); the caption says which perturbation drew it. Thumbnails are
8-bit, at most ``MAX_SIDE`` pixels a side (larger images are area-averaged down), base64 encoded:
at most 10 x 2 x 3 x 64 x 64 bytes. The report directory gets them as a PNG
(``report.plots.plot_gallery``, which decodes them with ``report.inputs.thumbnails``);
results.json keeps only the indices (``report.inputs.without_pixels``).
"""

from __future__ import annotations

import base64

import torch
import torch.nn.functional as F

from pytest_robust.engine.data import TensorData
from pytest_robust.engine.inspect.data import is_image_batch
from pytest_robust.engine.streams import stream_generator
from pytest_robust.results import worst

#: Longest side of a thumbnail, in pixels.
MAX_SIDE = 64


def _thumbnails(x: torch.Tensor) -> torch.Tensor:
    """uint8 images of at most MAX_SIDE pixels a side; values in [0, 1] map to 0..255 (others are
    clipped: the gallery shows pixel units)."""
    side = max(x.shape[-2:])
    if side > MAX_SIDE:
        size = tuple(max(1, round(s * MAX_SIDE / side)) for s in x.shape[-2:])
        x = F.interpolate(x, size=size, mode="area")
    return (x.clamp(0, 1) * 255).round().to(torch.uint8)


def _encoded(images: torch.Tensor) -> str:
    return base64.b64encode(images.cpu().contiguous().numpy().tobytes()).decode("ascii")


def gallery(table: dict, direction: str, perturbation, ds: TensorData, seed: int, rows=None) -> dict | None:
    """The gallery of the worst rows of ``table`` (a per-input table; module docstring), or None when
    the inputs are not images or there is no perturbation to draw from. ``rows`` maps a table index
    to its row in ``ds`` (default: the index itself)."""
    if perturbation is None or not is_image_batch(ds.x) or not table["index"]:
        return None
    chosen = worst(table, direction)
    index = [r["index"] for r in chosen]
    at = torch.as_tensor([i if rows is None else rows[i] for i in index], device=ds.x.device)
    clean = ds.x[at]
    with torch.no_grad():
        perturbed = torch.cat([
            perturbation.draw(clean[i : i + 1], stream_generator(seed, "gallery", int(index[i]), device=clean.device),
                              at[i : i + 1], ds.y[at[i : i + 1]])
            for i in range(len(index))
        ])
    small = _thumbnails(torch.cat([clean, perturbed]).float())
    return {
        "index": index,
        "label": ds.y[at].tolist(),
        "outcome": [r["outcome"] for r in chosen],
        "estimate": [r.get("estimate") for r in chosen],
        "perturbation": repr(perturbation),
        "shape": list(small.shape[1:]),
        "clean": _encoded(small[: len(index)]),
        "perturbed": _encoded(small[len(index) :]),
        "note": "one illustrative draw of the perturbation per input, from a stream of its own (seed, 'gallery', "
                "index): not necessarily the draw that broke it",
    }
