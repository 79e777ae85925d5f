"""Robustness requirements as data: parse a ``robust(...)`` marker into a ``CheckSpec`` and run it.

A marker names exactly one metric with its threshold (``tsrm=0.9``), the metric's own parameters
(``perturbation=UniformLinf(eps=0.1)``) and optionally per-check settings (``seed=``, ``budget=``,
``model=``, ...; see ``settings.KEYS``). Pure Python; torch is imported only when a check runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import validation
from .settings import KEY_NAMES, Settings, parse_layer
from .validation import SettingError

#: metric keyword -> (its required parameters, its optional parameters)
METRICS = {
    "tsrm": (("perturbation",), ()),
}


class MarkerError(ValueError):
    """A ``robust`` marker that cannot be run as written."""


def valid_keywords() -> str:
    params = sorted({p for req, opt in METRICS.values() for p in req + opt})
    return (
        f"metrics: {', '.join(METRICS)}; metric parameters: {', '.join(params)}; "
        f"settings: {', '.join(KEY_NAMES)}"
    )


@dataclass
class CheckSpec:
    """One requirement: ``metric >= threshold`` with its parameters and per-check settings."""

    metric: str
    threshold: float
    params: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)

    def settings(self, base: Settings) -> Settings:
        return base.replace(self.overrides, "on the robust marker")


def parse_marker(args: tuple, kwargs: dict) -> CheckSpec:
    """Validate a marker's arguments; errors list the valid keywords."""
    if args:
        raise MarkerError(
            f"robust markers take keywords only, got positional {args!r}; valid keywords: "
            + valid_keywords()
        )
    metrics = [k for k in kwargs if k in METRICS]
    if len(metrics) != 1:
        found = f"several ({', '.join(metrics)})" if metrics else "none"
        raise MarkerError(
            f"a robust marker names exactly one metric with its threshold, e.g. "
            f"robust(tsrm=0.9, perturbation=UniformLinf(eps=0.1)); found {found}. Use one marker per "
            f"metric. Valid keywords: " + valid_keywords()
        )
    metric = metrics[0]
    required, optional = METRICS[metric]
    unknown = [k for k in kwargs if k != metric and k not in required + optional + KEY_NAMES]
    if unknown:
        raise MarkerError(
            f"unknown keyword(s) {', '.join(unknown)} on robust({metric}=...). Valid keywords: "
            + valid_keywords()
        )
    missing = [k for k in required if k not in kwargs]
    if missing:
        raise MarkerError(
            f"robust({metric}=...) needs {', '.join(missing)}=, e.g. "
            f"robust({metric}=0.9, perturbation=UniformLinf(eps=0.1))"
        )
    try:
        threshold = validation.open_unit(metric, kwargs[metric])
        overrides = {k: v for k, v in kwargs.items() if k in KEY_NAMES}
        parse_layer(overrides, "on the robust marker")
    except SettingError as err:
        raise MarkerError(str(err)) from None
    params = {k: kwargs[k] for k in required + optional if k in kwargs}
    if "perturbation" in params and not callable(params["perturbation"]):
        raise MarkerError(
            f"perturbation must be a perturbation such as UniformLinf(eps=0.1) or a callable "
            f"(x, generator) -> x', got {params['perturbation']!r}"
        )
    return CheckSpec(metric, threshold, params, overrides)


def run(spec: CheckSpec, model, data, settings: Settings, device):
    """Evaluate one spec with resolved settings on a resolved device; returns a ``Result``."""
    from .metrics.tsrm import tsrm

    runners = {"tsrm": tsrm}
    return runners[spec.metric](
        model,
        data,
        threshold=spec.threshold,
        confidence=settings.confidence,
        budget=settings.budget,
        seed=settings.seed,
        batch_size=settings.batch_size,
        device=device,
        **spec.params,
    )
