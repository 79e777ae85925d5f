"""Robustness requirements as data: parse a ``robust(...)`` marker into a ``CheckSpec`` and run it.

A marker names exactly one metric with its threshold (``tsrm=0.9``; for the q-loss metric the
metric keyword carries q and the threshold has its own keyword: ``q=100, max_loss=0.5``), the
metric's own parameters (``perturbation=UniformLinf(eps=0.1)``) and optionally per-check settings
(``seed=``, ``budget=``, ``model=``, ...; see ``settings.KEYS``). Pure Python; torch is imported
only when a check runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from . import validation
from .settings import KEY_NAMES, Settings, parse_layer
from .validation import SettingError


@dataclass(frozen=True)
class Metric:
    """A marker metric: where its threshold is, its parameters, the function that evaluates it.

    The runner is called as ``runner(model, data, threshold=..., confidence=..., budget=...,
    seed=..., batch_size=..., device=..., **params)`` and returns a ``Result``. When
    ``threshold_key`` differs from the metric keyword, the metric keyword's value is passed as a
    parameter of the same name (``q=100``). ``threshold_kind`` is "probability" (strictly between
    0 and 1) or "loss" (>= 0). ``settings`` names extra settings keys the runner takes as keyword
    arguments (``cache_dir``, ``refit``). A metric listing ``perturbation`` as optional gets
    ``UniformLinf(eps=<settings.eps>)`` when the marker gives none.
    """

    runner: str  # "module:function", imported when the check runs (keeps torch out of collection)
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    threshold_key: str | None = None
    threshold_kind: str = "probability"
    settings: tuple[str, ...] = ()  # settings keys passed to the runner as keyword arguments

    def keywords(self, name: str) -> tuple[str, tuple[str, ...]]:
        """(the threshold's keyword, the parameters passed to the runner) for metric ``name``."""
        return self.threshold_key or name, self.required + self.optional + ((name,) if self.threshold_key else ())

    def load(self):
        module, name = self.runner.split(":")
        return getattr(importlib.import_module(module), name)


METRICS = {
    "tsrm": Metric("pytest_robust.metrics.tsrm:tsrm", required=("perturbation",)),
    "q": Metric(
        "pytest_robust.metrics.intermediate_q:intermediate_q",
        optional=("perturbation", "estimator", "chains", "steps", "leapfrog", "mh_steps", "path_len",
                  "target_accept", "warmup", "loss", "pgd_steps", "pgd_restarts", "inputs"),
        threshold_key="max_loss",
        threshold_kind="loss",
    ),
    "certified_accuracy": Metric(
        "pytest_robust.metrics.smoothing:certified_accuracy",
        required=("radius", "sigma"),
        optional=("alpha", "max_draws"),
    ),
    "nppr": Metric(
        "pytest_robust.metrics.nppr:nppr",
        required=("eps",),
        optional=("components", "latent_dim", "covariance", "dependency", "feature_layer", "norm",
                  "grid_size", "fit_steps", "fit_fraction", "fit_data", "fit_batch_size", "fit_draws",
                  "fit_lr", "fit_temperature", "fit_clip_norm", "kappa", "draws_per_input", "pgd", "pgd_steps",
                  "bounds"),
        settings=("eps", "cache_dir", "refit"),  # eps: the marker's, also when given to robust.nppr()
    ),
    "corruption_accuracy": Metric(
        "pytest_robust.metrics.corruption_accuracy:corruption_accuracy",
        optional=("corruptions", "severities", "preset"),
    ),
}


class MarkerError(ValueError):
    """A ``robust`` marker that cannot be run as written."""


def valid_keywords() -> str:
    params = sorted(
        {p for k, m in METRICS.items() for p in m.required + m.optional + ((m.threshold_key,) if m.threshold_key else ())}
    )
    return (
        f"metrics: {', '.join(METRICS)}; metric parameters: {', '.join(params)}; "
        f"settings: {', '.join(KEY_NAMES)}"
    )


@dataclass
class CheckSpec:
    """One requirement on ``metric`` against ``threshold``, its parameters and per-check settings."""

    metric: str
    threshold: float | None
    params: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)


def _threshold(metric: Metric, key: str, value) -> float:
    if metric.threshold_kind == "loss":
        return validation.non_negative_float(key, value)
    return validation.open_unit(key, value)


def parse_marker(args: tuple, kwargs: dict) -> CheckSpec:
    """Validate a marker's arguments; errors list the valid keywords."""
    if args:
        raise MarkerError(
            f"robust markers take keywords only, got positional {args!r}; valid keywords: "
            + valid_keywords()
        )
    names = [k for k in kwargs if k in METRICS]
    if len(names) != 1:
        found = f"several ({', '.join(names)})" if names else "none"
        raise MarkerError(
            f"a robust marker names exactly one metric with its threshold, e.g. "
            f"robust(tsrm=0.9, perturbation=UniformLinf(eps=0.1)); found {found}. Use one marker per "
            f"metric. Valid keywords: " + valid_keywords()
        )
    name = names[0]
    metric = METRICS[name]
    threshold_key, params_allowed = metric.keywords(name)
    unknown = [k for k in kwargs if k not in (threshold_key,) + params_allowed + KEY_NAMES]
    if unknown:
        raise MarkerError(
            f"unknown keyword(s) {', '.join(unknown)} on robust({name}=...). Valid keywords: "
            + valid_keywords()
        )
    missing = [k for k in (threshold_key,) + metric.required if k not in kwargs]
    if missing:
        raise MarkerError(
            f"robust({name}=...) needs {', '.join(k + '=' for k in missing)}; valid keywords: "
            + valid_keywords()
        )
    try:
        threshold = _threshold(metric, threshold_key, kwargs[threshold_key])
        overrides = {k: v for k, v in kwargs.items() if k in KEY_NAMES}
        parse_layer(overrides, "on the robust marker")
    except SettingError as err:
        raise MarkerError(str(err)) from None
    params = {k: kwargs[k] for k in params_allowed if k in kwargs}
    if "perturbation" in params and not callable(params["perturbation"]):
        raise MarkerError(
            f"perturbation must be a perturbation such as UniformLinf(eps=0.1) or a callable "
            f"(x, generator) -> x', got {params['perturbation']!r}"
        )
    return CheckSpec(name, threshold, params, overrides)


def run(spec: CheckSpec, model, data, settings: Settings, device):
    """Evaluate one spec with resolved settings on a resolved device; returns a ``Result``."""
    metric = METRICS[spec.metric]
    params = dict(spec.params)
    if "perturbation" in metric.optional and "perturbation" not in params:
        from .perturbations import UniformLinf

        params["perturbation"] = UniformLinf(eps=settings.eps)
    params.update({key: getattr(settings, key) for key in metric.settings})
    return metric.load()(
        model,
        data,
        threshold=spec.threshold,
        confidence=settings.confidence,
        budget=settings.budget,
        seed=settings.seed,
        batch_size=settings.batch_size,
        device=device,
        **params,
    )
