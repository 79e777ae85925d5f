"""Per-input results in the reports: the CSV file, the worst inputs in summary.md, the gallery's
file name and pixels, and results.json without those pixels.

Built from what each result carries (``details["per_input"]``, see ``pytest_robust.results``,
and ``gallery``, see ``pytest_robust.engine.gallery``), for any metric that fills them in. Pure Python
plus numpy for the pixels: no torch on the controller.
"""

from __future__ import annotations

import base64
import csv
import io

from pytest_robust.report.text import csv_cell, file_stem, md_text
from pytest_robust.results import Result, columns, rows, worst

#: Columns of the CSV file before each table's own.
CSV_HEAD = ("test", "model", "metric", "perturbation")


def without_pixels(result: dict) -> dict:
    """A result dict without its gallery's pixels (results.json and baselines stay small): the
    indices, labels, outcomes and the perturbation remain."""
    shown = result.get("gallery")
    if not shown:
        return result
    return {**result, "gallery": {k: v for k, v in shown.items() if k not in ("clean", "perturbed")}}


def thumbnails(gallery: dict, name: str):
    """The ``clean`` or ``perturbed`` thumbnails of a gallery as a uint8 array (k, C, H, W)."""
    import numpy as np

    flat = np.frombuffer(base64.b64decode(gallery[name]), dtype=np.uint8)
    return flat.reshape(len(gallery["index"]), *gallery["shape"])


def gallery_file(position: int, result: dict) -> str:
    """The gallery PNG's name for the result at ``position`` in the run's results (``files.file_stem``:
    one path component of bounded length, whatever the test id)."""
    test = (result.get("test_id") or "programmatic").rsplit("/", 1)[-1]
    return f"gallery-{position:02d}-{file_stem(test + '-' + result.get('metric', ''), 100)}.png"


def per_input_csv(results: list[dict]) -> str:
    """Every per-input table of the run as one CSV: one row per (check, input), the check's test,
    model, metric and perturbation first, then index, outcome and the union of the tables' own
    columns (empty where a table has no such column). Text cells that a spreadsheet would read as a
    formula are neutralised (``files.csv_cell``)."""
    tables = [(r, r["details"]["per_input"]) for r in results if (r.get("details") or {}).get("per_input")]
    names: list[str] = []
    for _, table in tables:
        names += [c for c in columns(table) if c not in names]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in CSV_HEAD + tuple(names)])
    for r, table in tables:
        head = [r.get("test_id", ""), r.get("model", ""), r.get("metric", ""), r.get("perturbation", "")]
        for row in rows(table):
            writer.writerow([csv_cell(v) for v in head + ["" if row.get(c) is None else row[c] for c in names]])
    return out.getvalue()


def _cell(value) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else md_text(value)


def worst_inputs_markdown(results: list[dict]) -> list[str]:
    """Per check with a per-input table: its ``per_input.WORST`` worst inputs (worst first) and,
    for image inputs, the gallery PNG that shows them."""
    lines = []
    for position, data in enumerate(results):
        table = (data.get("details") or {}).get("per_input")
        if not table:
            continue
        r = Result.from_dict(data)
        picked = worst(table, r.direction)
        names = columns(table)
        lines += ["", f"### Worst inputs of {md_text(r.test_id or 'programmatic')} ({md_text(r.name)})", "",
                  f"{len(picked)} of {len(table['index'])} inputs, worst first; every input is in results.json "
                  "(and per_input.csv with --robust-per-input csv)."]
        if data.get("gallery"):
            lines += ["", f"Pictures: `{gallery_file(position, data)}` (each input clean and under one draw of "
                          f"{md_text(data['gallery']['perturbation'])})."]
        lines += ["", "| " + " | ".join(map(md_text, names)) + " |", "|" + "---|" * len(names)]
        lines += ["| " + " | ".join(_cell(row.get(c)) for c in names) + " |" for row in picked]
    return lines
