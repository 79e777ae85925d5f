"""summary.md: the table GitHub renders in a job summary ($GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from ..results import STATUSES, Result


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_markdown(results: list[dict], env: dict, comparison: list[dict] | None = None) -> str:
    """One row per check (check, metric, estimate, bound, threshold, verdict, time), then the
    messages of checks that did not pass, the baseline comparison and the environment."""
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
        "| check | metric | perturbation | estimate | bound | threshold | verdict | evaluations/budget | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in parsed:
        side = "lower" if r.direction == ">=" else "upper"
        value = r.lower if r.direction == ">=" else r.upper
        bound = "–" if value is None else f"{value:.4f} ({r.confidence:.0%} {side})"
        estimate = "–" if r.estimate is None else f"{r.estimate:.4f}"
        threshold = "–" if r.threshold is None else f"{r.direction} {r.threshold:g}"
        lines.append(
            f"| {_cell(r.test_id)} | {r.name} | {_cell(r.perturbation)} | {estimate} | "
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
