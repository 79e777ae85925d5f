"""The library function of every check, derived from its declaration, and the one path from
parameters to a ``Result`` that library calls and the pytest layer share.

``function(name, metric)`` builds ``name(model, data, *, <threshold>=None, <parameters>,
confidence=0.95, budget=<the metric's>, seed=0, batch_size=1024, device=None, normalize=None,
logits=None, data_keys=None)``: everything after (model, data) is keyword-only, so that a swapped threshold and
radius cannot go unnoticed. ``evaluate`` validates the parameters by their declaration, builds the
check's ``run.Run`` (direction, streams and certificate from the declaration), calls the body
inside it with RobustWarnings captured (re-issued to the caller and listed in
``details["warnings"]``) and checks the Result it returns.
"""

from __future__ import annotations

import contextlib
import inspect
import math

from pytest_robust.checks.registry import REQUIRED, Metric, load
from pytest_robust.engine import interface as model_io
from pytest_robust.engine.inspect.warnings import captured_warnings, robust_messages
from pytest_robust.engine.items import data_keys
from pytest_robust.engine.run import Run
from pytest_robust.errors import ArgumentError, BudgetError, SettingError
from pytest_robust.perturbations.base import as_perturbation
from pytest_robust.procedures import paired as paired_procedures
from pytest_robust.results import Result
from pytest_robust.settings.keys import Settings, data_key_pair

#: The common keywords of every check, with their library defaults (budget: the metric's).
COMMON = ("confidence", "budget", "seed", "batch_size", "device", "normalize", "logits", "data_keys")
#: Library defaults of settings keys a check takes that differ from the pytest layer's: a library
#: call caches nothing unless it names a directory.
LIBRARY_SETTINGS = {"cache_dir": None}


def signature(metric: Metric) -> inspect.Signature:
    """The library signature of ``metric`` (see the module docstring)."""
    kw = inspect.Parameter.KEYWORD_ONLY
    positional = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("model", "data")]
    own = [inspect.Parameter(k, kw, default=None) for k in (metric.call_threshold(), *metric.paired_keys())]
    own += [inspect.Parameter(p.name, kw, **({} if p.required else {"default": p.default})) for p in metric.params]
    own += [inspect.Parameter(k, kw, default=LIBRARY_SETTINGS.get(k, getattr(Settings(), k))) for k in metric.settings]
    defaults = {"budget": metric.budget, "device": None}
    common = [inspect.Parameter(k, kw, default=defaults.get(k, getattr(Settings(), k, None))) for k in COMMON]
    return inspect.Signature(positional + own + common, return_annotation=Result)


def function(name: str, metric: Metric, public: str | None = None):
    """The library function of metric ``name`` (called ``public``, default ``name``), with
    ``signature(metric)`` and a docstring from the declaration."""
    sig, public = signature(metric), public or name

    def check(*args, **kwargs) -> Result:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as err:
            raise ArgumentError(f"{public}(): {err}: everything after (model, data) is a keyword; the signature is "
                                f"{public}{sig}") from None
        bound.apply_defaults()
        given = dict(bound.arguments)
        model, data = given.pop("model"), given.pop("data")
        common = {k: given.pop(k) for k in COMMON}
        settings = Settings(**{k: given.pop(k) for k in metric.settings})
        spec = metric.accept(name, given, spelling="call", where=f"{public}(...)", settings=())
        paired = None if spec.paired is None else (spec.paired["reference"], spec.paired["margin"])
        keys = data_key_pair("data_keys", common.pop("data_keys"))  # None: the keys in force hold
        with model_io.model_interface(*_interface(common.pop("normalize"), common.pop("logits"))), \
                (contextlib.nullcontext() if keys is None else data_keys(keys)):
            return evaluate(name, metric, model, data, spec.threshold, metric.resolved(spec.params, settings),
                            paired=paired, **common)

    check.__name__ = check.__qualname__ = public
    check.__module__ = metric.body.split(":")[0] if isinstance(metric.body, str) else metric.body.__module__
    check.__signature__ = sig
    check.__doc__ = f"{metric.title or name}: {metric.doc}\n\nKeywords:\n\n" + metric.help(name)
    return check


