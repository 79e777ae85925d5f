"""``--robust-suggest``: thresholds suggested from a run of every check as an estimate.

For a check whose requirement is "estimate >= threshold" (accuracies) the suggested threshold is
its lower bound L at the run's confidence 1 - alpha, rounded DOWN to the grid ``GRID`` (0.01):
the largest grid value the run itself proves. For "estimate <= threshold" (losses) it is the upper
bound U rounded UP. A rerun with the same seed repeats the same draws, so it decides as this run
did; a rerun on new draws (another seed, other data, a non-deterministic GPU) passes such a
threshold only with probability about 1/2 (docs/settings.md, "Choosing thresholds"):

    with the estimate p1 ~ N(p, s^2) and L1 = p1 - z s (z = z_{1-alpha}), a rerun's lower bound
    L2 = p2 - z s clears t = L1 iff p2 >= p1, which for independent p1, p2 has probability 1/2.

A gate that must stay green keeps a margin m below L1 so that P(p2 - p1 >= -m) = Phi(m / (sqrt(2) s))
is 1 - alpha, i.e. m = sqrt(2) z s = sqrt(2) (p1 - L1): the "green" threshold
``L1 - sqrt(2) (p1 - L1)`` (mirrored for losses), rounded to the grid away from the estimate. The
check's actual bounds are at least as wide as the normal ones, so reading s off them (s = (p1 -
L1) / z) errs towards a larger margin.
"""

from __future__ import annotations

import math

from pytest_robust.report.text import md_text
from pytest_robust.results import Result, percent

#: The grid suggested thresholds are rounded to (down for accuracies, up for losses).
GRID = 0.01
#: Margin, in units of (estimate - bound), of a threshold that a rerun on new draws passes with
#: probability 1 - alpha (module docstring).
GREEN_MARGIN = math.sqrt(2)


def _to_grid(value: float, direction: str) -> float:
    """``value`` rounded to ``GRID`` away from the estimate: down for ">=", up for "<="; accuracies
    no lower than 0."""
    steps = value / GRID
    steps = math.floor(steps + 1e-9) if direction == ">=" else math.ceil(steps - 1e-9)
    return max(0.0, round(steps * GRID, 10)) if direction == ">=" else round(steps * GRID, 10)


def suggestion(result: Result, paste_key: str, separator: str) -> dict:
    """The suggested threshold of an estimate ``result`` (module docstring), the threshold with the
    green margin, and the text to paste (``paste_key`` + ``separator`` + value: "tsrm=0.87" for a
    marker, "tsrm: 0.87" for a YAML check, "threshold=0.87" for a fixture call)."""
    at_bound = result.lower if result.direction == ">=" else result.upper
    sign = -1.0 if result.direction == ">=" else 1.0
    green = at_bound + sign * GREEN_MARGIN * abs(result.estimate - at_bound)
    threshold = _to_grid(at_bound, result.direction)
    return {"threshold": threshold, "green": _to_grid(green, result.direction), "grid": GRID,
            "bound": at_bound, "paste": f"{paste_key}{separator}{threshold:.2f}"}


def _rows(results: list[dict]) -> list[tuple[Result, dict]]:
    parsed = [Result.from_dict(d) for d in results]
    return [(r, r.details["suggestion"]) for r in parsed if r.details.get("suggestion")]


def lines(results: list[dict]) -> list[str]:
    """The terminal section of ``--robust-suggest``: how the thresholds were made, then per check
    its bound, the suggested and the green threshold and the text to paste."""
    rows = _rows(results)
    if not rows:
        return []
    pct = percent(rows[0][0].confidence)
    out = [f"suggested thresholds: the {pct} lower bound rounded down to the grid {GRID:g} (upper bound rounded up "
           "for losses); a rerun with the same seed decides the same, a rerun on new draws passes it with "
           "probability about 1/2; 'green' keeps a margin of sqrt(2) x (estimate - bound) and passes such a rerun "
           f"with probability about {pct} (docs/settings.md, 'Choosing thresholds')"]
    for r, s in rows:
        out.append(f"{r.test_id}: {r.name} {r.estimate:.4f}, bound {s['bound']:.4f} -> {s['paste']} "
                   f"(green: {s['green']:.2f}){_doubt(r)}")
    return out


def _doubt(r: Result) -> str:
    """What the label check said of the run behind a suggestion (``engine.inspect.labels``): such a
    threshold would enshrine a model that is near chance or constant, so it says so; "" otherwise."""
    advice = r.details.get("clean_accuracy_advice")
    return f"; do not paste it before the label check is answered: {advice}" if advice else ""


def markdown(results: list[dict]) -> str:
    """``suggested_thresholds.md`` of the report directory: the same table as ``lines``."""
    rows = _rows(results)
    head = lines(results)[0] if rows else "no check produced an estimate"
    table = ["| check | metric | estimate | bound | suggested | green | paste |", "|---|---|---|---|---|---|---|"]
    table += [f"| {md_text(r.test_id)} | {md_text(r.name)} | {r.estimate:.4f} | {s['bound']:.4f} | "
              f"{s['threshold']:.2f} | {s['green']:.2f} | `{s['paste']}`{md_text(_doubt(r))} |" for r, s in rows]
    return f"# Suggested thresholds\n\n{head}\n\n" + "\n".join(table) + "\n"
