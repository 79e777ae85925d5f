"""The ``robust`` fixture: run checks from a test body and record their results for the reports."""

from __future__ import annotations

import pytest

from . import checks
from .checks import CheckSpec
from .results import Result
from .settings import Settings
from .validation import SettingError


def _user_errors():
    from .engine import RobustDataError, RobustModelError

    return (RobustDataError, RobustModelError, SettingError, TypeError)


class RobustFixture:
    """Bound to one test: its settings, its marker specs and the list its results are recorded in."""

    def __init__(self, request: pytest.FixtureRequest, settings: Settings, specs: list[CheckSpec], results: list):
        self._request = request
        self.settings = settings
        self._specs = specs
        self._results = results
        self.checked = False

    @property
    def device(self):
        """The torch.device this test's checks run on."""
        from .engine import resolve_device

        return resolve_device(self.settings.device)

    def _record(self, result: Result) -> Result:
        result.test_id = self._request.node.nodeid
        self._results.append(result.to_dict())
        self._request.node.user_properties.extend(result.properties())
        return result

    def _run(self, fn, settings: Settings, *args, **kwargs) -> Result:
        from .engine import resolve_device

        try:
            result = fn(*args, settings=settings, device=resolve_device(settings.device), **kwargs)
        except _user_errors() as err:
            pytest.fail(f"robust check could not run: {err}", pytrace=False)
        return self._record(result)

    def tsrm(self, model, data, perturbation, threshold: float | None = None, **overrides) -> Result:
        """TSRM accuracy of ``model`` on ``data`` under ``perturbation``, gated when ``threshold``
        is given; ``overrides`` are settings (confidence, budget, seed, batch_size, device).
        Returns the Result; assert on ``result.passed`` or ``result.verdict`` yourself."""
        spec = CheckSpec("tsrm", threshold, {"perturbation": perturbation}, overrides)
        settings = self._settings_for(spec, "argument of robust.tsrm")
        return self._run(checks.run, settings, spec, model, data)

    def _settings_for(self, spec: CheckSpec, source: str) -> Settings:
        try:
            return self.settings.replace(spec.overrides, source)
        except SettingError as err:
            raise pytest.UsageError(f"pytest-robust: {err}") from None

    def _fixture(self, name: str, role: str):
        try:
            return self._request.getfixturevalue(name)
        except pytest.FixtureLookupError:
            pytest.fail(
                f"robust check needs the {role}: define a fixture named {name!r} (e.g. in conftest.py), "
                f"or name another one with {role}= on the marker or robust_{role} in ini",
                pytrace=False,
            )

    def check(self) -> list[Result]:
        """Run this test's robust markers now; fail (or skip, if so configured) unless all pass."""
        self.checked = True
        runs = []
        for spec in self._specs:
            settings = self._settings_for(spec, "on the robust marker")
            model = self._fixture(settings.model, "model")
            data = self._fixture(settings.data, "data")
            runs.append((settings, self._run(checks.run, settings, spec, model, data)))
        undecided = [(s.inconclusive, r.message()) for s, r in runs if r.verdict == "inconclusive"]
        fatal = [r.message() for _, r in runs if r.verdict == "fail"] + [m for how, m in undecided if how == "fail"]
        skipped = [m for how, m in undecided if how == "skip"]
        if fatal:
            pytest.fail("\n".join(fatal + skipped), pytrace=False)
        if skipped:
            pytest.skip("\n".join(skipped))
        return [r for _, r in runs]
