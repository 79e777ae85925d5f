"""The ``robust`` fixture: programmatic checks of any registered metric, and explicit marker checks.

Results are recorded by ``recording`` exactly like marker checks, so they reach every report. A
fixture call with a threshold gates the test at its end like a marker (``enforce=False`` opts out).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import pytest

from .checks import CheckSpec, suggest, valid_keywords
from .recording import RECORDED, enforce, evaluate, metrics, not_run, run_spec, settings_for
from .results import Result
from .settings import KEY_NAMES, Settings


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

    def measure(self, metric: str, model, data, threshold: float | None = None, **params) -> Result:
        """Any registered metric (built-in or from a ``pytest_robust_metrics`` hook) through the same
        path as a marker: its parameters and defaults, settings given as keywords, clear errors.
        ``robust.<metric>(model, data, threshold, **params)`` is the same call. With a threshold the
        result gates the test at its end like a marker, unless the call says ``enforce=False``."""
        registered = metrics(self._request.config)
        if metric not in registered:
            pytest.fail(f"robust.measure: no metric {metric!r}{suggest(metric, registered)}; registered: "
                        f"{', '.join(registered)}", pytrace=False)
        _, allowed = registered[metric].keywords(metric)
        unknown = [k for k in params if k not in allowed + KEY_NAMES + ("enforce",)]
        if unknown:
            pytest.fail(f"robust.{metric}(...): unknown keyword(s) "
                        f"{', '.join(k + suggest(k, allowed + KEY_NAMES) for k in unknown)}; "
                        f"{valid_keywords(registered, metric)}, enforce", pytrace=False)
        gate = params.pop("enforce", True)
        settings, params = self._split(params, metric)
        spec = CheckSpec(metric, threshold, params, {})
        result = run_spec(self._request.node, spec, model, data, settings, type(model).__name__)
        if threshold is not None and gate:
            self._gated.append((settings, result))
        return result

    def __getattr__(self, name: str):
        registered = metrics(self._request.config)
        if not name.startswith("_") and name in registered:
            return functools.partial(self.measure, name)
        raise AttributeError(f"the robust fixture has no attribute {name!r}{suggest(name, registered)}; its "
                             f"metrics: {', '.join(registered)}")

    def _library(self, fn, name: str, model, *args, **kwargs) -> Result:
        """A library function that is not a marker metric (certify, pa_report, q_curve)."""
        from .engine import resolve_device

        settings, params = self._split(kwargs, name)
        accepted = inspect.signature(fn).parameters
        common = {k: getattr(settings, k) for k in ("confidence", "budget", "seed", "batch_size")
                  if k in accepted and getattr(settings, k) is not None}

        def call():
            return fn(model, *args, device=resolve_device(settings.device), **common, **params)

        return evaluate(self._request.node, call, type(model).__name__, CheckSpec(name, None, dict(params), {}), settings)

    def tsrm(self, model, data, perturbation, threshold: float | None = None, **kwargs) -> Result:
        """TSRM accuracy of ``model`` on ``data`` under ``perturbation``, gated when ``threshold``
        is given: a check that does not pass fails the test when it ends, like a marker (pass
        ``enforce=False`` to decide yourself from ``result.verdict``). Keyword arguments that are
        settings (confidence, budget, seed, batch_size, device) override this test's settings.
        Returns the Result (recorded in the reports). The same holds for every method below
        that takes a threshold (``max_loss`` for q)."""
        return self.measure("tsrm", model, data, threshold, perturbation=perturbation, **kwargs)

    def corruption_accuracy(self, model, data, threshold: float | None = None, *, corruptions=None, severities=None,
                            **kwargs) -> Result:
        """Mean accuracy over the grid ``corruptions`` x ``severities`` of common corruptions
        (default: the 15 benchmark corruptions x severities 1-5; see
        ``metrics.corruption_accuracy``), gated when ``threshold`` is given; other keywords:
        ``preset`` or settings."""
        params = {k: v for k, v in (("corruptions", corruptions), ("severities", severities)) if v is not None}
        return self.measure("corruption_accuracy", model, data, threshold, **params, **kwargs)

    def q(self, model, data, q: float, max_loss: float | None = None, perturbation=None, **kwargs) -> Result:
        """Mean intermediate-q loss Z_q (see ``metrics.intermediate_q``), gated <= ``max_loss`` when
        given; ``perturbation`` defaults to UniformLinf(eps=<robust_eps>); other keywords are the
        marker's parameters or settings."""
        params = {"q": q, **({"perturbation": perturbation} if perturbation is not None else {}), **kwargs}
        return self.measure("q", model, data, max_loss, **params)

    def q_curve(self, model, data, perturbation, qs=(1, 10, 100, 1000), **kwargs) -> Result:
        """The q-curve (path sampling, Monte Carlo, q = infinity); a PNG in the report directory."""
        from .metrics.intermediate_q import q_curve

        return self._library(q_curve, "q_curve", model, data, perturbation, qs, **kwargs)

    def certified_accuracy(self, model, data, threshold: float | None = None, *, radius: float, sigma: float,
                           **kwargs) -> Result:
        """Certified accuracy of the Gaussian-smoothed ``model`` within L2 ``radius`` (sigma and
        radius in the units of the model's inputs), gated when ``threshold`` is given; other
        keywords: alpha, max_draws, or settings."""
        return self.measure("certified_accuracy", model, data, threshold, radius=radius, sigma=sigma, **kwargs)

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
        return self.measure("nppr", model, data, threshold, **params)

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
                not_run(item, spec, "error", reason, spec.overrides.get("model", ""))
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
