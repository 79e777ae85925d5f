"""Randomized smoothing (Cohen, Rosenfeld & Kolter 2019; Sun et al. ICML 2025): the certified-accuracy
check (declared here, torch-free; evaluated in ``check``), its per-input certificates (``certificates``),
noise draws (``draws``), round scheduler (``rounds``), Cohen's CERTIFY/PREDICT (``cohen``) and the p_A
report (``pa_report``)."""

from pytest_robust.checks.registry import REQUIRED, Metric, Param
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
