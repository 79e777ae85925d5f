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

from pytest_robust.familywise import family_size, familywise_method, gate_confidence, holm_adjust
from pytest_robust.recording import SETTINGS, SPECS
from pytest_robust.report import store
from pytest_robust.report.environment import environment
from pytest_robust.report.inputs import per_input_csv, without_pixels
from pytest_robust.report.junit import metric_junit
from pytest_robust.report.markdown import summary_markdown
from pytest_robust.report.plots import write_plots
from pytest_robust.report.terminal import familywise_lines, familywise_text, summary_lines
from pytest_robust.settings.validation import open_unit


def _wait_for_ranks() -> None:
    """Under torchrun, a collective every rank joins at the end of the session."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from pytest_robust.engine import collective

        collective.barrier()


def familywise_markdown(family: dict) -> str:
    """The family-wise section of summary.md: the family, the adjustment and what it changed."""
    head, *rest = familywise_text(family)
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
        self.comparison: list[dict] = []
        self.familywise = familywise_method(config)
        self.collected: int | None = None  # the family's size known after collection (holm), on this process
        self.declared = config.stash.get(SETTINGS, None)  # the session's settings as given
        self.family: dict | None = None  # Holm's summary, at the end

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

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = getattr(report, "robust_results", None) or []
        if self.collected is not None:  # where the tests ran: the family known at collection travels with them
            for r in found:
                r["details"].setdefault("familywise", {"method": "holm", "collected": self.collected})
        self.results.extend(found)

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

    def _finish(self, session: pytest.Session) -> None:
        if self.familywise == "holm":
            self._adjust(session)
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
        path.write_text(metric_junit(self.results, env, self.family))
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
            + (f", {undecided} cannot tell (bounds too wide to see a small change)"
               if (undecided := sum(c['status'].startswith('cannot tell') for c in self.comparison)) else "")
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
        settings = self.declared or self.config.stash[SETTINGS]
        payload = {"environment": env, "settings": settings.__dict__,
                   "results": [without_pixels(r) for r in self.results]}
        if self.family is not None:
            payload["familywise"] = self.family
        (directory / "results.json").write_text(json.dumps(payload, indent=2, default=str))
        summary = summary_markdown(self.results, env, self.comparison)
        if self.family is not None:
            summary = summary.rstrip("\n") + "\n\n" + familywise_markdown(self.family) + "\n"
        (directory / "summary.md").write_text(summary)
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
