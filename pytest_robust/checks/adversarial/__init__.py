"""Adversarial accuracy: accuracy under an attack ensemble (APGD-CE, APGD-T, Square; Croce & Hein 2020).
Declared here (torch-free); ``check`` evaluates it and ``ensemble`` runs the stages. The attacks
themselves (``pytest_robust.attacks``) are shared with the q and NPPR checks' context figures."""

from pytest_robust.checks.registry import BOX, FromSetting, Metric, Param
from pytest_robust.settings.validation import non_negative_int, positive_float, positive_int

EPS_SETTING = FromSetting(lambda settings: settings.eps, "robust_eps (8/255)")

DECLARATION = Metric(
    "pytest_robust.checks.adversarial.check:evaluate", title="adversarial accuracy", budget=1_000_000, paired="outcomes",
    perturbation="pytest_robust.checks.adversarial.check:ball",
    params=(
        Param("eps", positive_float, EPS_SETTING, "the L-inf radius of the attack, in input units"),
        Param("steps", positive_int, 100, "APGD steps"),
        Param("restarts", positive_int, 1, "APGD-CE restarts"),
        Param("targets", non_negative_int, 9, "target classes of APGD-T (0 skips it)"),
        Param("square_queries", non_negative_int, 1000, "queries of the Square search (0 skips it)"),
        BOX,
    ),
    doc="accuracy under an L-inf attack (APGD-CE, APGD-T, Square) >= threshold (an upper estimate of true "
        "robust accuracy)",
)
