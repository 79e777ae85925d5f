"""summary.md: the table GitHub renders in a job summary ($GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from ..results import STATUSES, Result
from .inputs import worst_inputs_markdown


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _pct(value) -> str:
    return "–" if value is None else f"{value:.3f}"


def deciding_bound(r: Result) -> str:
    """The bound that decided the verdict (``results.decide``): for an "at least" check the lower
    bound decides a pass and the upper bound a fail, mirrored for "at most"; an undecided check
    (inconclusive, estimate) shows both."""
    if r.estimate is None:
        return "–"
    pct = f"{r.confidence:.0%}"
    if r.verdict not in ("pass", "fail"):
        return f"[{r.lower:.4f}, {r.upper:.4f}] ({pct})"
    lower_decides = (r.verdict == "pass") == (r.direction == ">=")
    side, value = ("lower", r.lower) if lower_decides else ("upper", r.upper)
    return f"{value:.4f} ({pct} {side})"


def corruption_tables(parsed: list[Result]) -> list[str]:
    """Per ``corruption_accuracy`` check: accuracy per corruption (rows) and severity (columns),
    the corruption's mean with its Clopper–Pearson bounds, and the clean accuracy."""
    lines = []
    for r in parsed:
        d = r.details
        if r.metric != "corruption_accuracy" or "per_cell" not in d:
            continue
        levels = list(d["per_severity"])
        pct = f"{r.confidence:.0%}"
        lines += ["", f"### Corruption accuracy of `{_cell(r.test_id)}`", "",
                  f"clean {d['clean_accuracy']:.3f}, under corruption {r.estimate:.3f} "
                  f"(relative drop {_pct(d['relative_drop'])}); {r.draws} draws. Per-cell accuracies come from the "
                  "same draws; their Clopper–Pearson bounds hold one at a time.", "",
                  "| corruption | " + " | ".join(f"severity {s}" for s in levels) + f" | mean | {pct} CP bounds |",
                  "|---|" + "---:|" * (len(levels) + 2)]
        for name, total in d["per_corruption"].items():
            cells = [_pct(d["per_cell"][f"{name}/{s}"]["accuracy"]) for s in levels]
            bounds = "–" if total["accuracy"] is None else f"[{total['cp_lower']:.3f}, {total['cp_upper']:.3f}]"
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {_pct(total['accuracy'])} | {bounds} |")
        lines.append("| **all** | " + " | ".join(_pct(d["per_severity"][s]["accuracy"]) for s in levels)
                     + f" | {r.estimate:.3f} | [{d['cp_lower']:.3f}, {d['cp_upper']:.3f}] |")
    return lines


def summary_markdown(results: list[dict], env: dict, comparison: list[dict] | None = None) -> str:
    """One row per check (check, metric, estimate, the bound that decided it, threshold, verdict,
    time), then the messages of checks that did not pass, the per-check tables (corruptions, worst
    inputs), the baseline comparison and the environment."""
    parsed = [Result.from_dict(r) for r in results]
    icon = {"pass": "✅ pass", "fail": "❌ fail", "inconclusive": "⚠️ inconclusive", "estimate": "ℹ️ estimate",
            "error": "💥 error", "skipped": "⏭️ skipped", "xfail": "➖ expected failure"}
    counts = {status: sum(r.status == status for r in parsed) for status in STATUSES}
    lines = [
        "## Robustness checks",
        "",
        f"{counts['pass']} passed, {counts['fail']} failed, {counts['inconclusive']} inconclusive, "
        f"{counts['estimate']} estimates, {counts['error']} errors, {counts['skipped']} skipped, "
        f"{counts['xfail']} expected failures.",
        "",
        "| check | metric | perturbation | estimate | deciding bound | threshold | verdict | evaluations/budget | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in parsed:
        bound = deciding_bound(r)
        space = r.details.get("space")
        estimate = "–" if r.estimate is None else f"{r.estimate:.4f}"
        threshold = "–" if r.threshold is None else f"{r.direction} {r.threshold:g}"
        lines.append(
            f"| {_cell(r.test_id)} | {r.name} | {_cell(r.perturbation)}{f' ({space})' if space else ''} | {estimate} | "
            f"{bound} | {threshold} | {icon.get(r.status, r.status)} | "
            f"{r.forward_passes}/{r.budget} | {r.seconds:.1f} s |"
        )
    failing = [r for r in parsed if r.status in ("fail", "inconclusive", "error", "xfail")]
    if failing:
        lines += ["", "### Checks that did not pass", ""]
        lines += [
            f"- `{_cell(r.test_id)}`{' (expected failure)' if r.status == 'xfail' else ''}: {_cell(r.message())}"
            for r in failing
        ]
    warned = [f"- `{_cell(r.test_id)}`: {_cell(w)}" for r in parsed for w in r.details.get("warnings", [])]
    if warned:
        lines += ["", "### Warnings", ""] + warned
    lines += corruption_tables(parsed)
    lines += worst_inputs_markdown(results)
    notes = sorted({r.note for r in parsed if r.note})
    if notes:
        lines += ["", "### Notes", ""] + [f"- {_cell(n)}" for n in notes]
    if comparison:
        lines += ["", "### Against the baseline", "", "| check | baseline | now | change |", "|---|---|---|---|"]
        lines += [
            f"| {_cell(c['key'])} | {c['baseline']} | {c['current']} | {c['status']} |" for c in comparison
        ]
    lines += [
        "",
        "Each check's verdict holds with probability at least its confidence on its own; seeds: "
        + ", ".join(sorted({str(r.seed) for r in parsed if r.estimate is not None})) + ".",
        "",
        "<details><summary>environment</summary>",
        "",
        *[f"- {k}: {_cell(v)}" for k, v in env.items()],
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)
