"""Robustness requirements as data: the registry of declared checks and ``CheckSpec``.

A check is declared once, as a ``registry.Metric``. Built-in and third-party checks register
the same way, through the ``pytest_robust_metrics`` hook (``hookspec.py``); ``parse_marker``
validates a marker (or a YAML check) against its declaration at collection, and ``run`` evaluates
a spec through the same path as a library call (``library.evaluate``).

A marker names exactly one metric with its threshold (``tsrm=0.9``; for the q-loss metric the
metric keyword carries q and the threshold has its own keyword: ``q=100, max_loss=0.5``), the
metric's own parameters (``perturbation=UniformLinf(eps=0.1)``) and optionally per-check settings
(``seed=``, ``budget=``, ``model=``, ...; see ``settings.keys.KEYS``). Pure Python; torch is imported
only when a check runs.
"""

from __future__ import annotations

from pytest_robust.checks import ANALYSES
from pytest_robust.checks.registry import CheckSpec, Metric, suggest
from pytest_robust.errors import ArgumentError, MarkerError, SettingError
from pytest_robust.results import Result
from pytest_robust.settings.keys import CHECK_KEY_NAMES, KEY_NAMES, Settings


def register(metrics: dict, found: dict, source: str) -> None:
    """Add the metrics ``found`` by one hook implementation to ``metrics``; names must be new."""
    if not isinstance(found, dict):
        raise SettingError(f"pytest_robust_metrics ({source})", found, "a dict {name: Metric(...)}")
    for name, metric in found.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise SettingError(f"pytest_robust_metrics ({source})", name, "metric names that are identifiers")
        if not isinstance(metric, Metric):
            raise SettingError(f"metric {name} ({source})", metric, "a pytest_robust.Metric")
        if name in metrics or name in KEY_NAMES or name in ANALYSES:
            raise SettingError(f"metric {name} ({source})", name,
                               "a name not already taken by a metric, an analysis or a setting")
        metrics[name] = metric


def valid_keywords(metrics: dict) -> str:
    """The metrics a marker may name, and the settings it may override."""
    return f"metrics: {', '.join(metrics)}; settings: {', '.join(CHECK_KEY_NAMES)}"


def parse_marker(args: tuple, kwargs: dict, metrics: dict) -> CheckSpec:
    """Validate a marker's (or YAML check's) keywords against the registered ``metrics`` through
    the one door, ``Metric.accept``; errors list the valid keywords."""
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
    try:
        spec = metrics[name].accept(name, kwargs)
    except (SettingError, ArgumentError) as err:
        raise MarkerError(str(err)) from None
    reference = spec.paired and spec.paired["reference"]
    if spec.paired and not (isinstance(reference, str) and reference.isidentifier()):
        raise MarkerError(f"robust({name}=...): reference={reference!r} must name a fixture that returns "
                          "the reference model, e.g. reference='prod_model'")
    return spec


def not_run(spec: CheckSpec, metrics: dict, verdict: str, reason: str, model: str = "",
            settings: Settings | None = None) -> Result:
    """The Result recorded for ``spec`` when it produced no numbers (verdict "error", "skipped" or "interrupted"),
    with what is known of its conditions: its parameters and, when resolved, its settings."""
    metric = metrics.get(spec.metric)
    direction = metric.direction if metric is not None else ">="
    result = Result.not_run(spec.metric, spec.threshold, direction, _conditions(spec, metric, settings), verdict,
                            reason, model)
    result.details["title"] = metric.title if metric is not None and metric.title else spec.metric
    if settings is not None:
        result.confidence, result.seed = settings.confidence, settings.seed
        result.budget = (budget_of(settings, metric) if metric is not None else settings.budget) or 0
    return result


def _conditions(spec: CheckSpec, metric: Metric | None, settings: Settings | None) -> str:
    """What a check that produced no numbers would have perturbed, from its parameters: its
    perturbation, its radius where it takes eps=, its smoothing where it takes sigma=, else its
    default (the default perturbations' size is the run's eps, named where known)."""
    given = {**spec.params, **spec.overrides}
    declared = {p.name for p in metric.params} if metric is not None else {"eps"}
    eps = given.get("eps", settings.eps if settings else None)
    if given.get("perturbation") is not None:
        return repr(given["perturbation"])
    if "eps" in declared and isinstance(eps, (int, float)):
        return f"eps={eps:g}"
    if "sigma" in declared and isinstance(given.get("sigma"), (int, float)):
        radius = given.get("radius")
        return f"Gaussian smoothing sigma={given['sigma']:g}" + (
            f", L2 radius {radius:g}" if isinstance(radius, (int, float)) else "")
    return f"its default perturbation (eps={eps:g})" if isinstance(eps, (int, float)) else "its default"


def budget_of(settings: Settings, metric: Metric) -> int | None:
    """The check's budget: the configured one, else the metric's default (None: an uncapped analysis)."""
    if metric.budget is None:
        return None
    return metric.budget if settings.budget is None else settings.budget


def run(spec: CheckSpec, metrics: dict, model, data, settings: Settings, device, context):
    """Evaluate one spec with resolved settings on a resolved device under ``context`` (a
    ``context.RunContext`` built from ``settings``); returns a ``library.Evaluation``."""
    from pytest_robust.checks.library import evaluate

    metric = metrics[spec.metric]
    paired = None if spec.paired is None else (spec.paired["reference"], spec.paired["margin"])
    return evaluate(spec.metric, metric, model, data, spec.threshold, metric.resolved(spec.params, settings),
                    context=context, confidence=settings.confidence, budget=budget_of(settings, metric),
                    seed=settings.seed, batch_size=settings.batch_size, device=device, paired=paired)
