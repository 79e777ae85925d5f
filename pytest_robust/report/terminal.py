"""The terminal table printed after a run: one row per robustness check, then the non-pass messages."""

from __future__ import annotations

from ..results import Result

COLUMNS = (
    "test", "metric", "perturbation", "estimate", "bounds", "threshold", "evaluations/budget",
    "seconds", "seed", "verdict",
)


def _row(r: Result) -> tuple[str, ...]:
    return (
        r.test_id.rsplit("/", 1)[-1] or "(outside pytest)",
        r.name,
        r.perturbation,
        f"{r.estimate:.4f}",
        f"[{r.lower:.4f}, {r.upper:.4f}] @{r.confidence:.0%}",
        "-" if r.threshold is None else f"{r.direction} {r.threshold:g}",
        f"{r.forward_passes}/{r.budget}",
        f"{r.seconds:.2f}",
        str(r.seed),
        r.verdict.upper(),
    )


def summary_lines(results: list[dict]) -> list[str]:
    """Aligned table lines for result dicts, followed by the message of every check that did not pass."""
    parsed = [Result.from_dict(d) for d in results]
    rows = [COLUMNS] + [_row(r) for r in parsed]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"{r.test_id}: {r.message()}" for r in parsed if r.verdict in ("fail", "inconclusive")]
    if notes:
        lines += ["", "checks that did not pass:"] + notes
    return lines
