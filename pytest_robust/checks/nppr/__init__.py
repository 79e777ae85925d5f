"""NPPR (Wang et al.): accuracy under a learned worst-case Gaussian-mixture noise. This folder holds the
declaration (here, torch-free), the check (``check``), the mixture (``gmm``), its fit and fit cache
(``fit``), the fit/evaluation split (``data``) and the per-input context (``context``)."""

from pytest_robust.checks.registry import BOX, REQUIRED, Metric, Param
from pytest_robust.settings.validation import (
    boolean,
    choice,
    non_negative_float,
    open_unit,
    positive_float,
    positive_int,
    positive_pair,
    size,
    text,
)

DECLARATION = Metric(
    "pytest_robust.checks.nppr.check:evaluate", title="NPPR", budget=300_000, settings=("cache_dir", "refit"),
    perturbation="pytest_robust.checks.nppr.check:ball",
    params=(
        Param("eps", size, REQUIRED, "radius of the ball the learned noise lives in, in input units; in L-inf also "
              "one radius per feature (a tensor broadcasting to one input; 0 keeps a feature fixed)"),
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
)
