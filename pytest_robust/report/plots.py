"""PNG plots of the curves and heatmaps that results carry in ``details["curves"]`` and
``details["heatmaps"]``.

A curve is a JSON-able dict: ``{"title", "xlabel", "ylabel", "x": [...], "series": {label: [...]},
"logx": bool}``; every series has one y per x (None for a missing point). Optional: ``"intervals":
{label: [[lower, upper], ...]}`` draws each point's confidence interval as an error bar, and
``"counts": {label: [n, ...]}`` writes the number of draws beside each point (an estimate from a
gate that stopped after 7 draws is 1.000 with a wide interval, not a precise 1.000). A heatmap is
``{"title", "xlabel", "rows": [...], "columns": [...], "values": [[...], ...]}``, one row of
values in [0, 1] (None: no data) per row label, optionally ``"counts"`` of the same shape: each
cell then shows its count, and a cell with fewer than ``MIN_CELL_DRAWS`` is greyed out. Titles are
wrapped to the figure's width. Per-input galleries (``Result.gallery``) become one PNG each
(``plot_gallery``). Rendering needs matplotlib (the ``plots`` extra); without it no plot is written
and the caller is told why.
"""

from __future__ import annotations

import re
import textwrap
from functools import partial
from pathlib import Path
from typing import Callable

from pytest_robust.files import replacing
from pytest_robust.report.inputs import gallery_file, thumbnails
from pytest_robust.report.text import file_stem

#: Heatmap cells with fewer draws than this are greyed out: their 95% interval is wider than about
#: +-0.17 around 0.5 (Clopper-Pearson), too wide to compare cells.
MIN_CELL_DRAWS = 30


