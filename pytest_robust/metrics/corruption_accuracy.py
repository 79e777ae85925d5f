"""Mean accuracy over a grid of common corruptions x severities, gated like TSRM.

    CA(f) = (1 / |grid|) sum_{(c, s) in grid} P_{(X, Y), X' ~ corrupt_{c,s}(X)} ( argmax f(X') = Y )

(Hendrycks & Dietterich 2019; what RobustBench reports for CIFAR-10-C; default grid: the 15
benchmark corruptions x severities 1-5). Each draw picks an input uniformly, a cell (c, s)
uniformly from the grid (``CorruptionGrid``) and one fresh corruption, so the outcomes form one
i.i.d. Bernoulli(CA) stream: the TSRM engine and its anytime-valid gate apply unchanged (a pass
means CA >= threshold with error probability <= 1 - confidence).

The details break the same draws down by cell: per corruption (mean over its severities), per
severity (mean over the corruptions) and per cell, each with one-sided Clopper-Pearson bounds at
the check's level (fixed-sample bounds for the counts the stopped stream happened to hold, each
valid on its own), plus the clean accuracy on all inputs (one forward pass each) and the relative
drop 1 - CA / clean.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..corruptions import CorruptionGrid
from ..engine import Forward, correct_predictions, guarded, load_data, resolve_device, sum_over_ranks
from ..results import Result
from ..stats import clopper_pearson_lower, clopper_pearson_upper
from .tsrm import BLOCK, noise_generator, tsrm_stream


def _cells(grid: CorruptionGrid, draws: int, seed: int, device) -> np.ndarray:
    """The grid cell of each of the first ``draws`` draws, recomputed from their blocks' generators."""
    blocks = -(-draws // BLOCK)
    return torch.cat([grid.cells(BLOCK, noise_generator(seed, b, device)).cpu() for b in range(blocks)])[:draws].numpy()


def _summary(hits: np.ndarray, alpha: float) -> dict:
    n, k = int(len(hits)), int(hits.sum())
    if n == 0:
        return {"draws": 0, "correct": 0, "accuracy": None, "cp_lower": None, "cp_upper": None}
    return {"draws": n, "correct": k, "accuracy": k / n, "cp_lower": clopper_pearson_lower(k, n, alpha),
            "cp_upper": clopper_pearson_upper(k, n, alpha)}


def _clean_accuracy(model, ds, device, batch_size: int) -> tuple[float, int]:
    """(accuracy on the unperturbed inputs, forward passes spent)."""
    with guarded(model, device):
        forward = Forward(model, batch_size, max_label=int(ds.y.max()))
        hits = forward.chunked(len(ds), lambda a, b: correct_predictions(
            forward.validated(model(ds.x[a:b].to(device)), b - a), ds.y[a:b].to(device)).sum().item())
    return sum(hits) / len(ds), forward.passes


def corruption_accuracy(model: torch.nn.Module, data, threshold: float | None = None, *, corruptions=None,
                        severities=None, preset: str | None = None, **settings) -> Result:
    """Mean accuracy of ``model`` on ``data`` over the grid ``corruptions`` x ``severities``
    (default: the 15 benchmark corruptions x 1-5; ``preset`` as for ``Corruption``), gated
    >= ``threshold`` when given. ``settings`` are ``tsrm``'s keywords, with its defaults and
    meaning: ``confidence``, ``budget`` (draws), ``seed``, ``batch_size``, ``device``."""
    started = time.perf_counter()
    grid = CorruptionGrid(corruptions, severities, preset)
    device = resolve_device(settings.pop("device", None), model)
    result, stream = tsrm_stream(model, data, grid, threshold, device=device, **settings)
    ds = load_data(data)
    clean, clean_passes = _clean_accuracy(model, ds, device, result.details["batch_size"])
    cells = _cells(grid, len(stream), result.seed, device)
    alpha = 1.0 - result.confidence
    names, levels = grid.corruptions, grid.severities
    corruption_of = np.array([names.index(c) for c, _ in grid.grid])[cells]
    severity_of = np.array([s for _, s in grid.grid])[cells]
    per_cell = {f"{c}/{s}": _summary(stream[cells == k], alpha) for k, (c, s) in enumerate(grid.grid)}
    result.metric = "corruption_accuracy"
    result.forward_passes += sum_over_ranks(clean_passes)  # every rank evaluates every clean input
    result.seconds = time.perf_counter() - started
    result.details.update({
        "clean_accuracy": clean,
        "relative_drop": 1.0 - result.estimate / clean if clean > 0 else None,
        "per_corruption": {c: _summary(stream[corruption_of == i], alpha) for i, c in enumerate(names)},
        "per_severity": {str(s): _summary(stream[severity_of == s], alpha) for s in levels},
        "per_cell": per_cell,
        "breakdown_note": "per-corruption, per-severity and per-cell accuracies come from the same draws; "
                          "their Clopper-Pearson bounds hold one at a time, for the counts observed",
        "heatmaps": {"corruption-accuracy": {
            "title": f"Accuracy under corruption ({len(stream)} draws; clean {clean:.3f})",
            "rows": list(names), "columns": [str(s) for s in levels], "xlabel": "severity",
            "values": [[per_cell[f"{c}/{s}"]["accuracy"] for s in levels] for c in names],
        }},
    })
    return result
