"""PNG plots of the curves and heatmaps that results carry in ``details["curves"]`` and
``details["heatmaps"]``.

A curve is a JSON-able dict: ``{"title", "xlabel", "ylabel", "x": [...], "series": {label: [...]},
"logx": bool}``; every series has one y per x (None for a missing point). A heatmap is
``{"title", "xlabel", "rows": [...], "columns": [...], "values": [[...], ...]}``, one row of
values in [0, 1] (None: no data) per row label. Rendering needs matplotlib (the ``plots``
extra); without it no plot is written and the caller is told why.
"""

from __future__ import annotations

import re
from pathlib import Path


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:120] or "check"


def plot_curve(curve: dict, path: Path) -> Path:
    """Render one curve to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, ys in curve["series"].items():
        points = [(x, y) for x, y in zip(curve["x"], ys) if y is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, label=label)
    if curve.get("logx"):
        ax.set_xscale("log")
    ax.set(title=curve.get("title", ""), xlabel=curve.get("xlabel", ""), ylabel=curve.get("ylabel", ""))
    ax.grid(alpha=0.3)
    if len(curve["series"]) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_heatmap(heatmap: dict, path: Path) -> Path:
    """Render one heatmap to ``path`` (PNG): rows x columns, each cell coloured and labelled with
    its value (blank where None)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows, columns = heatmap["rows"], heatmap["columns"]
    values = np.array([[np.nan if v is None else v for v in row] for row in heatmap["values"]], dtype=float)
    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * len(columns), 1.0 + 0.35 * len(rows)), dpi=120)
    image = ax.imshow(values, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(len(rows)), rows)
    ax.set(title=heatmap.get("title", ""), xlabel=heatmap.get("xlabel", ""))
    fig.colorbar(image, ax=ax, fraction=0.05)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


SIZE = re.compile(r"^(\w+)\((\w+)=([-+0-9.eE]+)(.*)\)$")


def tsrm_curves(results: list[dict]) -> dict[str, dict]:
    """TSRM against perturbation size: per model and perturbation family with >= 2 sizes, the
    estimate and both bounds against eps (sigma, scale) read from the perturbation's repr."""
    groups: dict[tuple, list] = {}
    for r in results:
        match = SIZE.match(r["perturbation"]) if r["metric"] == "tsrm" and r["estimate"] is not None else None
        if match:
            family, size_name, size, rest = match.groups()
            groups.setdefault((r.get("model") or "model", family, size_name, rest), []).append((float(size), r))
    curves = {}
    for (model, family, size_name, rest), points in groups.items():
        if len({size for size, _ in points}) < 2:
            continue
        points.sort(key=lambda p: p[0])
        curves[f"tsrm-{model}-{family}"] = {
            "title": f"TSRM of {model} under {family}" + (f" ({rest.strip(', ')})" if rest.strip(", ") else ""),
            "xlabel": size_name,
            "ylabel": "accuracy under perturbation",
            "x": [size for size, _ in points],
            "series": {
                "estimate": [r["estimate"] for _, r in points],
                f"lower bound ({points[0][1]['confidence']:.0%})": [r["lower"] for _, r in points],
                f"upper bound ({points[0][1]['confidence']:.0%})": [r["upper"] for _, r in points],
            },
        }
    return curves


def write_plots(results: list[dict], directory: Path) -> list[Path]:
    """One PNG per curve and heatmap carried by a result, plus TSRM-against-size curves; returns
    the paths."""
    curves = [(r, name, c) for r in results for name, c in r.get("details", {}).get("curves", {}).items()]
    curves += [({"test_id": "summary"}, name, c) for name, c in tsrm_curves(results).items()]
    curves += [(r, name, h) for r in results for name, h in r.get("details", {}).get("heatmaps", {}).items()]
    if not curves:
        return []
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RuntimeError("plots need matplotlib: pip install 'pytest-robust[plots]'") from None
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for i, (result, name, curve) in enumerate(curves):
        test = (result.get("test_id") or "programmatic").rsplit("/", 1)[-1]
        stem = _slug("-".join(p for p in (test, result.get("model", ""), name) if p))
        draw = plot_heatmap if "values" in curve else plot_curve
        written.append(draw(curve, directory / f"{i:02d}-{stem}.png"))
    return written
