"""Running checks inside pytest and recording their results: shared by the plugin's hooks, the
``robust`` fixture and YAML-suite items, so that neither imports the other.

Every result is recorded on its test item (JUnit properties plus a JSON-able list that rides on
the test report to the controller), and a check that does not pass fails its test (or skips it,
for an inconclusive check with ``inconclusive = skip``). A check that cannot run, or raises, is
recorded too, as an "error" result with its message, and the test's other checks still run: no
result is lost. Only the ``RobustError`` family (what the user must fix) becomes a plain failure
message; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from pytest_robust.cancel import cause
from pytest_robust.checks import spec as checks
from pytest_robust.checks.registry import CheckSpec
from pytest_robust.errors import RobustError, SettingError
from pytest_robust.report.progress import Progress
from pytest_robust.results import Result
from pytest_robust.settings.keys import Settings

#: Session settings, and per item: its declared checks (robust markers, or a YAML suite's check),
#: the result dicts recorded on it (the report hook moves them onto the test reports), and the ids
#: of the declared checks that have a recorded result (numbers or an error).
SETTINGS = pytest.StashKey[Settings]()
#: The settings given on the command line (validated, unset keys left out): they beat a suite's settings.
COMMAND_LINE = pytest.StashKey[dict]()
SPECS = pytest.StashKey[list]()
ITEM_RESULTS = pytest.StashKey[list]()
RECORDED = pytest.StashKey[set]()
#: The registered metrics (``metrics``), with how many hook implementations declared them.
REGISTRY = pytest.StashKey[tuple]()


def metrics(config: pytest.Config) -> dict:
    """Every registered metric (``build_registry``): built once at configure, and again only when a
    conftest.py loaded later (in a sub-directory, at collection) declares metrics of its own."""
    declared_by = len(config.pluginmanager.hook.pytest_robust_metrics.get_hookimpls())
    if config.stash.get(REGISTRY, (None, -1))[1] != declared_by:
        build_registry(config)
    return config.stash[REGISTRY][0]


def build_registry(config: pytest.Config) -> dict:
    """The registry: the built-in metrics and those of plugins and conftest.py files loaded so far
    (``pytest_robust_metrics`` hook), in registration order, kept in the config's stash. A name
    registered twice or a value that is not a ``Metric`` is a usage error."""
    found: dict = {}
    implementations = config.pluginmanager.hook.pytest_robust_metrics.get_hookimpls()
    try:
        for impl in reversed(implementations):  # pluggy lists the last registered first
            checks.register(found, impl.function(), impl.plugin_name)
    except SettingError as err:
        raise pytest.UsageError(f"pytest-robust: {err}") from None
    config.stash[REGISTRY] = (found, len(implementations))
    return found


def checks_and_analyses(config: pytest.Config) -> dict:
    """Everything a fixture call may name: the registered metrics (``metrics``), then the analyses
    (``checks.ANALYSES``: q_curve, certify, predict, pa_report)."""
    from pytest_robust.checks import ANALYSES

    return {**metrics(config), **ANALYSES}


def record(item: pytest.Item, result: Result, spec: CheckSpec | None = None) -> Result:
    """Attach ``result`` (of ``spec``, if it is one of the item's declared checks) to ``item``:
    JUnit properties now, the test report at the end of the phase."""
    result.test_id = item.nodeid
    item.stash.setdefault(ITEM_RESULTS, []).append(result.to_dict())
    item.user_properties.extend(result.properties())
    if spec is not None:
        item.stash.setdefault(RECORDED, set()).add(id(spec))
    return result


def not_run(item: pytest.Item, spec: CheckSpec, verdict: str, reason: str, model: str = "",
            settings: Settings | None = None) -> Result:
    """Record ``spec`` as not run (``verdict`` "error" or "skipped", with ``reason``), with its
    settings when they were resolved."""
    return record(item, checks.not_run(spec, checks_and_analyses(item.config), verdict, reason, model, settings), spec)


def record_unrun(item: pytest.Item, verdict: str, reason: str) -> None:
    """Record every declared check of ``item`` that has no result yet as ``verdict`` ("error",
    "skipped" or "interrupted") with ``reason``: a test that failed, was skipped or was interrupted
    before its checks ran."""
    done = item.stash.get(RECORDED, set())
    for spec in item.stash.get(SPECS, []):
        if id(spec) not in done:
            not_run(item, spec, verdict, reason)


def attach(item: pytest.Item, report: pytest.TestReport, outcome: str) -> None:
    """Move the results recorded on ``item`` onto ``report`` (``robust_results``, each with its test
    id and pytest's ``outcome`` for the test), where the session's collector finds them, also when
    the report comes from an xdist worker."""
    if item.stash.get(ITEM_RESULTS, None):
        report.robust_results = [dict(r, test_id=item.nodeid, outcome=outcome) for r in item.stash[ITEM_RESULTS]]
        item.stash[ITEM_RESULTS] = []


def interrupted_reports(running: pytest.Item | None, under_way: dict[str, list[dict]], what: str) -> list:
    """The failed reports of a run that ``what`` (SIGTERM, Ctrl-C) interrupted: the robust test this
    process was ``running`` (its check under way and those that had not started are "interrupted";
    a test without robust checks is left to pytest), and each test ``under_way`` on an xdist worker
    (node id -> its declared checks, ``declared``), so that every report shows where the run stopped."""
    message = f"interrupted by {what}: the run stopped during this test"
    reports = []
    if running is not None:
        record_unrun(running, "interrupted",
                     f"the run was interrupted by {what} during its test, before this check ran")
        report = pytest.TestReport(nodeid=running.nodeid, location=running.location, keywords={}, outcome="failed",
                                   longrepr=message, when="call", sections=[], user_properties=running.user_properties)
        attach(running, report, "interrupted")
        reports += [report] if hasattr(report, "robust_results") else []
    reason = f"the run was interrupted by {what} while its test ran on an xdist worker"
    for nodeid, unfinished in under_way.items():
        reports.append(pytest.TestReport(nodeid=nodeid, location=(nodeid.split("::")[0], None, nodeid),
                                         keywords={}, outcome="failed", longrepr=message, when="call", sections=[]))
        reports[-1].robust_results = [dict(r, verdict="interrupted", details={**r["details"], "error": reason},
                                           outcome="interrupted") for r in unfinished]
    return reports


def declared(item: pytest.Item) -> list[dict] | None:
    """The checks ``item`` declares (markers, a YAML check) as "error" results without numbers, or
    one such result for a test that only calls the ``robust`` fixture; None for a test with no
    robust check. An xdist worker sends them on the setup report, so that the controller can
    report the checks of a test whose worker crashed (``session.ResultCollector``)."""
    specs = item.stash.get(SPECS, [])
    if not specs and "robust" not in getattr(item, "fixturenames", ()):
        return None
    if not specs:
        return [dict(Result.not_run("robust", None, ">=", "", "error", "").to_dict(), test_id=item.nodeid)]
    return [dict(checks.not_run(spec, metrics(item.config), "error", "").to_dict(), test_id=item.nodeid)
            for spec in specs]


def settings_for(base: Settings, overrides: dict, source: str) -> Settings:
    try:
        return base.replace(overrides, source)
    except SettingError as err:
        raise pytest.UsageError(f"pytest-robust: {err}") from None


def run_spec(item: pytest.Item, spec: CheckSpec, model, data, settings: Settings, model_name: str,
             spelling: str = "marker"):
    """Evaluate one spec with resolved settings and record its result under ``model_name``; returns
    what the library call would (the Result, or an analysis' per-input object). The check runs under
    the context of its settings (``context.RunContext.from_settings``), with the test's progress line
    and warning site. Under ``--robust-suggest`` a check with a threshold runs as an estimate and its
    result carries the suggested threshold (``report.suggest``) in ``details["suggestion"]``, written
    as ``spelling`` ("marker": a marker or a YAML check, "call": a fixture call) declares it; a paired
    gate runs as declared.

    If the check raises, an "error" result with the message is recorded instead: a ``RobustError``
    (model, data or argument problem) fails the test with its message, not a traceback from inside
    the engine; anything else is a bug and is re-raised with its traceback."""
    from pytest_robust.engine.context import RunContext
    from pytest_robust.engine.device import resolve_device
    from pytest_robust.report.suggest import suggestion

    registered = checks_and_analyses(item.config)
    suggesting = (bool(item.config.getoption("robust_suggest", False)) and spec.paired is None
                  and registered[spec.metric].gate)
    ran = dataclasses.replace(spec, threshold=None) if suggesting else spec
    context = RunContext.from_settings(settings, _progress(item), (str(item.path), item.location[1] + 1))
    started = time.monotonic()
    try:
        result, value = checks.run(ran, registered, model, data, settings, resolve_device(settings.device), context)
        if suggesting and result.estimate is not None:
            result.details["suggestion"] = suggestion(result, *_paste(item, spec, registered[spec.metric], spelling))
    except RobustError as err:
        not_run(item, spec, "error", str(err), model_name, settings)
        pytest.fail(f"robust check could not run: {err}", pytrace=False)
    except KeyboardInterrupt as err:  # SIGTERM (cancel.Terminated) or Ctrl-C: the session reports it
        reason = (f"the run was interrupted by {cause(err)} while this check ran, after "
                  f"{time.monotonic() - started:.1f} s; the checks that finished are in the reports")
        not_run(item, spec, "interrupted", reason, model_name, settings)
        raise
    except Exception as err:
        not_run(item, spec, "error", f"{type(err).__name__}: {err}", model_name, settings)
        raise
    result.model = model_name
    record(item, result, spec)
    return value


def _paste(item: pytest.Item, spec: CheckSpec, metric, spelling: str) -> tuple[str, str]:
    """How the threshold of ``spec`` is written where it was declared: (key, separator) of a YAML
    check ("tsrm", ": "), a marker ("tsrm", "=") or a fixture call ("threshold", "=")."""
    if spelling == "call":
        return "threshold", "="
    return metric.threshold_key or spec.metric, ": " if getattr(item, "check", None) is not None else "="


def _progress(item: pytest.Item):
    """A throttled progress printer through pytest's terminal reporter (None without one, as
    under pytest-xdist's workers); it writes past output capturing, so it shows without -s."""
    terminal = item.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None:
        return None
    return Progress(terminal, item.nodeid.rsplit("/", 1)[-1], item.config.pluginmanager.get_plugin("capturemanager"))


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