def _save(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path``, whole or not at all (``files.replacing``), and close it."""
    import matplotlib.pyplot as plt

    try:
        with replacing(path) as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
    return path


def _title(ax, text: str, width_inches: float) -> None:
    """The axes title, wrapped to about the figure's width (never clipped)."""
    ax.set_title(textwrap.fill(text, max(20, int(width_inches * 11))), fontsize=9)


def plot_curve(curve: dict, path: Path) -> Path:
    """Render one curve to ``path`` (PNG): lines, error bars for ``intervals``, draws for ``counts``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, ys in curve["series"].items():
        keep = [i for i, y in enumerate(ys) if y is not None]
        xs, ys = [curve["x"][i] for i in keep], [ys[i] for i in keep]
        line = ax.plot(xs, ys, marker="o", ms=3, label=label)[0]
        intervals = curve.get("intervals", {}).get(label)
        if intervals:
            below = [ys[j] - intervals[i][0] for j, i in enumerate(keep)]
            above = [intervals[i][1] - ys[j] for j, i in enumerate(keep)]
            ax.errorbar(xs, ys, yerr=[below, above], fmt="none", ecolor=line.get_color(), capsize=3, alpha=0.8)
        for j, i in enumerate(keep if curve.get("counts", {}).get(label) else []):
            ax.annotate(f"n={curve['counts'][label][i]}", (xs[j], ys[j]), textcoords="offset points", xytext=(4, 4),
                        fontsize=7, color=line.get_color())
    if curve.get("logx"):
        ax.set_xscale("log")
    _title(ax, curve.get("title", ""), 6)
    ax.set(xlabel=curve.get("xlabel", ""), ylabel=curve.get("ylabel", ""))
    ax.grid(alpha=0.3)
    if len(curve["series"]) > 1:
        ax.legend()
    fig.tight_layout()
    return _save(fig, path)


def plot_heatmap(heatmap: dict, path: Path) -> Path:
    """Render one heatmap to ``path`` (PNG): rows x columns, each cell coloured and labelled with
    its value and, with ``counts``, its number of draws (blank where None); cells with fewer than
    ``MIN_CELL_DRAWS`` draws are grey, their value shown but not coloured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows, columns = heatmap["rows"], heatmap["columns"]
    values = np.array([[np.nan if v is None else v for v in row] for row in heatmap["values"]], dtype=float)
    counts = np.array(heatmap.get("counts") or np.full(values.shape, MIN_CELL_DRAWS), dtype=float)
    few = counts < MIN_CELL_DRAWS
    width = 2.2 + 0.8 * len(columns)
    fig, ax = plt.subplots(figsize=(width, 1.4 + 0.4 * len(rows)), dpi=120)
    ax.imshow(np.where(few, 1.0, np.nan), cmap="Greys", vmin=0.0, vmax=4.0, aspect="auto")
    image = ax.imshow(np.where(few, np.nan, values), cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            label = f"{v:.2f}" + (f"\nn={int(counts[i, j])}" if "counts" in heatmap else "")
            ax.text(j, i, label, ha="center", va="center", fontsize=6, color="dimgray" if few[i, j] else "black")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(len(rows)), rows)
    grey = f"; grey: fewer than {MIN_CELL_DRAWS} draws" if "counts" in heatmap else ""
    _title(ax, heatmap.get("title", "") + grey, width)
    ax.set(xlabel=heatmap.get("xlabel", ""))
    fig.colorbar(image, ax=ax, fraction=0.05)
    fig.tight_layout()
    return _save(fig, path)


SIZE = re.compile(r"^(\w+)\((\w+)=([-+0-9.eE]+)(.*)\)$")


def accuracy_curves(results: list[dict]) -> dict[str, dict]:
    """Accuracy against perturbation size, for every check of the Bernoulli procedure
    (``details["procedure"]``): per check, model and perturbation family with >= 2 sizes, the
    estimate and both bounds against eps (sigma, scale) read from the perturbation's repr."""
    groups: dict[tuple, list] = {}
    for r in results:
        bernoulli = r["details"].get("procedure") == "bernoulli" and r["estimate"] is not None
        match = SIZE.match(r["perturbation"]) if bernoulli else None
        if match:
            family, size_name, size, rest = match.groups()
            key = (r["metric"], r["details"].get("title") or r["metric"], r.get("model") or "model", family,
                   size_name, rest)
            groups.setdefault(key, []).append((float(size), r))
    curves = {}
    for (metric, title, model, family, size_name, rest), points in groups.items():
        if len({size for size, _ in points}) < 2:
            continue
        points.sort(key=lambda p: p[0])
        label = "estimate"
        curves[f"{metric}-{model}-{family}"] = {
            "title": f"{title} of {model} under {family}" + (f" ({rest.strip(', ')})" if rest.strip(", ") else "")
                     + f"; bars: {points[0][1]['confidence']:.0%} bounds, n: draws (a gate stops once it decides)",
            "xlabel": size_name,
            "ylabel": "accuracy under perturbation",
            "x": [size for size, _ in points],
            "series": {label: [r["estimate"] for _, r in points]},
            "intervals": {label: [[r["lower"], r["upper"]] for _, r in points]},
            "counts": {label: [r["draws"] for _, r in points]},
        }
    return curves


def plot_gallery(gallery: dict, title: str, path: Path) -> Path:
    """Render a per-input gallery (``Result.gallery``) to ``path`` (PNG): one column per input,
    worst first, the clean input above one draw of the perturbation, captioned with its index,
    label, outcome and estimate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clean, perturbed = thumbnails(gallery, "clean"), thumbnails(gallery, "perturbed")
    k = len(gallery["index"])
    width = max(4.0, 1.3 * k)
    fig, axes = plt.subplots(2, k, figsize=(width, 3.6), dpi=120, squeeze=False)
    for j in range(k):
        estimate = gallery["estimate"][j]
        caption = f"#{gallery['index'][j]} y={gallery['label'][j]}\n{gallery['outcome'][j]}" + (
            f"\n{estimate:.3g}" if isinstance(estimate, (int, float)) else "")
        for row, images in enumerate((clean, perturbed)):
            image = images[j].transpose(1, 2, 0)
            axes[row, j].imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", vmin=0, vmax=255,
                                interpolation="nearest")
            axes[row, j].set_xticks([])
            axes[row, j].set_yticks([])
        axes[1, j].set_xlabel(caption, fontsize=7)
    axes[0, 0].set_ylabel("clean", fontsize=8)
    axes[1, 0].set_ylabel("perturbed", fontsize=8)
    fig.suptitle(textwrap.fill(f"{title}: worst inputs first; bottom row: one draw of {gallery['perturbation']}",
                               max(30, int(width * 11))), fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def planned_plots(results: list[dict]) -> list[tuple[str, Callable[[Path], Path]]]:
    """Every plot the results call for, as (file name, a function that renders it to a path): one
    PNG per curve and heatmap carried by a result, the TSRM-against-size curves and the galleries.
    RuntimeError when there are plots to draw and matplotlib is missing."""
    curves = [(r, name, c) for r in results for name, c in r.get("details", {}).get("curves", {}).items()]
    curves += [({"test_id": "summary"}, name, c) for name, c in accuracy_curves(results).items()]
    curves += [(r, name, h) for r in results for name, h in r.get("details", {}).get("heatmaps", {}).items()]
    plans = []
    for i, (result, name, curve) in enumerate(curves):
        test = (result.get("test_id") or "programmatic").rsplit("/", 1)[-1]
        stem = file_stem("-".join(p for p in (test, result.get("model", ""), name) if p))
        plans.append((f"{i:02d}-{stem}.png", partial(plot_heatmap if "values" in curve else plot_curve, curve)))
    for position, result in ((i, r) for i, r in enumerate(results) if r.get("gallery")):
        title = f"{(result.get('test_id') or 'programmatic').rsplit('/', 1)[-1]} ({result.get('metric')})"
        plans.append((gallery_file(position, result), partial(plot_gallery, result["gallery"], title)))
    if plans:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise RuntimeError("plots need matplotlib: pip install 'pytest-robust[plots]'") from None
    return plans


def write_plots(results: list[dict], directory: Path) -> list[Path]:
    """Render every plot of ``planned_plots`` into ``directory``; returns the paths."""
    return [render(directory / name) for name, render in planned_plots(results)]
