"""summary.md: the table GitHub renders in a job summary ($GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from pytest_robust.report import store
from pytest_robust.report.inputs import worst_inputs_markdown
from pytest_robust.report.text import md_text
from pytest_robust.results import NOT_PASSED, STATUSES, Result


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


def check_tables(parsed: list[Result]) -> list[str]:
    """Every table a check put in ``details["tables"]`` ({title, text, header, rows}; cells are
    text or numbers, None shown as a dash), under the check's test id."""
    lines = []
    for r in parsed:
        for table in r.details.get("tables", []):
            lines += ["", f"### {md_text(table['title'])} of {md_text(r.test_id)}", "", md_text(table.get("text", "")),
                      "", "| " + " | ".join(map(md_text, table["header"])) + " |",
                      "|---|" + "---:|" * (len(table["header"]) - 1)]
            lines += ["| " + " | ".join(_shown(c) for c in row) + " |" for row in table["rows"]]
    return lines


def _shown(cell) -> str:
    return _pct(cell) if cell is None or isinstance(cell, float) else md_text(cell)


def _row(r: Result, icon: dict) -> str:
    """The summary table's row of one check."""
    space = r.details.get("space")
    estimate = "–" if r.estimate is None else f"{r.estimate:.4f}{_subset(r)}"
    threshold = "–" if r.threshold is None else f"{r.direction} {r.threshold:g}"
    return (f"| {md_text(r.test_id)} | {md_text(r.name)} | {md_text(r.perturbation)}"
            f"{f' ({md_text(space)})' if space else ''} | {estimate} | "
            f"{deciding_bound(r)} | {threshold} | {icon.get(r.status, r.status)} | "
            f"{r.forward_passes}/{r.budget} | {r.seconds:.1f} s |")


def _subset(r: Result) -> str:
    """" (on 18 of 10000 inputs)" when a check's estimate is over a subset of its chosen inputs: a gate
    that decided early, or a budget that paid for fewer (``details["early_decision"]``,
    ``details["budget_stop"]``); "" otherwise."""
    early, stop = r.details.get("early_decision") or {}, r.details.get("budget_stop") or {}
    used, chosen = (stop.get("attacked"), stop.get("chosen")) if stop else (early.get("decided_after"),
                                                                           early.get("chosen"))
    return f" (on {used} of {chosen} inputs)" if used is not None and chosen and used < chosen else ""


def _counts_line(parsed: list, comparison: list[dict] | None, baseline: dict | None) -> str:
    """The verdicts counted in one sentence, with the comparison's counts when there is one."""
    counts = {status: sum(r.status == status for r in parsed) for status in STATUSES}
    return (f"{counts['pass']} passed, {counts['fail']} failed, {counts['inconclusive']} inconclusive, "
            f"{counts['estimate']} estimates, {counts['error']} errors, {counts['skipped']} skipped, "
            f"{counts['xfail']} expected failures."
            + (f" {counts['interrupted']} interrupted: the run was cancelled." if counts["interrupted"] else "")
            + (f" Against {'the baseline' if baseline is None else 'baseline ' + md_text(baseline['name'])}: "
               f"{md_text(store.counts(comparison))}." if comparison else ""))


def _messages(parsed: list) -> list[str]:
    """The messages of the checks that did not pass, and every check's warnings."""
    lines = []
    failing = [r for r in parsed if r.status in NOT_PASSED]
    if failing:
        lines += ["", "### Checks that did not pass", ""]
        lines += [
            f"- {md_text(r.test_id)}{' (expected failure)' if r.status == 'xfail' else ''}: {md_text(r.message())}"
            for r in failing
        ]
    warned = [f"- {md_text(r.test_id)}: {md_text(w)}" for r in parsed for w in r.details.get("warnings", [])]
    return lines + (["", "### Warnings", ""] + warned if warned else [])


def summary_markdown(results: list[dict], env: dict, comparison: list[dict] | None = None,
                     baseline: dict | None = None) -> str:
    """The counts of verdicts (and, with a ``comparison`` against ``baseline``, of regressions),
    one row per check (check, metric, estimate, the bound that decided it, threshold, verdict,
    time), then the messages of checks that did not pass, the per-check tables (``details["tables"]``, worst
    inputs), the baseline comparison and the environment."""
    parsed = [Result.from_dict(r) for r in results]
    icon = {"pass": "✅ pass", "fail": "❌ fail", "inconclusive": "⚠️ inconclusive", "estimate": "ℹ️ estimate",
            "error": "💥 error", "skipped": "⏭️ skipped", "xfail": "➖ expected failure",
            "interrupted": "⏹️ interrupted"}
    lines = ["## Robustness checks", "", _counts_line(parsed, comparison, baseline), "",
             "| check | metric | perturbation | estimate | deciding bound | threshold | verdict "
             "| evaluations/budget | time |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(r, icon) for r in parsed]
    lines += _messages(parsed)
    lines += check_tables(parsed)
    lines += worst_inputs_markdown(results)
    notes = sorted({r.note for r in parsed if r.note})
    if notes:
        lines += ["", "### Notes", ""] + [f"- {md_text(n)}" for n in notes]
    if comparison:
        lines += ["", "### Against the baseline", "", "| check | baseline | now | change |", "|---|---|---|---|"]
        lines += [
            f"| {md_text(c['key'])} | {md_text(c['baseline'])} | {md_text(c['current'])} | {md_text(c['status'])} |"
            for c in comparison
        ]
    lines += [
        "",
        "Each check's verdict holds with probability at least its confidence on its own; seeds: "
        + ", ".join(sorted({str(r.seed) for r in parsed if r.estimate is not None})) + ".",
        "",
        "<details><summary>environment</summary>",
        "",
        *[f"- {md_text(k)}: {md_text(v)}" for k, v in env.items()],
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)
