"""The session's results: ``ResultCollector`` gathers every check's result from the test reports
(local, from xdist workers, or on torchrun's rank 0), keeps track of the tests under way (crashes,
interrupts), and once per session hands them to the modules that act on them: the family-wise
adjustment (``familywise``: gating at collection, Holm at the end), the baselines (``report.store``:
saving, comparing, the regression testcases), the report directory (``report.directory``), the
metric-level JUnit XML (``report.junit``) and the summary table (``report.terminal``). The pytest
hooks that register it live in ``plugin.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_robust import familywise
from pytest_robust.cancel import cause
from pytest_robust.errors import RobustError
from pytest_robust.files import write_atomic
from pytest_robust.recording import SETTINGS, interrupted_reports
from pytest_robust.report import directory, store, suggest
from pytest_robust.report.environment import environment
from pytest_robust.report.junit import metric_junit
from pytest_robust.report.lock import RunLock
from pytest_robust.report.terminal import summary_lines


def _wait_for_ranks() -> None:
    """Under torchrun, a collective every rank joins at the end of the session."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from pytest_robust.engine import collective

        collective.barrier()


def uses_baselines(options) -> bool:
    """Whether the run saves or compares a baseline."""
    return bool(options.robust_save) or options.robust_compare is not None or options.robust_compare_fail


def run_environment(config: pytest.Config) -> dict:
    """The run's environment facts (``report.environment``, amended by ``pytest_robust_environment``
    hooks). When the run saves or compares a baseline, torch is imported first: the accelerators it
    sees key the baselines (``environment.baseline_key``), before the checks as after them."""
    if uses_baselines(config.option):
        import torch  # noqa: F401

    env = environment(config.rootpath)
    config.hook.pytest_robust_environment(env=env)
    return env


