"""Intermediate-q robustness (Rice et al., NeurIPS 2021): everything about the q check lives in this
folder: the declarations of the check and of the q-curve analysis (here, torch-free), the check
(``check``), its plan, draws, per-input estimates and gate (``plan``, ``draws``, ``estimate``), the
q-curve (``curve``), the samplers (``qnorm``: path sampling; ``mcmc``: HMC and Metropolis transitions
and their diagnostics)."""

from pytest_robust.checks.registry import REQUIRED, FromSetting, Metric, Param, perturbation
from pytest_robust.errors import SettingError
from pytest_robust.settings.validation import (
    at_least,
    boolean,
    choice,
    function,
    non_negative_int,
    open_unit,
    positive_float,
    positive_int,
)


def _ball(settings):
    from pytest_robust.perturbations.noise import UniformLinf

    return UniformLinf(eps=settings.eps)


def _q(key, value):
    accepted = "a finite number > 0 (1: the average loss; larger q weighs high losses more)"
    try:
        return positive_float(key, value)
    except SettingError:
        raise SettingError(key, value, accepted) from None


DECLARATION = Metric(
    "pytest_robust.checks.q.check:evaluate", title="q-loss", direction="<=", paired="values",
    threshold_key="max_loss", budget=1_000_000,
    params=(
        Param("q", _q, REQUIRED, "q > 0: 1 is the average loss, larger q weighs high losses more"),
        Param("perturbation", perturbation, FromSetting(_ball, "UniformLinf(eps=robust_eps)"),
              "the distribution mu of perturbations"),
        Param("estimator", choice("auto", "hmc", "mh", "mc"), "auto",
              "auto (Monte Carlo at q <= 2; above, path sampling: HMC, MH for non-differentiable "
              "perturbations; Monte Carlo without a parameter space), hmc, mh or mc"),
        Param("chains", at_least(4), 4, "MCMC chains per input"),
        Param("steps", at_least(4), 100, "temperatures on the path 0..q"),
        Param("leapfrog", at_least(1), 5, "leapfrog steps per HMC transition"),
        Param("mh_steps", at_least(1), 5, "Metropolis steps per MH transition"),
        Param("warmup", non_negative_int, 20, "pilot transitions that learn the step size (0: none)"),
        Param("path_len", positive_float, 1.0, "longest HMC trajectory, in units of the perturbation's size"),
        Param("target_accept", open_unit, None, "the warm-up's acceptance target (default 0.8 HMC, 0.3 MH)"),
        Param("loss", function, None, "per-example loss(logits, y) -> (n,) >= 0 (default cross-entropy)"),
        Param("pgd_steps", at_least(1), 50, "steps of the PGD attack giving the q = infinity context"),
        Param("pgd_restarts", at_least(1), 1, "restarts of that attack"),
        Param("inputs", positive_int, None, "evaluate at most this many inputs (a seeded random subset)"),
        Param("full_context", boolean, False, "Monte Carlo context at path sampling's budget per input"),
        Param("loss_bound", positive_float, None,
              "a value the loss never exceeds (e.g. 1 for a 0-1 loss): lets a check pass before every input "
              "is evaluated"),
    ),
    doc="mean intermediate-q loss Z_q <= max_loss",
)


def _qs(key, value):
    """The q-curve's values of q: a non-empty sequence of numbers > 0, sorted, each once."""
    if isinstance(value, (int, float, str)) or not hasattr(value, "__len__") or not len(value):
        raise SettingError(key, value, "a non-empty sequence of numbers > 0, e.g. (1, 10, 100, 1000)")
    return sorted({_q(key, v) for v in value})


#: The q check's parameters that the q-curve takes too.
_CURVE_SHARED = ("perturbation", "estimator", "chains", "steps", "leapfrog", "mh_steps", "warmup", "path_len",
                 "target_accept", "loss", "pgd_steps", "pgd_restarts", "inputs", "full_context")

CURVE = Metric(
    "pytest_robust.checks.q.curve:evaluate", title="q-curve", direction="<=", gate=False, budget=100_000,
    budget_per="qs",
    params=(DECLARATION.param("perturbation"),
            Param("qs", _qs, (1, 10, 100, 1000), "the values of q on the curve"),
            *(DECLARATION.param(k) for k in _CURVE_SHARED if k != "perturbation")),
    doc="the mean over inputs of Z_q for several q (path sampling and Monte Carlo) and the q = infinity end; the "
        "budget caps model evaluations per value of q",
)
