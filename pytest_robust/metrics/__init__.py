"""The built-in checks, declared here (without importing torch) and registered through the same
``pytest_robust_metrics`` hook as third-party checks. Each body lives in the module of its name
(``metrics/<module>.py``), with the library function derived from its declaration."""

from ..declarations import REQUIRED, FromSetting, Metric, Param, perturbation
from ..errors import SettingError
from ..validation import (at_least, boolean, box, choice, function, int_list, non_negative_float, non_negative_int,
                          open_unit, positive_float, positive_int, positive_pair, text, text_list)


def _ball(settings):
    from ..perturbations import UniformLinf

    return UniformLinf(eps=settings.eps)


def _corruptions(key, value):
    """Names of common corruptions (did-you-mean for a misspelt one)."""
    from ..corruptions import CorruptionGrid

    names = text_list(key, value)
    try:
        CorruptionGrid(names, (1,))
    except ValueError as err:
        raise SettingError(key, value, str(err)) from None
    return names


def _q(key, value):
    accepted = "a finite number > 0 (1: the average loss; larger q weighs high losses more)"
    try:
        return positive_float(key, value)
    except SettingError:
        raise SettingError(key, value, accepted) from None


def _severities(key, value):
    """Severities 1-5 (one is a list of one)."""
    accepted = "a list of severities (each severity must be an integer from 1 to 5), e.g. [1, 2, 3]"
    try:
        levels = int_list(key, value)
    except SettingError:
        raise SettingError(key, value, accepted) from None
    if not all(1 <= s <= 5 for s in levels):
        raise SettingError(key, value, accepted)
    return levels


BOX = Param("bounds", box, (0.0, 1.0), "the input box (lo, hi) the perturbed inputs are clipped to")
EPS_SETTING = FromSetting(lambda settings: settings.eps, "robust_eps (8/255)")

BUILTIN = {
    "tsrm": Metric(
        "pytest_robust.metrics.tsrm:evaluate", title="TSRM", budget=100_000, paired="bernoulli",
        params=(Param("perturbation", perturbation, REQUIRED, "the random perturbation, e.g. UniformLinf(eps=0.1)"),),
        doc="accuracy under a random perturbation (TSRM) >= threshold",
    ),
    "q": Metric(
        "pytest_robust.metrics.intermediate_q:evaluate", title="q-loss", direction="<=", paired="values",
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
    ),
    "certified_accuracy": Metric(
        "pytest_robust.metrics.certified_accuracy:evaluate", title="certified accuracy", budget=2_000_000,
        certificate=True, paired="outcomes",
        params=(
            Param("radius", non_negative_float, REQUIRED, "the L2 radius to certify, in input units"),
            Param("sigma", positive_float, REQUIRED, "the Gaussian noise level of the smoothed classifier"),
            Param("alpha", open_unit, 1e-3, "error probability of each per-input certificate"),
            Param("max_draws", positive_int, 100_000, "most noise draws per input"),
        ),
        doc="randomized-smoothing certified accuracy at an L2 radius >= threshold",
    ),
    "nppr": Metric(
        "pytest_robust.metrics.nppr:evaluate", title="NPPR", budget=300_000, settings=("cache_dir", "refit"),
        perturbation="pytest_robust.metrics.nppr:ball",
        params=(
            Param("eps", positive_float, REQUIRED, "radius of the ball the learned noise lives in, in input units"),
            Param("norm", choice("linf", "l2"), "linf", "the ball's norm"),
            Param("components", positive_int, 7, "mixture components"),
            Param("latent_dim", positive_int, 128, "latent dimension of the mixture"),
            Param("covariance", choice("full", "diagonal"), "diagonal", "covariance of each component"),
            Param("dependency", choice("independent", "label", "input", "joint"), "joint",
                  "what the mixture weights depend on"),
            Param("feature_layer", text, None, "the layer whose features the input-dependent weights read"),
            Param("grid_size", positive_int, None, "side of the noise grid (default: the input's)"),
            Param("fit_data", None, None, "data to fit the mixture on (data, or a fixture name on a marker)",
                  fixture=True),
            Param("fit_fraction", open_unit, 0.5, "share of the data used to fit when fit_data is not given"),
            Param("fit_steps", positive_int, 200, "Adam steps of the fit"),
            Param("fit_batch_size", positive_int, 32, "fit inputs per step"),
            Param("fit_draws", positive_int, 8, "relaxed perturbations per input and step"),
            Param("fit_lr", positive_float, 0.01, "Adam learning rate"),
            Param("fit_temperature", positive_pair, (1.0, 0.1), "Gumbel-softmax temperature, start and end"),
            Param("fit_clip_norm", positive_float, 5.0, "gradient-norm clip"),
            Param("kappa", non_negative_float, 1.0, "margin of the fit loss"),
            Param("draws_per_input", positive_int, 32, "draws of the learned noise per evaluation input"),
            Param("pgd", boolean, False, "also run a PGD attack for the adversarial floor"),
            Param("pgd_steps", positive_int, 50, "steps of that attack"),
            BOX,
        ),
        doc="accuracy under a learned worst-case noise distribution in the eps-ball >= threshold",
    ),
    "adversarial_accuracy": Metric(
        "pytest_robust.metrics.adversarial:evaluate", title="adversarial accuracy", budget=1_000_000, paired="outcomes",
        perturbation="pytest_robust.metrics.adversarial:ball",
        params=(
            Param("eps", positive_float, EPS_SETTING, "the radius of the attack in the norm norm=, in input units"),
            Param("norm", choice("linf", "l2"), "linf", "the ball's norm"),
            Param("steps", positive_int, 50, "APGD steps"),
            Param("restarts", positive_int, 1, "APGD-CE restarts"),
            Param("targets", non_negative_int, 6, "target classes of APGD-T (0 skips it; at most classes - 1)"),
            Param("ranking", choice("linear", "logits"), "linear",
                  "APGD-T's targets and starts: by the first-order model (linear) or by clean logits from random "
                  "starts (logits, AutoAttack's)"),
            Param("square_queries", non_negative_int, 250, "queries of the Square search (0 skips it)"),
            Param("inputs", positive_int, None, "attack at most this many inputs (a seeded random subset)"),
            BOX,
        ),
        doc="accuracy under an L-inf or L2 attack (APGD-CE, APGD-T, Square) >= threshold (an upper estimate of "
            "true robust accuracy)",
    ),
    "corruption_accuracy": Metric(
        "pytest_robust.metrics.corruption_accuracy:evaluate", title="corruption accuracy", budget=100_000, paired="bernoulli",
        # its draws are TSRM's (same inputs and noise streams for a seed), so the two compare draw by draw
        streams="tsrm", perturbation="pytest_robust.metrics.corruption_accuracy:grid",
        params=(
            Param("corruptions", _corruptions, None, "the corruptions (default: the 15 of the benchmark)"),
            Param("severities", _severities, None, "the severities 1-5 (default: all five)"),
            Param("preset", text, None, "the corruptions' preset (as for Corruption)"),
        ),
        doc="mean accuracy over a grid of common corruptions x severities >= threshold",
    ),
}
