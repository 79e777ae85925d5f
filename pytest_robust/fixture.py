"""Running checks inside pytest: the ``robust`` fixture, result recording and verdict enforcement.

Shared by marker checks, programmatic checks and YAML-suite items: every result is recorded on
its test item (JUnit properties plus a JSON-able list that rides on the test report to the
controller), and a check that does not pass fails its test (or skips it, for an inconclusive
check with ``inconclusive = skip``).
"""

from __future__ import annotations

import pytest

from . import checks
from .checks import CheckSpec
from .report.progress import Progress
from .results import Result
from .settings import Settings
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


def run_spec(item: pytest.Item, spec: CheckSpec, model, data, settings: Settings, model_name: str) -> Result:
    """Evaluate one spec and record its result under ``model_name``; a model, data or argument
    problem fails the test with its message (not a traceback from inside the engine)."""
    from .engine import RobustDataError, RobustModelError, progress_sink, resolve_device

    try:
        with progress_sink(_progress(item)):
            result = checks.run(spec, model, data, settings, resolve_device(settings.device))
    except (RobustDataError, RobustModelError, SettingError, TypeError, ValueError) as err:
        pytest.fail(f"robust check could not run: {err}", pytrace=False)
    result.model = model_name
    return record(item, result)


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

    def _measure(self, metric: str, model, data, threshold, params: dict, overrides: dict) -> Result:
        spec = CheckSpec(metric, threshold, params, overrides)
        settings = settings_for(self.settings, overrides, f"argument of robust.{metric}")
        return run_spec(self._request.node, spec, model, data, settings, type(model).__name__)

    def tsrm(self, model, data, perturbation, threshold: float | None = None, **overrides) -> Result:
        """TSRM accuracy of ``model`` on ``data`` under ``perturbation``, gated when ``threshold``
        is given; ``overrides`` are settings (confidence, budget, seed, batch_size, device).
        Returns the Result; assert on ``result.passed`` or ``result.verdict`` yourself."""
        return self._measure("tsrm", model, data, threshold, {"perturbation": perturbation}, overrides)

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
            settings = settings_for(self.settings, spec.overrides, "on the robust marker")
            model = self._fixture(settings.model, "model")
            data = self._fixture(settings.data, "data")
            runs.append((settings, run_spec(self._request.node, spec, model, data, settings, settings.model)))
        enforce(runs)
        return [r for _, r in runs]
