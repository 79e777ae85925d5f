"""Randomized smoothing (Cohen, Rosenfeld & Kolter 2019; Sun et al. ICML 2025): the certified-accuracy
check and the analyses CERTIFY, PREDICT and the pA report (declared here, torch-free; evaluated in
``check``, ``cohen`` and ``pa_report``), its per-input certificates (``certificates``),
noise draws (``draws``), round scheduler (``rounds``), Cohen's CERTIFY/PREDICT (``cohen``) and the p_A
report (``pa_report``)."""

from pytest_robust.checks.registry import REQUIRED, Metric, Param
from pytest_robust.errors import SettingError
from pytest_robust.settings.validation import non_negative_float, open_unit, positive_float, positive_int

DECLARATION = Metric(
    "pytest_robust.checks.smoothing.check:evaluate", title="certified accuracy", budget=2_000_000,
    certificate=True, paired="outcomes",
    params=(
        Param("radius", non_negative_float, REQUIRED, "the L2 radius to certify, in input units"),
        Param("sigma", positive_float, REQUIRED, "the Gaussian noise level of the smoothed classifier"),
        Param("alpha", open_unit, 1e-3, "error probability of each per-input certificate"),
        Param("max_draws", positive_int, 100_000, "most noise draws per input"),
    ),
    doc="randomized-smoothing certified accuracy at an L2 radius >= threshold",
)

_SIGMA = Param("sigma", positive_float, REQUIRED, "the Gaussian noise level, in input units")


def _radii(key, value):
    """Radii (input units): a sequence of numbers >= 0."""
    if isinstance(value, (int, float, str)) or not hasattr(value, "__len__"):
        raise SettingError(key, value, "a sequence of radii >= 0, e.g. [0.0, 0.25, 0.5]")
    return [non_negative_float(key, r) for r in value]


def _budgets(key, value):
    """Budgets (n', alpha') to convert certified accuracy to: pairs of a draw count and a level."""
    try:
        return tuple((positive_int("n'", n), open_unit("alpha'", a)) for n, a in value)
    except (TypeError, ValueError):
        raise SettingError(key, value, "a sequence of (n', alpha') pairs, e.g. ((100, 0.01), (100_000, 0.001))") \
            from None


CERTIFY = Metric(
    "pytest_robust.checks.smoothing.cohen:certify_all", title="CERTIFY accuracy", certificate=True, gate=False,
    budget=None, positional=("sigma",),
    params=(_SIGMA, Param("n0", positive_int, 100, "selection draws per input"),
            Param("n", positive_int, 100_000, "estimation draws per input"),
            Param("alpha", open_unit, 1e-3, "error probability of each certificate")),
    doc="Cohen's CERTIFY per input (returns a Certification)",
)
PREDICT = Metric(
    "pytest_robust.checks.smoothing.cohen:predict_all", title="PREDICT accuracy", certificate=True, gate=False,
    budget=None, positional=("sigma",),
    params=(_SIGMA, Param("n", positive_int, 10_000, "noise draws per input"),
            Param("alpha", open_unit, 1e-3, "the level of the abstention test")),
    doc="Cohen's PREDICT per input (returns a Prediction)",
)
PA_REPORT = Metric(
    "pytest_robust.checks.smoothing.pa_report:evaluate", title="mean pA", certificate=True, gate=False, budget=None,
    positional=("sigma",),
    params=(_SIGMA, Param("n", positive_int, 10_000, "noise draws per input"),
            Param("radii", _radii, None, "radii to report (default: 0 to the largest n draws can certify)"),
            Param("alpha", open_unit, 1e-3, "the level of each certificate"),
            Param("convert_to", _budgets, ((100, 0.01), (100_000, 0.001)), "other budgets (n', alpha')")),
    doc="the empirical distribution of pA, certified accuracy against radius and under other budgets",
)
