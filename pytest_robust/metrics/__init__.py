"""The built-in metrics, one module each, declared here (without importing torch) and registered
through the same ``pytest_robust_metrics`` hook as third-party metrics."""

from ..checks import Metric

BUILTIN = {
    "tsrm": Metric(
        "pytest_robust.metrics.tsrm:tsrm", required=("perturbation",), budget=100_000,
        doc="accuracy under a random perturbation (TSRM) >= threshold",
    ),
    "q": Metric(
        "pytest_robust.metrics.intermediate_q:intermediate_q",
        optional=("perturbation", "estimator", "chains", "steps", "leapfrog", "mh_steps", "path_len",
                  "target_accept", "warmup", "loss", "pgd_steps", "pgd_restarts", "inputs", "full_context"),
        threshold_key="max_loss", direction="<=", budget=1_000_000,
        doc="mean intermediate-q loss Z_q <= max_loss",
    ),
    "certified_accuracy": Metric(
        "pytest_robust.metrics.smoothing:certified_accuracy",
        required=("radius", "sigma"), optional=("alpha", "max_draws"), budget=2_000_000,
        doc="randomized-smoothing certified accuracy at an L2 radius >= threshold",
    ),
    "nppr": Metric(
        "pytest_robust.metrics.nppr:nppr",
        required=("eps",),
        optional=("components", "latent_dim", "covariance", "dependency", "feature_layer", "norm",
                  "grid_size", "fit_steps", "fit_fraction", "fit_data", "fit_batch_size", "fit_draws",
                  "fit_lr", "fit_temperature", "fit_clip_norm", "kappa", "draws_per_input", "pgd", "pgd_steps",
                  "bounds"),
        settings=("eps", "cache_dir", "refit"),  # eps: the marker's, also when given to robust.nppr()
        budget=300_000,
        doc="accuracy under a learned worst-case noise distribution in the eps-ball >= threshold",
    ),
    "adversarial_accuracy": Metric(
        "pytest_robust.metrics.adversarial:adversarial_accuracy",
        optional=("steps", "restarts", "targets", "square_queries", "bounds"),
        settings=("eps",),  # eps= on the marker is the setting, default robust_eps (8/255)
        budget=1_000_000,
        doc="accuracy under an L-inf attack (APGD-CE, APGD-T, Square) >= threshold (an upper estimate of true "
            "robust accuracy)",
    ),
    "corruption_accuracy": Metric(
        "pytest_robust.metrics.corruption_accuracy:corruption_accuracy",
        optional=("corruptions", "severities", "preset"), budget=100_000,
        doc="mean accuracy over a grid of common corruptions x severities >= threshold",
    ),
}
