"""Robustness requirements as data: metric declarations, the registry, and ``CheckSpec``.

A metric is declared once, as a ``Metric``: its runner (the library function), its threshold
keyword, its required and optional parameters, the settings it reads and its default budget. From
that one declaration follow the marker keywords (``parse_marker``), the ``robust`` fixture's
methods, the YAML suite schema and the help texts. Built-in metrics and third-party metrics
register the same way, through the ``pytest_robust_metrics`` hook (``hookspec.py``).

A marker names exactly one metric with its threshold (``tsrm=0.9``; for the q-loss metric the
metric keyword carries q and the threshold has its own keyword: ``q=100, max_loss=0.5``), the
metric's own parameters (``perturbation=UniformLinf(eps=0.1)``) and optionally per-check settings
(``seed=``, ``budget=``, ``model=``, ...; see ``settings.KEYS``). Pure Python; torch is imported
only when a check runs.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

from . import validation
from .errors import ArgumentError, MarkerError, SettingError
from .results import Result
from .settings import KEY_NAMES, Settings, parse_layer


@dataclass(frozen=True)
class Metric:
    """A metric's declaration.

    ``runner`` is the library function, or its import path "module:function" (imported when the
    check runs, which keeps torch out of collection). It is called as ``runner(model, data,
    threshold=..., confidence=..., budget=..., seed=..., batch_size=..., device=..., **params)``
    and returns a ``Result``. ``direction`` is ">=" for requirements "at least" (accuracies: the
    threshold is a probability) and "<=" for "at most" (losses: a number >= 0). When
    ``threshold_key`` is set, the threshold has that keyword and the metric keyword's own value is
    passed as a parameter of the metric's name (``q=100, max_loss=0.5``). ``settings`` names
    settings keys the runner takes as keyword arguments (``cache_dir``, ``refit``). A metric that
    lists ``perturbation`` as optional gets ``UniformLinf(eps=<settings.eps>)`` when none is given.
    ``budget`` is the default cap on model evaluations (``--robust-budget`` overrides it).
    """

    runner: str | Callable
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    threshold_key: str | None = None
    direction: str = ">="
    settings: tuple[str, ...] = ()
    budget: int = 100_000
    doc: str = ""

    def keywords(self, name: str) -> tuple[str, tuple[str, ...]]:
        """(the threshold's keyword, the parameters passed to the runner) for metric ``name``."""
        return self.threshold_key or name, self.required + self.optional + ((name,) if self.threshold_key else ())

    def load(self) -> Callable:
        if callable(self.runner):
            return self.runner
        module, name = self.runner.split(":")
        return getattr(importlib.import_module(module), name)

    def threshold(self, key: str, value) -> float:
        if self.direction == "<=":
            return validation.non_negative_float(key, value)
        return validation.open_unit(key, value)


def register(metrics: dict, found: dict, source: str) -> None:
    """Add the metrics ``found`` by one hook implementation to ``metrics``; names must be new."""
    if not isinstance(found, dict):
        raise SettingError(f"pytest_robust_metrics ({source})", found, "a dict {name: Metric(...)}")
    for name, metric in found.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise SettingError(f"pytest_robust_metrics ({source})", name, "metric names that are identifiers")
        if not isinstance(metric, Metric):
            raise SettingError(f"metric {name} ({source})", metric, "a pytest_robust.checks.Metric")
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
    allowed = (threshold_key,) + params_allowed + KEY_NAMES
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise MarkerError(
            f"unknown keyword(s) {', '.join(k + suggest(k, allowed) for k in unknown)} on robust({name}=...); "
            + valid_keywords(metrics, name)
        )
    missing = [k for k in (threshold_key,) + metric.required if k not in kwargs]
    if missing:
        raise MarkerError(
            f"robust({name}=...) needs {', '.join(k + '=' for k in missing)}; " + valid_keywords(metrics, name)
        )
    try:
        threshold = metric.threshold(threshold_key, kwargs[threshold_key])
        overrides = {k: v for k, v in kwargs.items() if k in KEY_NAMES}
        parse_layer(overrides, "on the robust marker")
    except SettingError as err:
        raise MarkerError(str(err)) from None
    params = {k: kwargs[k] for k in params_allowed if k in kwargs}
    if "perturbation" in params:
        _check_perturbation(params["perturbation"])
    return CheckSpec(name, threshold, params, overrides)


def _check_perturbation(p) -> None:
    """A marker's perturbation: an instance or a callable (x, generator) -> x' (torch is already
    imported when the user built one, so ``inspection`` costs nothing extra here)."""
    if not callable(p):
        raise MarkerError(
            f"perturbation must be a perturbation such as UniformLinf(eps=0.1) or a callable "
            f"(x, generator) -> x', got {p!r}"
        )
    from .inspection import check_perturbation_object

    try:
        check_perturbation_object(p)
    except TypeError as err:
        raise MarkerError(str(err)) from None


def not_run(spec: CheckSpec, metrics: dict, verdict: str, reason: str, model: str = "",
            settings: Settings | None = None) -> Result:
    """The Result recorded for ``spec`` when it produced no numbers (verdict "error" or "skipped"),
    with what is known of its conditions: its parameters and, when resolved, its settings."""
    metric = metrics.get(spec.metric)
    direction = metric.direction if metric is not None else ">="
    p = spec.params.get("perturbation")
    eps = spec.overrides.get("eps", spec.params.get("eps", settings.eps if settings else None))
    shown = repr(p) if p is not None else f"eps={eps:g}" if isinstance(eps, (int, float)) else "its default"
    result = Result.not_run(spec.metric, spec.threshold, direction, shown, verdict, reason, model)
    if settings is not None:
        result.confidence, result.seed = settings.confidence, settings.seed
        result.budget = budget_of(settings, metric) if metric is not None else settings.budget or 0
    return result


def budget_of(settings: Settings, metric: Metric) -> int:
    """The check's budget: the configured one, else the metric's default."""
    return metric.budget if settings.budget is None else settings.budget


def run(spec: CheckSpec, metrics: dict, model, data, settings: Settings, device):
    """Evaluate one spec with resolved settings on a resolved device; returns a ``Result``."""
    metric = metrics[spec.metric]
    params = dict(spec.params)
    if "perturbation" in metric.optional and "perturbation" not in params:
        from .perturbations import UniformLinf

        params["perturbation"] = UniformLinf(eps=settings.eps)
    params.update({key: getattr(settings, key) for key in metric.settings})
    runner = metric.load()
    kwargs = dict(threshold=spec.threshold, confidence=settings.confidence, budget=budget_of(settings, metric),
                  seed=settings.seed, batch_size=settings.batch_size, device=device, **params)
    try:
        inspect.signature(runner).bind(model, data, **kwargs)
    except TypeError as err:
        raise ArgumentError(
            f"metric {spec.metric}: its runner {getattr(runner, '__qualname__', runner)!r} cannot be called as "
            f"runner(model, data, {', '.join(k + '=' for k in kwargs)}) ({err}); a metric's runner takes the "
            "model, the data and these keywords (README, 'How checks are built')"
        ) from None
    result = runner(model, data, **kwargs)
    return checked_result(spec.metric, result)


def checked_result(name: str, result) -> Result:
    """``result`` if it is a ``Result`` whose numbers make sense (finite bounds, lower <= upper);
    a metric that returns anything else has a bug, named here instead of failing later."""
    if not isinstance(result, Result):
        raise ArgumentError(
            f"metric {name} returned {type(result).__name__}, not a pytest_robust Result: build it with "
            "Run.result(...) (README, 'How checks are built')"
        )
    numbers = (result.estimate, result.lower, result.upper)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers) or result.lower > result.upper + 1e-12:
        raise ArgumentError(
            f"metric {name} returned estimate {result.estimate!r} with bounds [{result.lower!r}, {result.upper!r}]: "
            "the bounds must be finite numbers with lower <= upper"
        )
    return result
