"""Mean accuracy over a grid of common corruptions x severities, gated like TSRM.

    CA(f) = (1 / |grid|) sum_{(c, s) in grid} P_{(X, Y), X' ~ corrupt_{c,s}(X)} ( argmax f(X') = Y )

(Hendrycks & Dietterich 2019; what RobustBench reports for CIFAR-10-C; default grid: the 15
benchmark corruptions x severities 1-5). Each draw picks an input uniformly, a cell (c, s)
uniformly from the grid (``CorruptionGrid``) and one fresh corruption, so the outcomes form one
i.i.d. Bernoulli(CA) stream: the Bernoulli procedure and its anytime-valid gate apply unchanged (a pass
means CA >= threshold with error probability <= 1 - confidence).

The details break the same draws down by cell: per corruption (mean over its severities), per
severity (mean over the corruptions) and per cell, each with one-sided Clopper-Pearson bounds at
the check's level (fixed-sample bounds for the counts the stopped stream happened to hold, each
valid on its own), plus the clean accuracy on all inputs (one evaluation each, the "context"
phase of the budget) and the relative drop 1 - CA / clean.
"""

from __future__ import annotations

import numpy as np
import torch

from pytest_robust.checks.corruption_accuracy import DECLARATION
from pytest_robust.checks.library import function
from pytest_robust.engine.run import Run
from pytest_robust.perturbations.corruptions import CorruptionGrid
from pytest_robust.procedures.bernoulli import bernoulli_stream, block_size, noise_generator, summary
from pytest_robust.results import Result
from pytest_robust.stats import clopper_pearson_lower, clopper_pearson_upper


def _cells(grid: CorruptionGrid, draws: int, run: Run) -> np.ndarray:
    """The grid cell of each of the first ``draws`` draws, recomputed from their blocks' generators."""
    block = block_size(run.ds.x)
    return torch.cat([grid.cells(block, noise_generator(run, run.streams, b)).cpu()
                      for b in range(-(-draws // block))])[:draws].numpy()


def _summary(hits: np.ndarray, alpha: float) -> dict:
    n, k = int(len(hits)), int(hits.sum())
    if n == 0:
        return {"draws": 0, "correct": 0, "accuracy": None, "cp_lower": None, "cp_upper": None}
    return {"draws": n, "correct": k, "accuracy": k / n, "cp_lower": clopper_pearson_lower(k, n, alpha),
            "cp_upper": clopper_pearson_upper(k, n, alpha)}


def _breakdown(grid: CorruptionGrid, outcomes: np.ndarray, cells: np.ndarray, alpha: float, clean: float) -> dict:
    """Per corruption, per severity and per cell accuracies of the same draws, and the heatmap."""
    names, levels = grid.corruptions, grid.severities
    corruption_of = np.array([names.index(c) for c, _ in grid.grid])[cells]
    severity_of = np.array([s for _, s in grid.grid])[cells]
    per_cell = {f"{c}/{s}": _summary(outcomes[cells == k], alpha) for k, (c, s) in enumerate(grid.grid)}
    return {
        "per_corruption": {c: _summary(outcomes[corruption_of == i], alpha) for i, c in enumerate(names)},
        "per_severity": {str(s): _summary(outcomes[severity_of == s], alpha) for s in levels},
        "per_cell": per_cell,
        "breakdown_note": "per-corruption, per-severity and per-cell accuracies come from the same draws; "
                          "their Clopper-Pearson bounds hold one at a time, for the counts observed",
        "heatmaps": {"corruption-accuracy": {
            "title": f"Accuracy under corruption ({len(outcomes)} draws; clean {clean:.3f})",
            "rows": list(names), "columns": [str(s) for s in levels], "xlabel": "severity",
            "values": [[per_cell[f"{c}/{s}"]["accuracy"] for s in levels] for c in names],
            "counts": [[per_cell[f"{c}/{s}"]["draws"] for s in levels] for c in names],
        }},
    }


def grid(corruptions=None, severities=None, preset=None, **_) -> CorruptionGrid:
    """The check's perturbation: one draw picks a cell of the grid uniformly and corrupts with it.
    Without ``corruptions`` it is the default grid, which leaves out (with a RobustWarning) the
    corruptions that cannot apply to the check's images (``CorruptionGrid.leave_out``); named
    corruptions must all apply."""
    return CorruptionGrid(corruptions, severities, preset)


def _table(d: dict, estimate: float, confidence: float, draws: int) -> dict:
    """The summary's table: accuracy per corruption (rows) and severity (columns), each
    corruption's mean with its Clopper-Pearson bounds, and the clean accuracy."""
    levels, pct = list(d["per_severity"]), f"{confidence:.0%}"
    drop = "–" if d["relative_drop"] is None else f"{d['relative_drop']:.3f}"
    rows = [[name] + [d["per_cell"][f"{name}/{s}"]["accuracy"] for s in levels] + [
        total["accuracy"], "–" if total["accuracy"] is None else f"[{total['cp_lower']:.3f}, {total['cp_upper']:.3f}]"]
        for name, total in d["per_corruption"].items()]
    rows.append(["**all**"] + [d["per_severity"][s]["accuracy"] for s in levels]
                + [estimate, f"[{d['cp_lower']:.3f}, {d['cp_upper']:.3f}]"])
    return {"title": "Corruption accuracy", "header": ["corruption"] + [f"severity {s}" for s in levels]
            + ["mean", f"{pct} CP bounds"],
            "text": f"clean {d['clean_accuracy']:.3f}, under corruption {estimate:.3f} (relative drop {drop}); "
                    f"{draws} draws. Per-cell accuracies come from the same draws; their Clopper–Pearson bounds hold "
                    "one at a time.", "rows": rows}


def evaluate(run: Run, corruptions, severities, preset) -> Result:
    """The clean accuracy (``Run.clean_accuracy``: one evaluation per input, the "context" phase),
    then the Bernoulli stream over the grid; the details break its draws down by corruption,
    severity and cell, and name the corruptions a default grid left out (``left_out``)."""
    grid = run.perturbation
    clean = run.clean_accuracy(phase="context")
    stream = bernoulli_stream(run, grid, run.remaining(), run.args.threshold, label="corruption accuracy")
    estimate, lower, upper, details = summary(stream, run.alpha, run.args.threshold)
    outcomes = stream.outcomes[: stream.used]
    details.update({
        "clean_accuracy": clean,
        "relative_drop": 1.0 - estimate / clean if clean > 0 else None,
        "left_out": dict(grid.left_out),
        **_breakdown(grid, outcomes, _cells(grid, len(outcomes), run), run.alpha, clean),
    })
    details["tables"] = [_table(details, estimate, run.args.confidence, stream.used)]
    return run.result(estimate=estimate, lower=lower, upper=upper, draws=stream.used, perturbation=repr(grid),
                      details=details)


corruption_accuracy = function("corruption_accuracy", DECLARATION)
