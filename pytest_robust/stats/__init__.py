"""Statistics for robustness gates, pure Python and NumPy (nothing here knows about pytest, models or
data; torch serves the running sums, ``betting.running_sum``):

- ``binomial``: the regularized incomplete beta function, exact binomial tails, Clopper–Pearson
  bounds and Student-t quantiles;
- ``betting``: anytime-valid sequential tests by betting and the confidence sequence they give
  (``confidence_sequence``);
- ``gate``: the sequential gate of a mean against a threshold (``SequentialGate``), two betting
  tests that leave blocks which cannot decide waiting;
- ``group_sequential``: looks at growing samples, alpha spending over them, and the two-stage
  Student-t bounds of a mean over sampled units (the q check's gate);
- ``paired``: betting tests and the confidence sequence of a paired difference (the paired gate);
- ``familywise``: Holm's step-down over a family of checks' p-values (``--robust-familywise``).

Every gate also gives the p-values of its two claims (pass, fail), each <= alpha exactly when the
gate makes that claim: the betting test's 1 / largest capital (``SequentialGate.p_values``), the
exact binomial tests of the Clopper–Pearson bounds (``clopper_pearson_p_values``), and the
share-scaled t tests of the group-sequential looks (``group_sequential.p_values``).

The names below are those the checks import from ``pytest_robust.stats``.
"""

from pytest_robust.stats.betting import BET_CAP, confidence_sequence, mixture_bets, rejects_at
from pytest_robust.stats.binomial import (
                       betainc,
                       betaincinv,
                       binom_cdf,
                       binom_sf,
                       clopper_pearson_lower,
                       clopper_pearson_p_values,
                       clopper_pearson_upper,
                       t_quantile,
                       t_sf,
)
from pytest_robust.stats.familywise import holm
from pytest_robust.stats.gate import Decision, SequentialGate

__all__ = [
    "BET_CAP", "Decision", "SequentialGate", "betainc", "betaincinv", "binom_cdf", "binom_sf",
    "clopper_pearson_lower", "clopper_pearson_p_values", "clopper_pearson_upper", "confidence_sequence", "holm",
    "mixture_bets", "rejects_at", "t_quantile", "t_sf",
]
