"""The session's results: ``ResultCollector`` gathers every check's result from the test reports
(local, from xdist workers, or on torchrun's rank 0) and, once per session, writes the report
directory, the metric-level JUnit XML and the baseline, compares with a stored baseline, and
prints the summary table. The pytest hooks that register it live in ``plugin.py``.

The family-wise adjustment (``--robust-familywise``) is ``familywise.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from pytest_robust.cancel import cause
from pytest_robust.errors import RobustError
from pytest_robust.familywise import family_size, familywise_method, gate_confidence, holm_adjust
from pytest_robust.recording import SETTINGS, SPECS, attach, record_unrun
from pytest_robust.report import store, suggest
from pytest_robust.report.environment import environment
from pytest_robust.report.files import md_text, write_atomic
from pytest_robust.report.inputs import per_input_csv, without_pixels
from pytest_robust.report.junit import metric_junit
from pytest_robust.report.lock import RunLock
from pytest_robust.report.markdown import summary_markdown
from pytest_robust.report.plots import planned_plots
from pytest_robust.report.terminal import familywise_lines, familywise_text, summary_lines
from pytest_robust.settings.validation import open_unit


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


def familywise_markdown(family: dict) -> str:
    """The family-wise section of summary.md: the family, the adjustment and what it changed."""
    head, *rest = map(md_text, familywise_text(family))
    return "\n".join(["## Family-wise error", "", head] + ([""] + [f"- {line}" for line in rest] if rest else []))


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
        self.familywise = familywise_method(config)
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
        """Under holm: count the family and gate every declared check at its family level (the
        session's confidence, confidence= on markers, each YAML check's settings)."""
        if self.familywise != "holm":
            return
        settings = self.declared = self.config.stash[SETTINGS]
        alpha, k = 1.0 - settings.confidence, family_size(session.items)
        self.collected = k
        source = "--robust-familywise holm"

        def gated(confidence) -> float:
            return gate_confidence(open_unit("confidence", confidence), alpha, k)

        self.config.stash[SETTINGS] = settings.replace({"confidence": gated(settings.confidence)}, source)
        for item in session.items:
            for spec in item.stash.get(SPECS, []):
                if spec.overrides.get("confidence") is not None:
                    spec.overrides["confidence"] = gated(spec.overrides["confidence"])
            check = getattr(item, "check", None)  # a YAML suite check carries its resolved settings
            if check is not None and dataclasses.is_dataclass(check) and hasattr(check, "settings"):
                item.check = dataclasses.replace(
                    check, settings=check.settings.replace({"confidence": gated(check.settings.confidence)}, source))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item):
        """Remember the test under way; it stays remembered when an interrupt ends it."""
        self.running = item
        result = yield
        self.running = None
        return result

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
        """SIGTERM or Ctrl-C: each robust test under way (here, or on an xdist worker) is reported as
        a failure whose checks are "interrupted" (the one that was running, and those that had not
        started), so that every report shows where the run stopped; finished tests keep their results."""
        what = cause(excinfo.value)
        message = f"interrupted by {what}: the run stopped during this test"
        reports = []
        if self.running is not None:  # a test without robust checks is left to pytest
            item = self.running
            record_unrun(item, "interrupted",
                         f"the run was interrupted by {what} during its test, before this check ran")
            report = pytest.TestReport(nodeid=item.nodeid, location=item.location, keywords={}, outcome="failed",
                                       longrepr=message, when="call", sections=[], user_properties=item.user_properties)
            attach(item, report, "interrupted")
            reports += [report] if hasattr(report, "robust_results") else []
        for nodeid, checks in self.under_way.items():
            reports.append(pytest.TestReport(nodeid=nodeid, location=(nodeid.split("::")[0], None, nodeid),
                                             keywords={}, outcome="failed", longrepr=message, when="call", sections=[]))
            reason = f"the run was interrupted by {what} while its test ran on an xdist worker"
            reports[-1].robust_results = [dict(r, verdict="interrupted", details={**r["details"], "error": reason},
                                               outcome="interrupted") for r in checks]
        self.under_way.clear()
        self._log_failures(reports)

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
        settings = self.declared or self.config.stash[SETTINGS]
        stamped = [r["details"].get("familywise", {}).get("collected") for r in self.results]
        collected = max([c for c in stamped if isinstance(c, int)] + [self.collected or 0])
        alpha = float(f"{1.0 - settings.confidence:.12g}")  # 0.05, not 0.050000000000000044
        self.family = holm_adjust(self.results, alpha, collected, settings.inconclusive)
        self.lines += familywise_lines(self.family)
        if settings.inconclusive == "fail" and any(
                r["was"] == "pass" and r["outcome"] in ("passed", "xpassed") for r in self.family["retracted"]):
            self.lines.append("  --robust-familywise holm: failing the run (a test passed on a verdict that the "
                              "family-wise adjustment does not confirm)")
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
        writers = [
            ("report", settings.report, lambda: self._write_report(Path(settings.report), env)),
            ("metric-level JUnit", options.robust_junitxml,
             lambda: self._write_junit(Path(options.robust_junitxml), env)),
            ("baseline", options.robust_save and not interrupted, lambda: self._save_baseline(env)),
        ]
        for what, wanted, write in writers:  # each on its own: one that fails does not stop the others
            if not wanted:
                continue
            try:
                write()
            except (OSError, RobustError) as err:
                self.lines.append(f"robust {what} could not be written: {err}")
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def _save_baseline(self, env: dict) -> None:
        options = self.config.option
        path = store.save(Path(options.robust_baselines), options.robust_save, self.results, env)
        self.lines.append(f"robust baseline saved: {path}")

    def _write_junit(self, path: Path, env: dict) -> None:
        write_atomic(path, metric_junit(self.results, env, self.family))
        self.lines.append(f"robust metric-level JUnit: {path}")

    def _compare(self, session: pytest.Session, env: dict) -> None:
        options = self.config.option
        try:
            baseline = store.load(Path(options.robust_baselines), options.robust_compare or None, env)
        except store.BaselineError as err:
            if options.robust_compare_fail:
                self.lines.append(f"robust baseline comparison failed (--robust-compare-fail): {err}")
                session.exitstatus = pytest.ExitCode.USAGE_ERROR
            else:
                self.lines.append(f"robust baseline comparison skipped: {err}")
            return
        self.baseline = {k: baseline.get(k) for k in ("name", "commit", "saved", "format")}
        self.comparison = store.compare(baseline["results"], self.results)
        regressed = [c for c in self.comparison if c["status"] == "regressed"]
        self.lines.append(
            f"robust baseline {baseline['name']!r} (commit {baseline['commit'][:12] or 'unknown'}, "
            f"saved {baseline['saved']}): {store.counts(self.comparison)}")
        self.lines += [f"  REGRESSED {c['key']}: {c['baseline']} -> {c['current']}" for c in regressed]
        if regressed and options.robust_compare_fail:
            self.lines.append(
                "  --robust-compare-fail: failing the run (bounds of the two runs do not overlap; "
                "see docs/reports-and-baselines.md, 'Baselines'); "
                "each regression is a failed testcase in pytest's reports"
            )
            self._log_failures(self._regression_reports(regressed))
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

    def _regression_reports(self, regressed: list[dict]) -> list[pytest.TestReport]:
        """One failed test report per regressed check, ``<test id>::robust-regression[<metric>::
        <perturbation>]``, its message the two runs' numbers: pytest's JUnit file, its terminal
        counts and its short summary show it as a failure."""
        name, reports = self.baseline["name"], []
        by_key = dict(zip(store.keys(self.results), self.results))
        for row in regressed:
            key, result = row["key"], by_key[row["key"]]
            test_id = result["test_id"] or "programmatic"
            message = (f"{result['details'].get('title') or result['metric']} regressed against baseline {name!r}: "
                       f"{row['baseline']} -> {row['current']} under {result['perturbation']} (the two runs' bounds "
                       "do not overlap; --robust-compare-fail)")
            nodeid = f"{test_id}::robust-regression[{key[len(test_id) + 2:]}]"
            reports.append(pytest.TestReport(
                nodeid=nodeid, location=(test_id.split("::")[0], None, nodeid.split("::", 1)[-1]), keywords={},
                outcome="failed", longrepr=message, when="call", sections=[], duration=0.0,
                user_properties=[("robust.comparison", "regressed"), ("robust.baseline", name)]))
        return reports

    def _write_report(self, directory: Path, env: dict) -> None:
        """results.json (listing every file of the run, ``files``), summary.md, per_input.csv and the
        plots; then the files that the previous run in this directory listed and this one did not
        write are removed, so that the directory holds one run's files, never two runs' mixed."""
        settings = self.declared or self.config.stash[SETTINGS]
        previous, note = store.previous_files(directory / "results.json")
        try:
            plots = planned_plots(self.results)
        except RuntimeError as err:
            plots = []
            self.lines.append(f"robust report: no plots ({err})")
        csv = self.config.option.robust_per_input == "csv"
        suggesting = ["suggested_thresholds.md"] if self.config.option.robust_suggest else []
        files = ["results.json", "summary.md"] + (["per_input.csv"] if csv else []) + suggesting + [n for n, _ in plots]
        results = [without_pixels(r) for r in self.results]
        if self.baseline is not None:  # each check's comparison: its status and the baseline's numbers
            rows = {c["key"]: c for c in self.comparison}
            results = [dict(r, comparison={"baseline": self.baseline["name"], "status": rows[key]["status"],
                                           "baseline_numbers": rows[key]["baseline_numbers"]})
                       for r, key in zip(results, store.keys(self.results))]
        payload = {"format": store.FORMAT, "environment": env, "settings": settings.__dict__, "results": results,
                   "files": files}
        if self.baseline is not None:
            payload["baseline"], payload["comparison"] = self.baseline, self.comparison
        if self.family is not None:
            payload["familywise"] = self.family
        write_atomic(directory / "results.json", json.dumps(payload, indent=2, default=str))
        summary = summary_markdown(self.results, env, self.comparison, self.baseline)
        if self.family is not None:
            summary = summary.rstrip("\n") + "\n\n" + familywise_markdown(self.family) + "\n"
        write_atomic(directory / "summary.md", summary)
        if csv:
            write_atomic(directory / "per_input.csv", per_input_csv(self.results))
        if suggesting:
            write_atomic(directory / "suggested_thresholds.md", suggest.markdown(self.results))
        for name, render in plots:
            render(directory / name)
        self.lines += [f"robust report: {directory / name}" for name in files]
        stale = [name for name in previous if name not in files and (directory / name).is_file()]
        for name in stale:
            (directory / name).unlink()
        if stale:
            self.lines.append(f"robust report: removed {len(stale)} file(s) of the previous run in {directory}, which "
                              f"this run did not write: {', '.join(stale)}")
        if note:
            self.lines.append(f"robust report: {note}")

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
