"""Running checks inside pytest and recording their results: shared by the plugin's hooks, the
``robust`` fixture and YAML-suite items, so that neither imports the other.

Every result is recorded on its test item (JUnit properties plus a JSON-able list that rides on
the test report to the controller), and a check that does not pass fails its test (or skips it,
for an inconclusive check with ``inconclusive = skip``). Only the ``RobustError`` family (what the
user must fix) becomes a plain failure message; any other exception keeps its traceback.
"""

from __future__ import annotations

import pytest

from . import checks
from .checks import CheckSpec
from .errors import RobustError, SettingError
from .report.progress import Progress
from .results import Result
from .settings import Settings

#: Session settings, and per item: its parsed markers and recorded results.
SETTINGS = pytest.StashKey[Settings]()
SPECS = pytest.StashKey[list]()
ITEM_RESULTS = pytest.StashKey[list]()


def metrics(config: pytest.Config) -> dict:
    """Every registered metric: the built-ins and those of plugins and conftest.py files loaded so
    far (``pytest_robust_metrics`` hook), in registration order. A name registered twice or a value
    that is not a ``Metric`` is a usage error."""
    found: dict = {}
    implementations = config.pluginmanager.hook.pytest_robust_metrics.get_hookimpls()
    try:
        for impl in reversed(implementations):  # pluggy lists the last registered first
            checks.register(found, impl.function(), impl.plugin_name)
    except SettingError as err:
        raise pytest.UsageError(f"pytest-robust: {err}") from None
    return found


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
    ``model_name``; a ``RobustError`` (model, data or argument problem) fails the test with its
    message, not a traceback from inside the engine."""
    from .engine import progress_sink

    try:
        with progress_sink(_progress(item)):
            result = call()
    except RobustError as err:
        pytest.fail(f"robust check could not run: {err}", pytrace=False)
    result.model = model_name
    return record(item, result)


def run_spec(item: pytest.Item, spec: CheckSpec, model, data, settings: Settings, model_name: str) -> Result:
    """Evaluate one spec with resolved settings and record its result."""
    from .engine import resolve_device

    registered = metrics(item.config)
    return evaluate(item, lambda: checks.run(spec, registered, model, data, settings, resolve_device(settings.device)),
                    model_name)


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
