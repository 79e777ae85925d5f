"""Robustness requirements as data: the registry of declared checks and ``CheckSpec``.

A check is declared once, as a ``declarations.Metric``. Built-in and third-party checks register
the same way, through the ``pytest_robust_metrics`` hook (``hookspec.py``); ``parse_marker``
validates a marker (or a YAML check) against its declaration at collection, and ``run`` evaluates
a spec through the same path as a library call (``library.evaluate``).

A marker names exactly one metric with its threshold (``tsrm=0.9``; for the q-loss metric the
metric keyword carries q and the threshold has its own keyword: ``q=100, max_loss=0.5``), the
metric's own parameters (``perturbation=UniformLinf(eps=0.1)``) and optionally per-check settings
(``seed=``, ``budget=``, ``model=``, ...; see ``settings.KEYS``). Pure Python; torch is imported
only when a check runs.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from . import validation
from .declarations import Metric
from .errors import ArgumentError, MarkerError, SettingError
from .results import Result
from .settings import KEY_NAMES, Settings, parse_layer


def register(metrics: dict, found: dict, source: str) -> None:
    """Add the metrics ``found`` by one hook implementation to ``metrics``; names must be new."""
    if not isinstance(found, dict):
        raise SettingError(f"pytest_robust_metrics ({source})", found, "a dict {name: Metric(...)}")
    for name, metric in found.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise SettingError(f"pytest_robust_metrics ({source})", name, "metric names that are identifiers")
        if not isinstance(metric, Metric):
            raise SettingError(f"metric {name} ({source})", metric, "a pytest_robust.Metric")
        if name in metrics or name in KEY_NAMES:
            raise SettingError(f"metric {name} ({source})", name, "a name not already taken by a metric or setting")
        metrics[name] = metric


def valid_keywords(metrics: dict, name: str | None = None) -> str:
    """The keywords a marker may use: for metric ``name``, its threshold and parameters; else the
    metrics. Settings are always allowed."""
    if name is None:
        return f"metrics: {', '.join(metrics)}; settings: {', '.join(KEY_NAMES)}"
    threshold_key, params = metrics[name].keywords(name)
    own = [threshold_key] + [p for p in params if p != name]
    return f"valid keywords of robust({name}=...): {', '.join(own)}; settings: {', '.join(KEY_NAMES)}"


def suggest(word: str, options) -> str:
    """' (did you mean X?)' for the closest of ``options``, or '': among the close ones, one that
    shares the word's first three letters wins (epsilon -> eps, not precision)."""
    word = str(word)  # a YAML key may be a number
    close = difflib.get_close_matches(word, list(options), n=3)
    close = [c for c in close if c[:3] == word[:3]] + close
    return f" (did you mean {close[0]}?)" if close else ""


@dataclass
class CheckSpec:
    """One requirement on ``metric`` against ``threshold``, its parameters and per-check settings."""

    metric: str
    threshold: float | None
    params: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    paired: dict | None = None  # {"reference": a fixture name or a model, "margin": the largest drop/increase}


