"""Running checks inside pytest: the ``robust`` fixture, result recording and verdict enforcement.

Shared by marker checks, programmatic checks and YAML-suite items: every result is recorded on
its test item (JUnit properties plus a JSON-able list that rides on the test report to the
controller), and a check that does not pass fails its test (or skips it, for an inconclusive
check with ``inconclusive = skip``).
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

#: Result dicts recorded on a test item; the report hook copies them onto the test report.
ITEM_RESULTS = pytest.StashKey[list]()


def record(item: pytest.Item, result: Result) -> Result:
    """Attach ``result`` to ``item``: JUnit properties now, the report at the end of the call."""
    result.test_id = item.nodeid
    item.stash.setdefault(ITEM_RESULTS, []).append(result.to_dict())
    item.user_properties.extend(result.properties())
    return result


def settings_for(base: Settings, overrides: dict, source: str) -> Settings:
    try:
        return base.replace(overrides, source)
    except SettingError as err:
        raise pytest.UsageError(f"pytest-robust: {err}") from None


def evaluate(item: pytest.Item, call, model_name: str) -> Result:
    """Run ``call()`` (returning a Result) with progress reporting and record the result under
    ``model_name``; a model, data or argument problem fails the test with its message (not a
    traceback from inside the engine)."""
    from .engine import RobustDataError, RobustModelError, progress_sink

    try:
        with progress_sink(_progress(item)):
            result = call()
    except (RobustDataError, RobustModelError, SettingError, TypeError, ValueError) as err:
        pytest.fail(f"robust check could not run: {err}", pytrace=False)
    result.model = model_name
    return record(item, result)


def run_spec(item: pytest.Item, spec: CheckSpec, model, data, settings: Settings, model_name: str) -> Result:
    """Evaluate one spec with resolved settings and record its result."""
    from .engine import resolve_device

    return evaluate(item, lambda: checks.run(spec, model, data, settings, resolve_device(settings.device)), model_name)


def _progress(item: pytest.Item):
    """A throttled progress printer when pytest shows output (-s), else None."""
    terminal = item.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None or item.config.getoption("capture") != "no":
        return None
    return Progress(terminal, item.nodeid.rsplit("/", 1)[-1])


def enforce(runs: list[tuple[Settings, Result]]) -> None:
    """Fail the test if any check failed or was inconclusive with ``inconclusive = fail``; skip it
    if the only problems are inconclusive checks with ``inconclusive = skip``."""
    undecided = [(s.inconclusive, r.message()) for s, r in runs if r.verdict == "inconclusive"]
    fatal = [r.message() for _, r in runs if r.verdict == "fail"] + [m for how, m in undecided if how == "fail"]
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
        """A registered metric through the same path as a marker (defaults, settings, errors)."""
        settings, params = self._split(params, metric)
        spec = CheckSpec(metric, threshold, params, {})
        return run_spec(self._request.node, spec, model, data, settings, type(model).__name__)

    def _library(self, fn, name: str, model, *args, **kwargs) -> Result:
        """A library function that is not a marker metric (certify, pa_report, q_curve)."""
        from .engine import resolve_device

        settings, params = self._split(kwargs, name)
        accepted = inspect.signature(fn).parameters
        common = {k: getattr(settings, k) for k in ("confidence", "budget", "seed", "batch_size") if k in accepted}

        def call():
            return fn(model, *args, device=resolve_device(settings.device), **common, **params)

        return evaluate(self._request.node, call, type(model).__name__)

    def tsrm(self, model, data, perturbation, threshold: float | None = None, **kwargs) -> Result:
        """TSRM accuracy of ``model`` on ``data`` under ``perturbation``, gated when ``threshold``
        is given. Keyword arguments that are settings (confidence, budget, seed, batch_size,
        device) override this test's settings. Returns the Result (recorded in the reports);
        assert on ``result.passed`` or ``result.verdict`` yourself."""
        return self._measure("tsrm", model, data, threshold, {"perturbation": perturbation, **kwargs})

    def corruption_accuracy(self, model, data, threshold: float | None = None, *, corruptions=None, severities=None,
                            **kwargs) -> Result:
        """Mean accuracy over the grid ``corruptions`` x ``severities`` of common corruptions
        (default: the 15 benchmark corruptions x severities 1-5; see
        ``metrics.corruption_accuracy``), gated when ``threshold`` is given; other keywords:
        ``preset`` or settings."""
        params = {k: v for k, v in (("corruptions", corruptions), ("severities", severities)) if v is not None}
        return self._measure("corruption_accuracy", model, data, threshold, {**params, **kwargs})

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
        """Run this test's robust markers now; fail (or skip, if so configured) unless all pass."""
        self.checked = True
        runs = []
        for spec in self._specs:
            settings = settings_for(self.settings, spec.overrides, "on the robust marker")
            model = self._fixture(settings.model, "model")
            data = self._fixture(settings.data, "data")
            if isinstance(spec.params.get("fit_data"), str):
                fit_data = self._fixture(spec.params["fit_data"], "fit_data")
                spec = dataclasses.replace(spec, params={**spec.params, "fit_data": fit_data})
            runs.append((settings, run_spec(self._request.node, spec, model, data, settings, settings.model)))
        enforce(runs)
        return [r for _, r in runs]
