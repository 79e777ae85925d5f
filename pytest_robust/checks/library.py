"""The library function of every check and analysis, derived from its declaration, and the one
path from parameters to a ``Result`` that library calls and the pytest layer share.

``function(name, metric)`` builds ``name(model, data, *, <threshold>=None, <parameters>,
confidence=0.95, budget=<the metric's>, seed=0, batch_size="auto", device=None, normalize=None,
logits=None, embedding=None, data_keys=None, time_limit=None)``: everything after (model, data) is keyword-only (an
analysis may take the parameters it declares ``positional`` in that place too), so that a swapped
threshold and radius cannot go unnoticed; a misspelt keyword is refused by the one door
(``Metric.accept``) with the closest valid one. The call's context (``context.RunContext``) is the
one in force (the public ``execution()`` / ``model_interface()`` blocks), read once here, with the
call's ``normalize=``, ``logits=``, ``embedding=``, ``data_keys=`` and ``time_limit=`` laid over it.

``evaluate`` validates the parameters by their declaration, builds the check's ``run.Run``
(direction, streams and certificate from the declaration, the context as given), calls the body
inside it with RobustWarnings captured (re-issued to the caller and listed in
``details["warnings"]``) and checks the Result it returns (``Evaluation``: the Result, and the
value a library call returns: the Result itself, or an analysis' per-input object).
"""

from __future__ import annotations

import inspect
import math
from typing import NamedTuple

from pytest_robust.checks.registry import REQUIRED, Metric, load
from pytest_robust.engine.context import RunContext, ambient
from pytest_robust.engine.inspect.warnings import captured_warnings, robust_messages
from pytest_robust.engine.interface import ModelInterface
from pytest_robust.engine.run import Run
from pytest_robust.errors import ArgumentError, BudgetError, SettingError
from pytest_robust.perturbations.base import as_perturbation
from pytest_robust.procedures import paired as paired_procedures
from pytest_robust.results import Result
from pytest_robust.settings import validation
from pytest_robust.settings.keys import Settings

#: The common keywords of every check, with their library defaults (budget: the metric's).
COMMON = ("confidence", "budget", "seed", "batch_size", "device", "normalize", "logits", "embedding", "data_keys",
          "time_limit")
#: Library defaults of settings keys a check takes that differ from the pytest layer's: a library
#: call caches nothing unless it names a directory.
LIBRARY_SETTINGS = {"cache_dir": None}
#: How the paired form's reference model is named in its errors (``errors.of_model``).
REFERENCE = "the reference model (reference=)"


class Evaluation(NamedTuple):
    """What one evaluation gives: the ``result`` every report records, and the ``value`` a library
    call returns (the result itself; an analysis' per-input object such as a ``Certification``)."""

    result: Result
    value: object


def common_keys(metric: Metric) -> tuple[str, ...]:
    """The common keywords ``metric`` takes: ``COMMON``, less ``budget`` where its work is uncapped."""
    return tuple(k for k in COMMON if k != "budget" or metric.budget is not None)


def signature(metric: Metric) -> inspect.Signature:
    """The library signature of ``metric`` (see the module docstring)."""
    kw, either = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    positional = [inspect.Parameter(n, either) for n in ("model", "data")]
    positional += [_parameter(p, either) for p in metric.params if p.name in metric.positional]
    own = [inspect.Parameter(k, kw, default=None) for k in ((metric.call_threshold(),) if metric.gate else ())
           + metric.paired_keys()]
    own += [_parameter(p, kw) for p in metric.params if p.name not in metric.positional]
    own += [inspect.Parameter(k, kw, default=LIBRARY_SETTINGS.get(k, getattr(Settings(), k))) for k in metric.settings]
    defaults = {"budget": metric.budget, "device": None}
    common = [inspect.Parameter(k, kw, default=defaults.get(k, getattr(Settings(), k, None)))
              for k in common_keys(metric)]
    return inspect.Signature(positional + own + common, return_annotation=Result)


def _parameter(param, kind) -> inspect.Parameter:
    return inspect.Parameter(param.name, kind, **({} if param.required else {"default": param.default}))


