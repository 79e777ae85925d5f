"""Per-input results: the table a per-input check puts in ``details["per_input"]``, and its worst rows.

The table is a dict of equal-length lists (one entry per input the check evaluated), JSON-able, so it
rides on the Result into results.json, the CSV file (``--robust-per-input csv``) and summary.md:

- ``index``: the input's position in the data (0-based, in the order the data yields it);
- ``outcome``: what the check concluded for that input, one of ``OUTCOME_RANK`` (a metric may
  use other words; they rank with "undecided");
- metric-specific columns: ``estimate`` (the input's own figure: Z_q for the q-loss, PR over its
  draws for NPPR, the share of correct noisy draws for certified accuracy), ``radius``
  (certified accuracy: the radius it is certified at, None when it is not), ``stage``
  (adversarial accuracy: the attack stage that broke it), and any others.

Pure Python (no torch): the report writers use it on the controller.
"""

from __future__ import annotations

import math

#: Outcomes, worst first: the rank orders the "worst inputs" of a check (then its estimate).
OUTCOME_RANK = {
    "misclassified": 0,  # wrong already without a perturbation
    "broken": 1,  # a perturbation (attack draw) made it wrong
    "not certifiable": 1,  # randomized smoothing: proven not certifiable at the radius
    "above max_loss": 1,  # q-loss: its own Z_q exceeds the allowed mean
    "undecided": 2,  # the budget ran out before its test decided
    "within max_loss": 3,
    "estimated": 3,  # an estimate without a threshold to judge it by
    "certified": 3,
    "robust": 3,
}
#: The rank of an outcome that met the check's requirement ("robust", "certified", ...).
GOOD = max(OUTCOME_RANK.values())


def is_good(outcome: str) -> bool:
    """Whether an input's outcome met the check's requirement (the best rank of ``OUTCOME_RANK``)."""
    return OUTCOME_RANK.get(outcome, OUTCOME_RANK["undecided"]) == GOOD


#: How many worst inputs the summary names per check.
WORST = 10


def columns(table: dict) -> list[str]:
    """The table's columns: index and outcome first, the rest as the metric gave them."""
    return ["index", "outcome"] + [c for c in table if c not in ("index", "outcome")]


def check_table(table) -> None:
    """Raise ValueError unless ``table`` is a per-input table: a dict of equal-length lists with at
    least ``index`` and ``outcome``."""
    if not isinstance(table, dict) or not {"index", "outcome"} <= set(table):
        raise ValueError('details["per_input"] must be a dict of lists with at least "index" and "outcome"')
    lengths = {name: len(values) for name, values in table.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f'details["per_input"] columns must have equal lengths, got {lengths}')


def rows(table: dict) -> list[dict]:
    """The table as one dict per input, columns in ``columns`` order."""
    names = columns(table)
    return [dict(zip(names, values)) for values in zip(*(table[c] for c in names))]


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def worst(table: dict, direction: str = ">=", k: int = WORST) -> list[dict]:
    """The ``k`` worst rows: by outcome rank (``OUTCOME_RANK``), then by estimate (lowest first for
    an accuracy, ``direction`` ">="; highest first for a loss, "<="), else by stage (earliest
    first), then by index. Stable: ties keep the data order."""
    sign = 1.0 if direction == ">=" else -1.0

    def key(row: dict):
        estimate, stage = _number(row.get("estimate")), _number(row.get("stage"))
        order = sign * estimate if estimate is not None else stage if stage is not None else math.inf
        return OUTCOME_RANK.get(row["outcome"], OUTCOME_RANK["undecided"]), order, row["index"]

    return sorted(rows(table), key=key)[:k]
