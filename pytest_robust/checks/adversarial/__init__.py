"""Adversarial accuracy: accuracy under an attack ensemble (APGD-CE, APGD-T, FAB-T, Square; Croce & Hein 2020)
in the L-inf, L2 or L1 ball. Declared here (torch-free); ``check`` evaluates it and ``ensemble`` runs the
stages. The attacks themselves (``pytest_robust.attacks``) are shared with the q and NPPR checks'
context figures."""

from pytest_robust.checks.registry import BOX, FromSetting, Metric, Param
from pytest_robust.settings.validation import choice, non_negative_int, positive_int, size


class _ImageDefault(float):
    """The default eps, robust_eps (8/255 unless set): a radius in [0, 1] pixel units, which the
    check applies to image inputs only (elsewhere it asks for eps=)."""

    def __repr__(self) -> str:
        return f"robust_eps ({float(self):g}, for images)"


def _default_eps(settings):
    from pytest_robust.settings.keys import Settings

    return settings.eps if settings.eps != Settings().eps else _ImageDefault(settings.eps)


def _eps(key, value):
    """eps: the image default as it is, else a size (a number, or one per feature in L-inf)."""
    return value if isinstance(value, _ImageDefault) else size(key, value)


EPS_SETTING = FromSetting(_default_eps, "robust_eps (8/255, for images; elsewhere give eps=)")

DECLARATION = Metric(
    "pytest_robust.checks.adversarial.check:evaluate", title="adversarial accuracy", budget=1_000_000,
    paired="outcomes", perturbation="pytest_robust.checks.adversarial.check:ball",
    params=(
        Param("eps", _eps, EPS_SETTING, "the radius of the attack in the norm norm=, in input units; in L-inf also "
              "one radius per feature (a tensor broadcasting to one input's shape, 0 keeps a feature fixed)"),
        Param("norm", choice("linf", "l2", "l1"), "linf", "the ball's norm"),
        Param("steps", positive_int, None, "APGD steps per run (default 50; 20 in L1)"),
        Param("restarts", positive_int, None, "APGD-CE restarts (default 2; 20 in L1, whose sparse steps "
              "depend on the start)"),
        Param("targets", non_negative_int, None, "target classes of APGD-T (default 6; 0 in L1; 0 skips it; at "
              "most classes - 1)"),
        Param("ranking", choice("linear", "logits"), "linear",
              "APGD-T's targets and starts: by the first-order model (linear) or by clean logits from random "
              "starts (logits, AutoAttack's)"),
        Param("fab_targets", non_negative_int, None, "target classes of FAB-T, the best of the same ranking (L1 "
              "only: default 2; 0 skips it)"),
        Param("fab_steps", positive_int, 40, "FAB-T steps per target (L1 only)"),
        Param("square_queries", non_negative_int, None, "queries of the Square search (default 250; 25 in L1; 0 "
              "skips it)"),
        Param("inputs", positive_int, None, "attack at most this many inputs (a seeded random subset)"),
        BOX,
    ),
    doc="accuracy under an L-inf, L2 or L1 attack (APGD-CE, APGD-T, FAB-T in L1, Square) >= threshold (an upper "
        "estimate of true robust accuracy)",
)
