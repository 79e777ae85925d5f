"""The session's results: ``ResultCollector`` gathers every check's result from the test reports
(local, from xdist workers, or on torchrun's rank 0) and, once per session, writes the report
directory, the metric-level JUnit XML and the baseline, compares with a stored baseline, and
prints the summary table. The pytest hooks that register it live in ``plugin.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .recording import SETTINGS
from .report import store
from .report.environment import environment
from .report.inputs import per_input_csv, without_pixels
from .report.junit import metric_junit
from .report.markdown import summary_markdown
from .report.plots import write_plots
from .report.terminal import summary_lines


def _wait_for_ranks() -> None:
    """Under torchrun, a collective every rank joins at the end of the session."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from . import collective

        collective.barrier()


class ResultCollector:
    """Gathers results from test reports (local or from xdist workers). On the controller (and
    rank 0 under torchrun) it writes the report files, saves/compares baselines and prints the
    summary, each once."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: list[dict] = []
        self.lines: list[str] = []
        self.comparison: list[dict] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.results.extend(getattr(report, "robust_results", None) or [])

    def _writes(self) -> bool:
        """Only the xdist controller and torchrun's rank 0 write files."""
        return not hasattr(self.config, "workerinput") and os.environ.get("RANK", "0") == "0"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        try:
            if self._writes() and self.results:
                self._finish(session)
        finally:  # under torchrun no rank leaves before rank 0 has written its files
            _wait_for_ranks()

    def _finish(self, session: pytest.Session) -> None:
        env = environment(self.config.rootpath)
        self.config.hook.pytest_robust_environment(env=env)
        options, settings = self.config.option, self.config.stash[SETTINGS]
        if options.robust_compare is not None or options.robust_compare_fail:
            self._compare(session, env)
        writers = [
            ("report", settings.report, lambda: self._write_report(Path(settings.report), env)),
            ("metric-level JUnit", options.robust_junitxml, lambda: self._write_junit(Path(options.robust_junitxml), env)),
            ("baseline", options.robust_save, lambda: self._save_baseline(env)),
        ]
        for what, wanted, write in writers:  # each on its own: one that fails does not stop the others
            if not wanted:
                continue
            try:
                write()
            except OSError as err:
                self.lines.append(f"robust {what} could not be written: {err}")
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def _save_baseline(self, env: dict) -> None:
        options = self.config.option
        path = store.save(Path(options.robust_baselines), options.robust_save, self.results, env)
        self.lines.append(f"robust baseline saved: {path}")

    def _write_junit(self, path: Path, env: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(metric_junit(self.results, env))
        self.lines.append(f"robust metric-level JUnit: {path}")

    def _compare(self, session: pytest.Session, env: dict) -> None:
        options = self.config.option
        try:
            baseline = store.load(Path(options.robust_baselines), options.robust_compare or None, env)
        except FileNotFoundError as err:
            if options.robust_compare_fail:
                self.lines.append(f"robust baseline comparison failed (--robust-compare-fail): {err}")
                session.exitstatus = pytest.ExitCode.USAGE_ERROR
            else:
                self.lines.append(f"robust baseline comparison skipped: {err}")
            return
        self.comparison = store.compare(baseline["results"], self.results)
        regressed = [c for c in self.comparison if c["status"] == "regressed"]
        self.lines.append(
            f"robust baseline {baseline['name']!r} (commit {baseline['commit'][:12] or 'unknown'}, "
            f"saved {baseline['saved']}): {len(regressed)} regressed, "
            f"{sum(c['status'] == 'improved' for c in self.comparison)} improved, "
            f"{sum(c['status'] == 'unchanged' for c in self.comparison)} unchanged"
        )
        self.lines += [f"  REGRESSED {c['key']}: {c['baseline']} -> {c['current']}" for c in regressed]
        if regressed and options.robust_compare_fail:
            self.lines.append(
                "  --robust-compare-fail: failing the run (bounds of the two runs do not overlap; "
                "see README, 'Baselines')"
            )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _write_report(self, directory: Path, env: dict) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        settings = self.config.stash[SETTINGS]
        payload = {"environment": env, "settings": settings.__dict__,
                   "results": [without_pixels(r) for r in self.results]}
        (directory / "results.json").write_text(json.dumps(payload, indent=2, default=str))
        (directory / "summary.md").write_text(summary_markdown(self.results, env, self.comparison))
        written = [directory / "results.json", directory / "summary.md"]
        if self.config.option.robust_per_input == "csv":
            (directory / "per_input.csv").write_text(per_input_csv(self.results))
            written.append(directory / "per_input.csv")
        try:
            written += write_plots(self.results, directory)
        except RuntimeError as err:
            self.lines.append(f"robust report: no plots ({err})")
        self.lines += [f"robust report: {p}" for p in written]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self._writes():  # torchrun: rank 0 alone prints the table and the report lines
            return
        if self.results:
            terminalreporter.section("robustness checks")
            for line in summary_lines(self.results, terminalreporter._tw.fullwidth):
                terminalreporter.write_line(line)
        for line in self.lines:
            terminalreporter.write_line(line)