class ResultCollector:
    """Gathers results from test reports (local or from xdist workers). On the controller (and
    rank 0 under torchrun) it writes the report files, saves/compares baselines and prints the
    summary, each once; with ``--robust-familywise holm`` it also gates the session's checks at
    their family level and applies Holm's step-down to the reports (module docstring)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: list[dict] = []
        self.lines: list[str] = []
        self.comparison: list[dict] = []  # store.compare's rows, when the run compared with a baseline
        self.baseline: dict | None = None  # that baseline's name, commit, time and format
        self.familywise = familywise.familywise_method(config)
        self.collected: int | None = None  # the family's size known after collection (holm), on this process
        self.declared = config.stash.get(SETTINGS, None)  # the session's settings as given
        self.family: dict | None = None  # Holm's summary, at the end
        self.lock: RunLock | None = None  # the report directory, held for the session (report.lock)
        self.running: pytest.Item | None = None  # the test this process is running
        self.under_way: dict[str, list[dict]] = {}  # xdist controller: declared checks of the tests under way

    def claim_report_directory(self) -> None:
        """Hold the report directory (``--robust-report``) until the session ends, where this process
        writes it; a directory another run holds is a usage error, before any check runs."""
        report = self.config.stash[SETTINGS].report
        if not (report and self._writes()):
            return
        lock = RunLock(Path(report))
        try:
            lock.acquire()
        except RobustError as err:
            raise pytest.UsageError(f"pytest-robust: {err}") from None
        self.lock = lock

    def pytest_unconfigure(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Under holm: count the family and gate every declared check at its family level
        (``familywise.gate_family``)."""
        if self.familywise == "holm":
            self.declared, self.collected = familywise.gate_family(self.config, session.items)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item):
        """Remember the test under way; it stays remembered when an interrupt ends it."""
        self.running = item
        result = yield
        self.running = None
        return result

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
        """SIGTERM or Ctrl-C: each robust test under way is reported as interrupted
        (``recording.interrupted_reports``); finished tests keep their results."""
        self._log_failures(interrupted_reports(self.running, self.under_way, cause(excinfo.value)))
        self.under_way.clear()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = getattr(report, "robust_results", None) or self._crashed(report)
        if self.collected is not None:  # where the tests ran: the family known at collection travels with them
            for r in found:
                r["details"].setdefault("familywise", {"method": "holm", "collected": self.collected})
        self.results.extend(found)

    def _crashed(self, report: pytest.TestReport) -> list[dict]:
        """On the xdist controller: the declared checks of a test whose worker crashed, as errors
        that name the crash ([] for any other report). Workers send each test's declared checks on
        its setup report (``recording.declared``); its teardown report ends the wait."""
        if report.when == "setup" and getattr(report, "robust_declared", None) is not None:
            self.under_way[report.nodeid] = report.robust_declared
        elif report.when == "teardown":
            self.under_way.pop(report.nodeid, None)
        elif report.when not in ("setup", "call") and report.failed and report.nodeid in self.under_way:
            crash = f"{report.longrepr}: its process ended before the check finished (a crash in native code, " \
                    "os._exit, or the out-of-memory killer); the worker's other tests ran on"
            return [dict(r, details={**r["details"], "error": crash}, outcome="failed")
                    for r in self.under_way.pop(report.nodeid)]
        return []

    def _writes(self) -> bool:
        """Only the xdist controller and torchrun's rank 0 write files."""
        return not hasattr(self.config, "workerinput") and os.environ.get("RANK", "0") == "0"

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session):
        """Before pytest's own reports: compare with the baseline (a regression under
        --robust-compare-fail becomes a failed testcase, ``_regression_reports``). After them: the
        family-wise adjustment and the files. An interrupted run keeps pytest's exit code 2."""
        interrupted = session.exitstatus == pytest.ExitCode.INTERRUPTED
        writes = self._writes() and bool(self.results)
        try:
            env = run_environment(self.config) if writes else {}
            options = self.config.option
            if writes and (options.robust_compare is not None or options.robust_compare_fail):
                self._compare(session, env)
            yield
            if writes:
                self._finish(session, env, interrupted)
        finally:
            if interrupted:
                session.exitstatus = pytest.ExitCode.INTERRUPTED
            _wait_for_ranks()  # under torchrun no rank leaves before rank 0 has written its files

    def _adjust(self, session: pytest.Session) -> None:
        """Holm's step-down over the session's family, before any report is written."""
        self.family, lines, fails = familywise.adjust(self.results, self.declared or self.config.stash[SETTINGS],
                                                      self.collected or 0)
        self.lines += lines
        if fails:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _finish(self, session: pytest.Session, env: dict, interrupted: bool) -> None:
        """The family-wise adjustment, then every file; an interrupted run saves no baseline (its
        partial results would replace a whole one)."""
        if self.familywise == "holm":
            self._adjust(session)
        options, settings = self.config.option, self.config.stash[SETTINGS]
        if interrupted and options.robust_save:
            self.lines.append(f"robust baseline {options.robust_save!r} not saved: the run was interrupted, and its "
                              "partial results would replace a whole baseline")
        junit, baselines = Path(options.robust_junitxml or "."), Path(options.robust_baselines)
        writers = [
            ("report", settings.report, lambda: self._write_report(Path(settings.report), env)),
            ("metric-level JUnit", options.robust_junitxml, lambda: [
                f"robust metric-level JUnit: {write_atomic(junit, metric_junit(self.results, env, self.family))}"]),
            ("baseline", options.robust_save and not interrupted, lambda: [
                f"robust baseline saved: {store.save(baselines, options.robust_save, self.results, env)}"]),
        ]
        for what, wanted, write in writers:  # each on its own: one that fails does not stop the others
            if not wanted:
                continue
            try:
                self.lines += write()
            except (OSError, RobustError) as err:
                self.lines.append(f"robust {what} could not be written: {err}")
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def _compare(self, session: pytest.Session, env: dict) -> None:
        """Compare with the stored baseline (``report.store``); under --robust-compare-fail a
        regression fails the run and is a failed testcase of its own in pytest's reports."""
        options = self.config.option
        try:
            baseline = store.load(Path(options.robust_baselines), options.robust_compare or None, env)
        except store.BaselineError as err:
            failing = "failed (--robust-compare-fail)" if options.robust_compare_fail else "skipped"
            self.lines.append(f"robust baseline comparison {failing}: {err}")
            if options.robust_compare_fail:
                session.exitstatus = pytest.ExitCode.USAGE_ERROR
            return
        self.baseline = {k: baseline.get(k) for k in ("name", "commit", "saved", "format")}
        self.comparison = store.compare(baseline["results"], self.results)
        self.lines += store.summary_lines(baseline, self.comparison, options.robust_compare_fail)
        cases = store.regressions(self.results, self.comparison, baseline["name"])
        if cases and options.robust_compare_fail:
            self._log_failures([pytest.TestReport(
                nodeid=c["nodeid"], location=c["location"], keywords={}, outcome="failed", longrepr=c["message"],
                when="call", sections=[], duration=0.0,
                user_properties=[("robust.comparison", "regressed"), ("robust.baseline", baseline["name"])])
                for c in cases])
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _log_failures(self, reports: list[pytest.TestReport]) -> None:
        """Hand failed reports made after the tests to pytest's reporters (its JUnit file among them)
        and to the terminal's counts and short summary (not to its progress line, which is over)."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        log = self.config.pluginmanager.subset_hook_caller("pytest_runtest_logreport",
                                                           remove_plugins=[terminal] if terminal else [])
        for report in reports:
            log(report=report)
            if terminal is not None:
                terminal.stats.setdefault("failed", []).append(report)

    def _write_report(self, folder: Path, env: dict) -> list[str]:
        settings = self.declared or self.config.stash[SETTINGS]
        run = directory.Run(self.results, env, settings.__dict__, self.comparison, self.baseline, self.family)
        return directory.write_directory(folder, run, csv=self.config.option.robust_per_input == "csv",
                                                suggesting=bool(self.config.option.robust_suggest))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self._writes():  # torchrun: rank 0 alone prints the table and the report lines
            return
        if self.results:
            terminalreporter.section("robustness checks")
            for line in summary_lines(self.results, terminalreporter._tw.fullwidth):
                terminalreporter.write_line(line)
            if self.config.option.robust_suggest:
                terminalreporter.section("suggested thresholds (--robust-suggest)")
                for line in suggest.lines(self.results):
                    terminalreporter.write_line(line)
        for line in self.lines:
            terminalreporter.write_line(line)