def function(name: str, metric: Metric, public: str | None = None):
    """The library function of metric ``name`` (called ``public``, default ``name``), with
    ``signature(metric)`` and a docstring from the declaration."""
    sig, public = signature(metric), public or name
    where = f"{public}(...)"

    def check(*args, **kwargs):
        unknown = {k: v for k, v in kwargs.items() if k not in sig.parameters}
        if unknown:  # refused by the one door, with its message
            metric.accept(name, unknown, spelling="call", where=where, settings=common_keys(metric) + metric.settings)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as err:
            raise ArgumentError(f"{public}(): {err}: everything after (model, data) is a keyword; the signature is "
                                f"{public}{sig}") from None
        bound.apply_defaults()
        given = dict(bound.arguments)
        model, data = given.pop("model"), given.pop("data")
        common = {k: given.pop(k) for k in common_keys(metric)}
        settings = Settings(**{k: given.pop(k) for k in metric.settings})
        spec = metric.accept(name, given, spelling="call", where=where, settings=())
        paired = None if spec.paired is None else (spec.paired["reference"], spec.paired["margin"])
        context = _context(common.pop("normalize"), common.pop("logits"), common.pop("embedding"),
                           common.pop("data_keys"), common.pop("time_limit"))
        return evaluate(name, metric, model, data, spec.threshold, metric.resolved(spec.params, settings),
                        context=context, paired=paired, **common).value

    check.__name__ = check.__qualname__ = public
    check.__module__ = metric.body.split(":")[0] if isinstance(metric.body, str) else metric.body.__module__
    check.__signature__ = sig
    check.__doc__ = f"{metric.title or name}: {metric.doc}\n\nKeywords:\n\n" + metric.help(name)
    return check


def _context(normalize, logits, embedding, data_keys, time_limit) -> RunContext:
    """A library call's context: the one in force, with the call's own keywords laid over it."""
    now = ambient()
    interface = ModelInterface(now.interface.normalize if normalize is None else normalize,
                               now.interface.logits if logits is None else logits,
                               now.interface.embedding if embedding is None else embedding)
    return now.replace(interface=interface, data_keys=data_keys, time_limit=time_limit)


def evaluate(name: str, metric: Metric, model, data, threshold, params: dict, *, context: RunContext, confidence,
             budget=None, seed, batch_size, device, paired: tuple | None = None) -> Evaluation:
    """Evaluate one check under ``context``: ``params`` are every parameter's value
    (``Metric.resolved``). With ``paired`` = (reference model, margin) it is the check's paired form
    (``procedures.paired``): the candidate ``model`` against the reference on common random numbers,
    gated "its drop (or increase) <= margin"."""
    missing = [k for k, v in params.items() if v is REQUIRED]
    if missing:
        raise ArgumentError(f"{name}(...) needs {', '.join(k + '=' for k in missing)}; " + metric.help(name))
    if threshold is not None:
        threshold = metric.threshold(metric.call_threshold(), threshold)
    body = _checked_body(name, metric, params)
    perturbation = _perturbation(metric, params)
    if "perturbation" in params:
        params = {**params, "perturbation": perturbation}
    if metric.budget is None:
        budget = None
    elif metric.budget_per and budget is not None:
        budget = validation.positive_int("budget", budget) * len(params[metric.budget_per])
    shape = dict(confidence=confidence, budget=budget, seed=seed, batch_size=batch_size, device=device,
                 perturbation=perturbation, declaration=metric, context=context)
    with captured_warnings(context.warning_site) as caught:  # re-issued at the user's site, also when it raises
        if paired is None:
            with Run(name, model, data, threshold=threshold, **shape) as run:
                value = _called(body, run, params, name)
                result = _summary(name, value, run)
        else:
            value = result = checked_result(name, _paired(name, metric, body, (model, data, params), paired, shape))
    if robust_messages(caught, []):
        result.details["warnings"] = robust_messages(caught, result.details.get("warnings", []))
    return Evaluation(result, value)


def _summary(name: str, value, run: Run) -> Result:
    """The Result of a body's ``value``: the value itself, or an analysis object's ``to_result``."""
    to_result = getattr(value, "to_result", None)
    return checked_result(name, value if to_result is None else to_result(run.args.confidence))


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


def _called(body, run: Run, params: dict, name: str):
    """``body(run, **params)``; a budget that ran out before an estimate is a budget usage error."""
    try:
        return body(run, **params)
    except BudgetError as err:
        raise SettingError("budget", run.args.budget, f"enough for {name} to reach an estimate: {err}") from None


def _paired(name: str, metric: Metric, body, check: tuple, paired: tuple, shape: dict) -> Result:
    """The paired form of the check (``procedures.paired``): both models run with the same seed,
    so they see the same inputs, perturbations and noise."""
    (model, data, params), (reference, margin) = check, paired  # validated by Metric.pairing
    with Run(name, model, data, **shape) as run, Run(name, reference, data, role=REFERENCE, **shape) as ref:
        if metric.paired == "bernoulli":
            return paired_procedures.bernoulli(run, ref, run.perturbation, margin)
        candidate, baseline = (_summary(name, _called(body, r, params, name), r) for r in (run, ref))
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
