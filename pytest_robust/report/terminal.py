"""The terminal table printed after a run: one row per robustness check, then the non-pass messages.

The table fits the terminal: when it is wider than ``width``, the least important columns are
dropped (``DROP_ORDER``), then the longest test ids and perturbations are shortened with an
ellipsis. The full numbers stay in the reports (results.json, summary.md, the JUnit files).
"""

from __future__ import annotations

from ..results import Result

COLUMNS = (
    "test", "metric", "perturbation", "estimate", "bounds", "threshold", "evaluations/budget",
    "seconds", "seed", "verdict",
)
#: Columns dropped, in this order, until the table fits.
DROP_ORDER = ("seed", "seconds", "evaluations/budget", "metric", "threshold")
#: Columns shortened (longest cell first) when dropping is not enough.
SHORTEN = ("test", "perturbation", "bounds")
GAP = "  "


def _number(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _row(r: Result) -> tuple[str, ...]:
    ran = r.estimate is not None
    return (
        r.test_id.rsplit("/", 1)[-1] or "(outside pytest)",
        r.name,
        r.perturbation,
        _number(r.estimate),
        f"[{r.lower:.4f}, {r.upper:.4f}] @{r.confidence:.0%}" if ran else "-",
        "-" if r.threshold is None else f"{r.direction} {r.threshold:g}",
        f"{r.forward_passes}/{r.budget}" if ran else "-",
        f"{r.seconds:.2f}",
        str(r.seed) if ran else "-",
        r.status.upper(),
    )


def _fit(rows: list[tuple[str, ...]], width: int) -> list[list[str]]:
    """Drop and shorten columns until every line is at most ``width`` characters."""
    columns = list(COLUMNS)
    table = [list(row) for row in rows]

    def total() -> int:
        return sum(max(len(row[i]) for row in table) for i in range(len(columns))) + len(GAP) * (len(columns) - 1)

    for name in DROP_ORDER:
        if total() <= width:
            break
        i = columns.index(name)
        columns.pop(i)
        for row in table:
            row.pop(i)
    while total() > width:
        widths = {name: max(len(row[columns.index(name)]) for row in table) for name in SHORTEN}
        name = max(widths, key=widths.get)
        limit = widths[name] - (total() - width)
        if widths[name] <= 8:
            break  # narrower than this is unreadable: let the terminal wrap
        i = columns.index(name)
        limit = max(8, limit)
        for row in table:
            if len(row[i]) > limit:  # a test id keeps its end (the test's name), others their start
                row[i] = "…" + row[i][1 - limit :] if name == "test" else row[i][: limit - 1] + "…"
    return table


def summary_lines(results: list[dict], width: int = 10**6) -> list[str]:
    """Aligned table lines for result dicts (at most ``width`` characters where possible),
    followed by the message of every check that did not pass and any warnings."""
    parsed = [Result.from_dict(d) for d in results]
    table = _fit([COLUMNS] + [_row(r) for r in parsed], width)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [GAP.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, GAP.join("-" * w for w in widths))
    notes = [f"{r.test_id}: {r.message()}" for r in parsed if r.status in ("fail", "inconclusive", "error", "xfail")]
    if notes:
        lines += ["", "checks that did not pass:"] + notes
    warned = [f"{r.test_id}: {w}" for r in parsed for w in r.details.get("warnings", [])]
    if warned:
        lines += ["", "warnings:"] + warned
    return lines