def parse_marker(args: tuple, kwargs: dict, metrics: dict) -> CheckSpec:
    """Validate a marker's arguments against the registered ``metrics``; errors list the valid keywords."""
    if args:
        raise MarkerError(
            f"robust markers take keywords only, got positional {args!r}; valid keywords: "
            + valid_keywords(metrics)
        )
    names = [k for k in kwargs if k in metrics]
    if len(names) != 1:
        guesses = "".join(f"; {k}={kwargs[k]!r}{suggest(k, metrics)}" for k in kwargs if suggest(k, metrics))
        found = f"several ({', '.join(names)})" if names else f"none{guesses}"
        raise MarkerError(
            f"a robust marker names exactly one metric with its threshold, e.g. "
            f"robust(tsrm=0.9, perturbation=UniformLinf(eps=0.1)); found {found}. Use one marker per "
            f"metric. Valid keywords: " + valid_keywords(metrics)
        )
    name = names[0]
    metric = metrics[name]
    threshold_key, params_allowed = metric.keywords(name)
    allowed = (threshold_key,) + params_allowed + metric.paired_keys() + KEY_NAMES
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise MarkerError(
            f"unknown keyword(s) {', '.join(k + suggest(k, allowed) for k in unknown)} on robust({name}=...); "
            + valid_keywords(metrics, name)
        )
    paired = _pairing(name, metric, kwargs)
    missing = [k for k in (() if paired else (threshold_key,)) + metric.required if k not in kwargs]
    if missing:
        raise MarkerError(
            f"robust({name}=...) needs {', '.join(k + '=' for k in missing)}; " + valid_keywords(metrics, name)
        )
    if not paired and kwargs[threshold_key] is None and metric.paired_keys():
        raise MarkerError(f"robust({name}=...): {threshold_key}=None needs a paired comparison instead: reference= (a "
                          f"fixture returning the reference model) and {metric.paired_keys()[1]}=; or give "
                          f"{threshold_key}= a threshold")
    try:
        threshold = None if paired else metric.threshold(threshold_key, kwargs[threshold_key])
        overrides = {k: v for k, v in kwargs.items() if k in KEY_NAMES}
        parse_layer(overrides, "on the robust marker")
        params = metric.validate({k: kwargs[k] for k in params_allowed if k in kwargs})
    except (SettingError, ArgumentError) as err:
        raise MarkerError(str(err)) from None
    return CheckSpec(name, threshold, params, overrides, paired)


def _pairing(name: str, metric: Metric, kwargs: dict) -> dict | None:
    """The paired form a marker asks for (``Metric.pairing``), its reference a fixture's name."""
    keys = metric.paired_keys()
    if not keys:
        return None
    threshold_key = metric.threshold_key or name
    try:
        pairing = metric.pairing(f"robust({name}=...)", threshold_key, kwargs.get(threshold_key),
                                 kwargs.get(keys[0]), kwargs.get(keys[1]))
    except (SettingError, ArgumentError) as err:
        raise MarkerError(str(err)) from None
    if pairing is not None and not (isinstance(pairing[0], str) and pairing[0].isidentifier()):
        raise MarkerError(f"robust({name}=...): reference={pairing[0]!r} must name a fixture that returns "
                          "the reference model, e.g. reference='prod_model'")
    return None if pairing is None else {"reference": pairing[0], "margin": pairing[1]}


def not_run(spec: CheckSpec, metrics: dict, verdict: str, reason: str, model: str = "",
            settings: Settings | None = None) -> Result:
    """The Result recorded for ``spec`` when it produced no numbers (verdict "error", "skipped" or "interrupted"),
    with what is known of its conditions: its parameters and, when resolved, its settings."""
    metric = metrics.get(spec.metric)
    direction = metric.direction if metric is not None else ">="
    p = spec.params.get("perturbation")
    eps = spec.overrides.get("eps", spec.params.get("eps", settings.eps if settings else None))
    shown = repr(p) if p is not None else f"eps={eps:g}" if isinstance(eps, (int, float)) else "its default"
    result = Result.not_run(spec.metric, spec.threshold, direction, shown, verdict, reason, model)
    result.details["title"] = metric.title if metric is not None and metric.title else spec.metric
    if settings is not None:
        result.confidence, result.seed = settings.confidence, settings.seed
        result.budget = budget_of(settings, metric) if metric is not None else settings.budget or 0
    return result


def budget_of(settings: Settings, metric: Metric) -> int:
    """The check's budget: the configured one, else the metric's default."""
    return metric.budget if settings.budget is None else settings.budget


def run(spec: CheckSpec, metrics: dict, model, data, settings: Settings, device):
    """Evaluate one spec with resolved settings on a resolved device; returns a ``Result``."""
    from .library import evaluate

    metric = metrics[spec.metric]
    paired = None if spec.paired is None else (spec.paired["reference"], spec.paired["margin"])
    return evaluate(spec.metric, metric, model, data, spec.threshold, metric.resolved(spec.params, settings),
                    confidence=settings.confidence, budget=budget_of(settings, metric), seed=settings.seed,
                    batch_size=settings.batch_size, device=device, paired=paired)
