"""Running checks inside pytest: the ``robust`` fixture, result recording and verdict enforcement.

Shared by marker checks, programmatic checks and YAML-suite items: every result is recorded on
its test item (JUnit properties plus a JSON-able list that rides on the test report to the
controller), and a check that does not pass fails its test (or skips it, for an inconclusive
check with ``inconclusive = skip``). A check that cannot run, or raises, is recorded too, as an
"error" result with its message, and the test's other checks still run: no result is lost.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from . import checks
from .checks import CheckSpec
from .report.progress import Progress
from .results import Result
from .settings import KEY_NAMES, Settings
from .validation import SettingError

#: Result dicts recorded on a test item; the report hook moves them onto the test reports.
ITEM_RESULTS = pytest.StashKey[list]()
#: The CheckSpecs a test item declares (its robust markers, or a YAML suite's check).
SPECS = pytest.StashKey[list]()
#: ids of the item's specs that have a recorded result (numbers or an error).
RECORDED = pytest.StashKey[set]()


def record(item: pytest.Item, result: Result, spec: CheckSpec | None = None) -> Result:
    """Attach ``result`` (of ``spec``, if it is one of the item's declared checks) to ``item``:
    JUnit properties now, the test report at the end of the phase."""
    result.test_id = item.nodeid
    item.stash.setdefault(ITEM_RESULTS, []).append(result.to_dict())
    item.user_properties.extend(result.properties())
    if spec is not None:
        item.stash.setdefault(RECORDED, set()).add(id(spec))
    return result


def record_unrun(item: pytest.Item, verdict: str, reason: str) -> None:
    """Record every declared check of ``item`` that has no result yet as ``verdict`` ("error" or
    "skipped") with ``reason``: a test that failed or was skipped before its checks ran."""
    done = item.stash.get(RECORDED, set())
    for spec in item.stash.get(SPECS, []):
        if id(spec) not in done:
            record(item, checks.not_run(spec, verdict, reason), spec)


def settings_for(base: Settings, overrides: dict, source: str) -> Settings:
    try:
        return base.replace(overrides, source)
    except SettingError as err:
        raise pytest.UsageError(f"pytest-robust: {err}") from None


def evaluate(item: pytest.Item, call, model_name: str, spec: CheckSpec) -> Result:
    """Run ``call()`` (returning a Result) with progress reporting and record the result under
    ``model_name``. If it raises, an "error" result with the message is recorded instead: a
    model, data or argument problem fails the test with its message (not a traceback from
    inside the engine); anything else is a bug and is re-raised with its traceback."""
    from .engine import RobustDataError, RobustModelError, progress_sink

    try:
        with progress_sink(_progress(item)):
            result = call()
    except (RobustDataError, RobustModelError, SettingError, TypeError, ValueError) as err:
        record(item, checks.not_run(spec, "error", str(err), model_name), spec)
        pytest.fail(f"robust check could not run: {err}", pytrace=False)
    except Exception as err:
        record(item, checks.not_run(spec, "error", f"{type(err).__name__}: {err}", model_name), spec)
        raise
    result.model = model_name
    return record(item, result, spec)


def run_spec(item: pytest.Item, spec: CheckSpec, model, data, settings: Settings, model_name: str) -> Result:
    """Evaluate one spec with resolved settings and record its result."""
    from .engine import resolve_device

    def call():
        return checks.run(spec, model, data, settings, resolve_device(settings.device))

    return evaluate(item, call, model_name, spec)


def _progress(item: pytest.Item):
    """A throttled progress printer when pytest shows output (-s), else None."""
    terminal = item.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None or item.config.getoption("capture") != "no":
        return None
    return Progress(terminal, item.nodeid.rsplit("/", 1)[-1])


def enforce(runs: list[tuple[Settings, Result]], errors: tuple[str, ...] = ()) -> None:
    """Fail the test if any check could not run (``errors``: their messages), failed, or was
    inconclusive with ``inconclusive = fail``; skip it if the only problems are inconclusive
    checks with ``inconclusive = skip``."""
    undecided = [(s.inconclusive, r.message()) for s, r in runs if r.verdict == "inconclusive"]
    fatal = list(errors) + [r.message() for _, r in runs if r.verdict == "fail"]
    fatal += [m for how, m in undecided if how == "fail"]
    skipped = [m for how, m in undecided if how == "skip"]
    if fatal:
        pytest.fail("\n".join(fatal + skipped), pytrace=False)
    if skipped:
        pytest.skip("\n".join(skipped))


class RobustFixture:
    """The ``robust`` fixture of one test: programmatic checks and its markers' checks."""

    def __init__(self, request: pytest.FixtureRequest, settings: Settings, specs: list[CheckSpec]):
        self._request = request
        self.settings = settings
        self._specs = specs
        self.checked = False
        self._gated: list[tuple[Settings, Result]] = []  # fixture calls with a threshold

    @property
    def device(self):
        """The torch.device this test's checks run on."""
        from .engine import resolve_device

        return resolve_device(self.settings.device)

    def _split(self, kwargs: dict, source: str) -> tuple[Settings, dict]:
        """(settings with the setting keys of ``kwargs`` applied, the remaining parameters)."""
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in KEY_NAMES}
        return settings_for(self.settings, overrides, f"argument of robust.{source}"), kwargs

    def _measure(self, metric: str, model, data, threshold, params: dict) -> Result:
        """A registered metric through the same path as a marker (defaults, settings, errors).
        With a threshold the result gates the test at its end like a marker, unless the call
        says ``enforce=False``."""
        gate = params.pop("enforce", True)
        settings, params = self._split(params, metric)
        spec = CheckSpec(metric, threshold, params, {})
        result = run_spec(self._request.node, spec, model, data, settings, type(model).__name__)
        if threshold is not None and gate:
            self._gated.append((settings, result))
        return result

    def _library(self, fn, name: str, model, *args, **kwargs) -> Result:
        """A library function that is not a marker metric (certify, pa_report, q_curve)."""
        from .engine import resolve_device

        settings, params = self._split(kwargs, name)
        accepted = inspect.signature(fn).parameters
        common = {k: getattr(settings, k) for k in ("confidence", "budget", "seed", "batch_size") if k in accepted}

        def call():
            return fn(model, *args, device=resolve_device(settings.device), **common, **params)

        return evaluate(self._request.node, call, type(model).__name__, CheckSpec(name, None, dict(params), {}))

    def tsrm(self, model, data, perturbation, threshold: float | None = None, **kwargs) -> Result:
        """TSRM accuracy of ``model`` on ``data`` under ``perturbation``, gated when ``threshold``
        is given: a check that does not pass fails the test when it ends, like a marker (pass
        ``enforce=False`` to decide yourself from ``result.verdict``). Keyword arguments that are
        settings (confidence, budget, seed, batch_size, device) override this test's settings.
        Returns the Result (recorded in the reports). The same holds for every method below
        that takes a threshold (``max_loss`` for q)."""
        return self._measure("tsrm", model, data, threshold, {"perturbation": perturbation, **kwargs})

    def q(self, model, data, q: float, max_loss: float | None = None, perturbation=None, **kwargs) -> Result:
        """Mean intermediate-q loss Z_q (see ``metrics.intermediate_q``), gated <= ``max_loss`` when
        given; ``perturbation`` defaults to UniformLinf(eps=<robust_eps>); other keywords are the
        marker's parameters or settings."""
        params = {"q": q, **({"perturbation": perturbation} if perturbation is not None else {}), **kwargs}
        return self._measure("q", model, data, max_loss, params)

    def q_curve(self, model, data, perturbation, qs=(1, 10, 100, 1000), **kwargs) -> Result:
        """The q-curve (path sampling, Monte Carlo, q = infinity); a PNG in the report directory."""
        from .metrics.intermediate_q import q_curve

        return self._library(q_curve, "q_curve", model, data, perturbation, qs, **kwargs)

    def certified_accuracy(self, model, data, threshold: float | None = None, *, radius: float, sigma: float,
                           **kwargs) -> Result:
        """Certified accuracy of the Gaussian-smoothed ``model`` within L2 ``radius`` (sigma and
        radius in the units of the model's inputs), gated when ``threshold`` is given; other
        keywords: alpha, max_draws, or settings."""
        return self._measure("certified_accuracy", model, data, threshold, {"radius": radius, "sigma": sigma, **kwargs})

    def certify(self, model, data, sigma: float, n0: int = 100, n: int = 100_000, alpha: float = 0.001, **kwargs):
        """Cohen's CERTIFY per input (returns the per-input ``Certification``); a summary with the
        certified-accuracy-against-radius curve is recorded in the reports."""
        from .metrics.smoothing import certify

        holder = {}

        def summarised(*args, seed, batch_size, confidence, device):
            holder["certification"] = certify(*args, seed=seed, batch_size=batch_size, device=device)
            return holder["certification"].to_result(confidence)

        self._library(summarised, "certify", model, data, sigma, n0, n, alpha, **kwargs)
        return holder["certification"]

    def pa_report(self, model, data, sigma: float, **kwargs) -> Result:
        """Per-input pA, its survival curve and certified accuracy against radius (and under other
        budgets); verdict "estimate", curves as PNGs in the report directory."""
        from .metrics.smoothing import pa_report

        return self._library(pa_report, "pa_report", model, data, sigma, **kwargs)

    def nppr(self, model, data, eps: float, threshold: float | None = None, **kwargs) -> Result:
        """NPPR (see ``metrics.nppr``): PR under a learned worst-case Gaussian-mixture noise in the
        L-inf ball of radius ``eps``, gated >= ``threshold`` when given; other keywords are the
        marker's parameters (``fit_data=`` as data or a fixture name) or settings."""
        params = {"eps": eps, **kwargs}
        if isinstance(params.get("fit_data"), str):
            params["fit_data"] = self._fixture(params["fit_data"], "fit_data")
        return self._measure("nppr", model, data, threshold, params)

    def _fixture(self, name: str, role: str):
        try:
            return self._request.getfixturevalue(name)
        except pytest.FixtureLookupError:
            where = f"{role}= on the marker" + (f" or robust_{role} in ini" if role in KEY_NAMES else "")
            pytest.fail(
                f"robust check needs the {role}: define a fixture named {name!r} (e.g. in conftest.py), "
                f"or name another one with {where}",
                pytrace=False,
            )

    def check(self) -> list[Result]:
        """Run this test's robust markers now; fail (or skip, if so configured) unless all pass.
        Every marker's check runs even when an earlier one cannot; a test without a robust
        marker has nothing to check, which is an error."""
        if not self._specs:
            pytest.fail(
                "robust.check() runs the test's @pytest.mark.robust(...) checks, but this test has no "
                "robust marker: add one, or call a metric method such as robust.tsrm(...) instead",
                pytrace=False,
            )
        self.checked = True
        runs, errors = self._run_markers()
        enforce(runs, errors)
        return [r for _, r in runs]

    def finish(self) -> None:
        """At the end of the test: run the markers' checks if ``check()`` did not, then fail (or
        skip) the test unless every check with a threshold passed (markers and fixture calls)."""
        runs, errors = ([], ()) if self.checked or not self._specs else self._run_markers()
        self.checked = True
        enforce(runs + self._gated, errors)

    def _run_markers(self) -> tuple[list[tuple[Settings, Result]], tuple[str, ...]]:
        """(settings and result of each marker check that ran, messages of those that could not)."""
        item, runs, errors, bug = self._request.node, [], [], None
        for spec in self._specs:
            try:
                settings = settings_for(self.settings, spec.overrides, "on the robust marker")
                model = self._fixture(settings.model, "model")
                data = self._fixture(settings.data, "data")
                params = dict(spec.params)
                if isinstance(params.get("fit_data"), str):
                    params["fit_data"] = self._fixture(params["fit_data"], "fit_data")
            except (Exception, pytest.fail.Exception) as err:
                failed = isinstance(err, pytest.fail.Exception)  # a missing fixture: its message says so
                reason = err.msg if failed else f"a fixture it needs raised {type(err).__name__}: {err}"
                record(item, checks.not_run(spec, "error", reason, spec.overrides.get("model", "")), spec)
                errors.append(f"robust check could not run: {reason}")
                continue
            try:
                resolved = dataclasses.replace(spec, params=params)
                runs.append((settings, run_spec(item, resolved, model, data, settings, settings.model)))
            except pytest.fail.Exception as err:
                errors.append(err.msg)
            except Exception as err:  # a bug: recorded by evaluate, re-raised after the other checks
                bug = bug or err
        for spec in self._specs:  # results were recorded under the run's spec copy: mark the marker's
            item.stash.setdefault(RECORDED, set()).add(id(spec))
        if bug is not None:
            raise bug
        return runs, tuple(errors)
