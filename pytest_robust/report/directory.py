"""The report directory of a run (``--robust-report``): results.json, summary.md, per_input.csv,
suggested_thresholds.md and the plots, each written whole or not at all (``files.write_atomic``).

results.json lists every file of the run (``files``); the files that the previous run in the same
directory listed and this one did not write are removed afterwards, so the directory holds one
run's files, never two runs' mixed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pytest_robust.files import write_atomic
from pytest_robust.report import store, suggest
from pytest_robust.report.inputs import per_input_csv, without_pixels
from pytest_robust.report.markdown import summary_markdown
from pytest_robust.report.plots import planned_plots
from pytest_robust.report.terminal import familywise_text
from pytest_robust.report.text import md_text


@dataclass
class Run:
    """What a run reports: its results (dicts), environment and settings, and what the session
    added: the baseline comparison (``store.compare`` rows, with the baseline's name, commit, time
    and format) and Holm's summary (``familywise.adjust``), when there are any."""

    results: list[dict]
    env: dict
    settings: dict
    comparison: list[dict] = field(default_factory=list)
    baseline: dict | None = None
    family: dict | None = None


def familywise_markdown(family: dict) -> str:
    """The family-wise section of summary.md: the family, the adjustment and what it changed."""
    head, *rest = map(md_text, familywise_text(family))
    return "\n".join(["## Family-wise error", "", head] + ([""] + [f"- {line}" for line in rest] if rest else []))


def write_directory(directory: Path, run: Run, csv: bool = False, suggesting: bool = False) -> list[str]:
    """Write the report directory of ``run`` (module docstring), with per_input.csv when ``csv`` and
    suggested_thresholds.md when ``suggesting``; returns the lines that tell the terminal what it wrote."""
    previous, note = store.previous_files(directory / "results.json")
    lines = []
    try:
        plots = planned_plots(run.results)
    except RuntimeError as err:
        plots = []
        lines.append(f"robust report: no plots ({err})")
    files = ["results.json", "summary.md"] + (["per_input.csv"] if csv else []) \
        + (["suggested_thresholds.md"] if suggesting else []) + [n for n, _ in plots]
    write_atomic(directory / "results.json", json.dumps(_payload(run, files), indent=2, default=str))
    summary = summary_markdown(run.results, run.env, run.comparison, run.baseline)
    if run.family is not None:
        summary = summary.rstrip("\n") + "\n\n" + familywise_markdown(run.family) + "\n"
    write_atomic(directory / "summary.md", summary)
    if csv:
        write_atomic(directory / "per_input.csv", per_input_csv(run.results))
    if suggesting:
        write_atomic(directory / "suggested_thresholds.md", suggest.markdown(run.results))
    for name, render in plots:
        render(directory / name)
    lines += [f"robust report: {directory / name}" for name in files]
    stale = [name for name in previous if name not in files and (directory / name).is_file()]
    for name in stale:
        (directory / name).unlink()
    if stale:
        lines.append(f"robust report: removed {len(stale)} file(s) of the previous run in {directory}, which this "
                     f"run did not write: {', '.join(stale)}")
    return lines + ([f"robust report: {note}"] if note else [])


def _payload(run: Run, files: list[str]) -> dict:
    """results.json: format, environment, settings, the results (each with its baseline comparison,
    when the run compared), the files of the run, the baseline and Holm's summary."""
    results = [without_pixels(r) for r in run.results]
    if run.baseline is not None:  # each check's comparison: its status and the baseline's numbers
        rows = {c["key"]: c for c in run.comparison}
        results = [dict(r, comparison={"baseline": run.baseline["name"], "status": rows[key]["status"],
                                       "baseline_numbers": rows[key]["baseline_numbers"]})
                   for r, key in zip(results, store.keys(run.results))]
    payload = {"format": store.FORMAT, "environment": run.env, "settings": run.settings, "results": results,
               "files": files}
    if run.baseline is not None:
        payload["baseline"], payload["comparison"] = run.baseline, run.comparison
    if run.family is not None:
        payload["familywise"] = run.family
    return payload
