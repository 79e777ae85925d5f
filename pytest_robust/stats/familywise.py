"""Family-wise error control over several checks: Holm's step-down procedure (Holm 1979).

Pure Python; nothing here knows about torch or pytest.

A family of K null hypotheses H_1..H_K with p-values p_1..p_K (each valid: P(p_i <= a) <= a under
H_i for every a). Sort them, p_(1) <= ... <= p_(K); reject H_(1), ..., H_(j) where j is the largest
index with p_(i) <= alpha / (K - i + 1) for every i <= j (stop at the first that is not). Whatever
hypotheses are true and however the p-values depend on each other, the probability of rejecting
at least one true hypothesis is at most alpha: if I_0 (|I_0| = K_0) are the true ones and the
first true one rejected is H_(i), then i <= K - K_0 + 1, so some true p-value is <= alpha / K_0,
which by the union bound has probability <= alpha. Holm rejects everything Bonferroni (p_i <= alpha /
K) rejects, and possibly more: a p-value <= alpha / K is rejected whatever the others are, since
every smaller one is too. Missing members of the family count as p = 1 (never rejected).

``holm`` takes the family size K separately, so that a family whose members did not all report
(a check that could not run claims nothing) keeps the size it was declared with. Comparisons allow
a relative tolerance of ``TOLERANCE`` for the rounding of levels such as 1 - (1 - alpha / K).
"""

from __future__ import annotations

#: Relative tolerance of the comparisons p <= level (a level written as 1 - confidence rounds).
TOLERANCE = 1e-9


def holm(p_values: list[float], alpha: float, family: int | None = None) -> list[int | None]:
    """Holm's step-down at family-wise level ``alpha`` over ``family`` hypotheses (default: as
    many as ``p_values``; more counts the missing ones as p = 1). Returns, per p-value in the
    given order, the step (1-based) at which it was rejected, or None when it was not: a p-value
    rejected at step i met p <= alpha / (family - i + 1)."""
    family = len(p_values) if family is None else family
    if family < len(p_values):
        raise ValueError(f"family size {family} is smaller than the {len(p_values)} p-values given")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    steps: list[int | None] = [None] * len(p_values)
    for step, i in enumerate(order, start=1):
        if p_values[i] > level(alpha, family, step) * (1.0 + TOLERANCE):
            break
        steps[i] = step
    return steps


def level(alpha: float, family: int, step: int) -> float:
    """The level of Holm's step ``step`` (1-based) in a family of ``family``: alpha / (family - step + 1)."""
    return alpha / (family - step + 1)