def _interface(normalize, logits) -> tuple:
    """The model interface of a call: its ``normalize=``/``logits=``, else the current one."""
    now = model_io.current()
    return (now.normalize if normalize is None else normalize, now.logits if logits is None else logits)


def evaluate(name: str, metric: Metric, model, data, threshold, params: dict, *, confidence, budget, seed,
             batch_size, device, paired: tuple | None = None) -> Result:
    """Evaluate one check: ``params`` are every parameter's value (``Metric.resolved``). With
    ``paired`` = (reference model, margin) it is the check's paired form (``procedures.paired``):
    the candidate ``model`` against the reference on common random numbers, gated "its drop (or
    increase) <= margin"."""
    missing = [k for k, v in params.items() if v is REQUIRED]
    if missing:
        raise ArgumentError(f"{name}(...) needs {', '.join(k + '=' for k in missing)}; " + metric.help(name))
    if threshold is not None:
        threshold = metric.threshold(metric.call_threshold(), threshold)
    body = _checked_body(name, metric, params)
    perturbation = _perturbation(metric, params)
    if "perturbation" in params:
        params = {**params, "perturbation": perturbation}
    shape = dict(confidence=confidence, budget=budget, seed=seed, batch_size=batch_size, device=device,
                 perturbation=perturbation, declaration=metric)
    with captured_warnings() as caught:  # re-issued at the user's test, also when the check raises
        if paired is None:
            with Run(name, model, data, threshold=threshold, **shape) as run:
                result = _called(body, run, params, name)
        else:
            result = _paired(name, metric, body, (model, data, params), paired, shape)
    result = checked_result(name, result)
    if robust_messages(caught, []):
        result.details["warnings"] = robust_messages(caught, result.details.get("warnings", []))
    return result


def _checked_body(name: str, metric: Metric, params: dict):
    """The check's body, refused with a clear message when it cannot take the run and ``params``."""
    body = metric.load()
    try:
        inspect.signature(body).bind(None, **params)
    except TypeError as err:
        shown = ", ".join(["run"] + [k + "=" for k in params])
        raise ArgumentError(f"metric {name}: its body {getattr(body, '__qualname__', body)!r} cannot be called as "
                            f"body({shown}) ({err}); a check's body takes the Run and its declared parameters "
                            "(docs: extending)") from None
    return body


def _called(body, run: Run, params: dict, name: str) -> Result:
    """``body(run, **params)``; a budget that ran out before an estimate is a budget usage error."""
    try:
        return checked_result(name, body(run, **params))
    except BudgetError as err:
        raise SettingError("budget", run.args.budget, f"enough for {name} to reach an estimate: {err}") from None


def _paired(name: str, metric: Metric, body, check: tuple, paired: tuple, shape: dict) -> Result:
    """The paired form of the check (``procedures.paired``): both models run with the same seed,
    so they see the same inputs, perturbations and noise."""
    (model, data, params), (reference, margin) = check, paired  # validated by Metric.pairing
    with Run(name, model, data, **shape) as run, Run(name, reference, data, **shape) as ref:
        if metric.paired == "bernoulli":
            return paired_procedures.bernoulli(run, ref, run.perturbation, margin)
        candidate, baseline = _called(body, run, params, name), _called(body, ref, params, name)
        return getattr(paired_procedures, metric.paired)(run, ref, candidate, baseline, margin)


def _perturbation(metric: Metric, params: dict):
    """The perturbation the check draws from (``Metric.perturbation``), or None."""
    if metric.perturbation is not None:
        return load(metric.perturbation)(**params)
    p = params.get("perturbation")
    return None if p is None else as_perturbation(p)


def checked_result(name: str, result) -> Result:
    """``result`` if it is a ``Result`` whose numbers make sense (finite bounds, lower <= upper);
    a metric that returns anything else has a bug, named here instead of failing later."""
    if not isinstance(result, Result):
        raise ArgumentError(
            f"metric {name} returned {type(result).__name__}, not a pytest_robust Result: end its body with "
            "return run.result(...) (docs: extending)"
        )
    numbers = (result.estimate, result.lower, result.upper)
    if (not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers)
            or result.lower > result.upper + 1e-12):
        raise ArgumentError(
            f"metric {name} returned estimate {result.estimate!r} with bounds [{result.lower!r}, {result.upper!r}]: "
            "the bounds must be finite numbers with lower <= upper"
        )
    return result
