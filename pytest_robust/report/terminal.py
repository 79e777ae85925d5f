"""The terminal table printed after a run: one row per robustness check, then the non-pass messages.

The table fits the terminal (80 columns in a CI log that is not a TTY). When one line per check
is too wide even without the seed (``DROP_ORDER``; the header states it), each check takes a block
of lines instead: its test id, "under" its perturbation, its numbers in aligned columns (metric,
estimate, bounds, threshold, verdict), then what it cost (``COST``: evaluations/budget, seconds,
seed) on a line of its own. Long ids and perturbations wrap (``wrap``) rather than being cut, so
every test id stays whole, two checks never look the same, and nothing but the seed of a one-line
table is ever dropped. The full numbers stay in the reports (results.json, summary.md, the JUnit
files).
"""

from __future__ import annotations

from pytest_robust.results import NOT_PASSED, Result, percent

COLUMNS = (
    "test", "metric", "perturbation", "estimate", "bounds", "threshold", "evaluations/budget",
    "seconds", "seed", "verdict",
)
#: Columns a one-line-per-check table drops, in this order, until it fits.
DROP_ORDER = ("seed",)
#: Columns a check's block shows on a line of their own, labelled, below its numbers.
COST = ("evaluations/budget", "seconds", "seed")
#: Where a wrapped id or perturbation breaks (after these), in order of preference.
BREAKS = ("::", "/", ", ", " ", "_", "(", "=")
#: Indent of continuation lines (a wrapped cell, a check's block), so that a new check stands out.
INDENT = "  "
GAP = "  "


def _number(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _row(r: Result) -> tuple[str, ...]:
    ran = r.estimate is not None
    return (
        r.test_id.rsplit("/", 1)[-1] or "(outside pytest)",
        r.name,
        r.perturbation + (f" in {r.details['space']}" if r.details.get("space") else ""),  # its units, when stated
        _number(r.estimate),
        f"[{r.lower:.4f}, {r.upper:.4f}] @{percent(r.confidence)}" if ran else "-",
        "-" if r.threshold is None else f"{r.direction} {r.threshold:g}",
        f"{r.forward_passes}/{r.budget}" if ran else "-",
        f"{r.seconds:.2f}",
        str(r.seed) if ran else "-",
        r.status.upper(),
    )


def wrap(text: str, width: int) -> list[str]:
    """``text`` as lines of at most ``width`` characters, continuation lines indented by
    ``INDENT``; the pieces, concatenated, are the text (spaces at the breaks aside). A line breaks
    after the last occurrence in its second half of the first ``BREAKS`` separator that has one,
    else exactly at the width."""
    pieces, room = [], width
    while len(text) > room:
        cuts = [text.rfind(sep, 0, room - len(sep) + 1) + len(sep) for sep in BREAKS]
        cut = next((c for c in cuts if c > room // 2), room)
        pieces.append(text[:cut].rstrip())
        text, room = text[cut:].lstrip(" "), width - len(INDENT)
    pieces.append(text)
    return pieces[:1] + [INDENT + p for p in pieces[1:]]


def _aligned(rows: list[list[str]], columns: list[str], width: int) -> list[list[str]]:
    """``rows`` (a header first) without the ``DROP_ORDER`` columns that keep them wider than
    ``width`` (while any is left), as lists of cells."""
    rows, columns = [list(r) for r in rows], list(columns)

    def total() -> int:
        return sum(max(len(r[i]) for r in rows) for i in range(len(columns))) + len(GAP) * (len(columns) - 1)

    for name in DROP_ORDER:
        if total() <= width or name not in columns:
            continue
        i = columns.index(name)
        columns.pop(i)
        for r in rows:
            r.pop(i)
    return rows


def _lines(rows: list[list[str]], indent: str = "") -> list[str]:
    """Aligned lines of ``rows`` (a header first), a rule of dashes under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [indent + GAP.join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return lines[:1] + [indent + GAP.join("-" * w for w in widths)] + lines[1:]


def _fit(rows: list[tuple[str, ...]], width: int) -> list[str]:
    """The table as printed lines: one line per check when that fits in ``width`` (after dropping
    ``DROP_ORDER`` columns), else a block per check (module docstring)."""
    table = _aligned(rows, COLUMNS, width)
    lines = _lines(table)
    if max(map(len, lines)) <= width:
        return lines
    test, perturbation = COLUMNS.index("test"), COLUMNS.index("perturbation")
    numbers = [c for c in COLUMNS if c not in ("test", "perturbation") + COST]
    inner = _lines([[row[COLUMNS.index(c)] for c in numbers] for row in rows], 2 * INDENT)
    out = ["test", INDENT + "under perturbation", inner[0], INDENT * 2 + ", ".join(COST),
           "-" * min(width, max(map(len, inner)))]
    for row, numbers_line in zip(rows[1:], inner[2:]):
        out += wrap(row[test], width)
        out += [INDENT + piece for piece in wrap("under " + row[perturbation], width - len(INDENT))]
        out.append(numbers_line)
        out.append(INDENT * 2 + ", ".join(f"{c} {row[COLUMNS.index(c)]}" for c in COST))
    return out


def familywise_text(family: dict) -> list[str]:
    """The family-wise adjustment in sentences (``familywise.holm_adjust``'s summary): first the
    family and the adjustment, then one line per verdict it changed or would allow."""
    gate = family["gate_level"]
    head = (f"Holm's step-down at alpha={family['alpha']:g} over a family of {family['family']} "
            f"checks with a threshold ({family['collected']} known at collection, each gated at alpha/"
            f"{max(family['collected'], 1)} = {gate:.3g}, i.e. confidence {1 - gate:.4g}, while its test ran): "
            f"{family['confirmed']['fail']} fail(s) and {family['confirmed']['pass']} pass(es) confirmed, "
            f"{len(family['retracted'])} not confirmed, {len(family['allowed'])} more allowed")
    lines = [head]
    lines += [f"not confirmed, now inconclusive: {r['test_id']} {r['metric']} {r['was']} (p = {r['p']:.3g})"
              for r in family["retracted"]]
    lines += [f"Holm also allows: {r['test_id']} {r['metric']} {r['claim']} (p = {r['p']:.3g}); not enforced: its "
              "test's gate could not know it while the test ran" for r in family["allowed"]]
    return lines


def familywise_lines(family: dict) -> list[str]:
    """The family-wise adjustment as terminal lines (``familywise_text``), details indented."""
    head, *rest = familywise_text(family)
    return [f"family-wise error: {head}"] + [INDENT + line for line in rest]


def summary_lines(results: list[dict], width: int = 10**6) -> list[str]:
    """Table lines for result dicts (at most ``width`` characters where possible), followed by the
    message of every check that did not pass and any warnings."""
    parsed = [Result.from_dict(d) for d in results]
    lines = _fit([COLUMNS] + [_row(r) for r in parsed], width)
    notes = [f"{r.test_id}: {r.message()}" for r in parsed if r.status in NOT_PASSED]
    if notes:
        lines += ["", "checks that did not pass:"] + notes
    warned = [f"{r.test_id}: {w}" for r in parsed for w in r.details.get("warnings", [])]
    if warned:
        lines += ["", "warnings:"] + warned
    return lines
