"""The session's results: ``ResultCollector`` gathers every check's result from the test reports
(local, from xdist workers, or on torchrun's rank 0) and, once per session, writes the report
directory, the metric-level JUnit XML and the baseline, compares with a stored baseline, and
prints the summary table. The pytest hooks that register it live in ``plugin.py``.

Family-wise error (``--robust-familywise holm``). Each check's verdict has error probability at
most alpha = 1 - confidence on its own, so k checks can give up to k alpha false fails (or false
passes). With holm the family is the session's checks with a threshold:

1. after collection, its size k is counted (``family_size``: every declared check with a threshold,
   markers and YAML suite checks, of tests not marked skip), and every check is gated, while its
   test runs, at the level alpha / k (its confidence becomes 1 - alpha / k; a check whose own
   confidence is stricter keeps its own level, divided by k). A gate that decides at alpha / k is
   a rejection Holm's step-down makes whatever the other checks show, so the test's outcome can
   be decided when the test runs;
2. at the end (``holm_adjust``), Holm's step-down at alpha runs over the family's p-values (each
   check's ``details["p_values"]``, from its own test), once for the "fail" claims and once for the
   "pass" claims: every verdict a test acted on is confirmed, and a check that stayed undecided at
   alpha / k but that Holm rejects is reported as such (``details["familywise"]["holm"]``: Holm
   allows that claim; its test could not know it in time). A family that grew while the tests ran
   (``robust.<metric>(..., threshold=...)`` calls are counted only when they run) can leave a
   verdict unconfirmed: it becomes "inconclusive" in every report, with the reason, and a test
   that passed on such a verdict fails the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from .errors import SettingError
from .recording import SETTINGS, SPECS
from .report import store
from .report.environment import environment
from .report.inputs import per_input_csv, without_pixels
from .report.junit import metric_junit
from .report.markdown import summary_markdown
from .report.plots import write_plots
from .report.terminal import familywise_lines, familywise_text, summary_lines
from .stats.familywise import holm, level
from .validation import choice, open_unit

#: The methods of ``--robust-familywise`` (ini ``robust_familywise``).
FAMILYWISE = ("none", "holm")


def _wait_for_ranks() -> None:
    """Under torchrun, a collective every rank joins at the end of the session."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from . import collective

        collective.barrier()


def familywise_method(config: pytest.Config) -> str:
    """``--robust-familywise`` (else ini ``robust_familywise``, else "none"), validated."""
    value = config.getoption("robust_familywise", None) or config.getini("robust_familywise") or "none"
    try:
        return choice(*FAMILYWISE)("--robust-familywise (ini robust_familywise)", value)
    except SettingError as err:
        raise pytest.UsageError(f"pytest-robust: {err}") from None


def family_size(items: list[pytest.Item]) -> int:
    """The checks of the family known after collection: every declared check (robust marker, YAML
    suite check) with a threshold (or a paired margin) of a collected test not marked skip."""
    return sum(1 for item in items if item.get_closest_marker("skip") is None
               for spec in item.stash.get(SPECS, [])
               if spec.threshold is not None or getattr(spec, "paired", None))


def gate_confidence(confidence: float, alpha: float, collected: int) -> float:
    """The confidence a check runs at under Holm with ``collected`` checks known up front: 1 -
    min(its own alpha, the family's alpha) / k (module docstring)."""
    return 1.0 - min(1.0 - confidence, alpha) / max(collected, 1)


def _claims(result: dict) -> tuple[dict, str]:
    """({"fail": p, "pass": p}, where they come from) of a family member: its own test's p-values
    (``details["p_values"]``); for a check that reports none, its verdict at its level: p = 1 -
    confidence for the claim it made (a valid p-value: it is wrong with at most that probability)
    and 1 for the other; a check without numbers claims nothing (1, 1)."""
    own = result["details"].get("p_values")
    if isinstance(own, dict) and {"fail", "pass"} <= set(own):
        return {"fail": float(own["fail"]), "pass": float(own["pass"])}, "its own test"
    made = 1.0 - result["confidence"] if result["estimate"] is not None else 1.0
    return ({side: made if result["verdict"] == side else 1.0 for side in ("fail", "pass")},
            "its verdict at its level (the check reports no p-values)")


def holm_adjust(results: list[dict], alpha: float, collected: int, inconclusive: str = "fail") -> dict:
    """Holm's step-down at ``alpha`` over the family of ``results`` (module docstring), in place:
    every member (a result with a threshold whose test was not skipped before it ran, and not
    recorded with ``enforce=False``: its verdict gates nothing) gets ``details["familywise"]``; a pass
    or fail that Holm does not confirm becomes "inconclusive" with the reason. Returns the
    family's summary: method, alpha, family size (the larger of ``collected`` and the members),
    the level each test was gated at, Holm's decisions and the verdicts it changed or would allow."""
    members = [r for r in results if r.get("threshold") is not None and r["verdict"] != "skipped"
               and r["details"].get("enforced", True) is not False]
    for r in results:
        if r.get("threshold") is not None and not any(r is m for m in members):
            r["details"]["familywise"] = {"method": "holm", "member": False, "why": (
                "recorded with enforce=False: its verdict gates nothing" if r["verdict"] != "skipped"
                else "its test was skipped before it ran")}
    family = max(collected, len(members))
    gate_level = alpha / max(collected, 1)
    claims = [_claims(r) for r in members]
    steps = {side: holm([c[side] for c, _ in claims], alpha, family) for side in ("fail", "pass")}
    summary = {"method": "holm", "alpha": alpha, "family": family, "collected": collected,
               "members": len(members), "gate_level": gate_level, "inconclusive": inconclusive,
               "confirmed": {"fail": 0, "pass": 0}, "retracted": [], "allowed": []}
    for i, (r, (p, source)) in enumerate(zip(members, claims)):
        held = {side: steps[side][i] for side in ("fail", "pass")}
        holm_says = next((side for side in ("fail", "pass") if held[side] is not None), None)
        own_level = 1.0 - r["confidence"] if r["estimate"] is not None else None
        note = {"method": "holm", "member": True, "alpha": alpha, "family": family, "collected": collected,
                "gate_level": own_level, "p_fail": p["fail"], "p_pass": p["pass"], "p_source": source,
                "holm_step_fail": held["fail"], "holm_step_pass": held["pass"], "holm": holm_says,
                "holm_level": None if holm_says is None else level(alpha, family, held[holm_says])}
        verdict = r["verdict"]
        if verdict in ("pass", "fail") and held[verdict] is None:
            done = sum(s is not None for s in steps[verdict])
            reason = (f"Holm's step-down over the family of {family} checks with a threshold at alpha={alpha:g} does "
                      f"not confirm this {verdict}: it confirms {done} {verdict} claim(s) and stops at the level "
                      f"{level(alpha, family, done + 1):.3g}, above which lies this check's p-value "
                      f"{p[verdict]:.3g}. Its test was gated at {own_level:.3g} while it ran, a level the family does "
                      f"not support: the family is larger than the {collected} checks known at collection "
                      "(robust.<metric>(..., threshold=...) calls count only when they run), or the check ran at a "
                      "confidence= of its own; declare the checks as markers or YAML suite checks so that the family "
                      "is known up front")
            note.update(retracted=verdict, verdict_before=verdict)
            r["verdict"] = "inconclusive"
            r["details"]["inconclusive_reason"] = reason
            summary["retracted"].append({"test_id": r.get("test_id", ""), "metric": r["metric"], "was": verdict,
                                         "outcome": r.get("outcome", ""), "p": p[verdict]})
        elif verdict in ("pass", "fail"):
            summary["confirmed"][verdict] += 1
        elif holm_says is not None:
            note["allowed"] = (f"Holm's step-down allows a {holm_says} (p = {p[holm_says]:.3g} <= "
                               f"{note['holm_level']:.3g} at step {held[holm_says]}), which the test's gate at "
                               f"{own_level:.3g} could not know while the test ran: reported, not enforced")
            summary["allowed"].append({"test_id": r.get("test_id", ""), "metric": r["metric"], "claim": holm_says,
                                       "p": p[holm_says]})
        r["details"]["familywise"] = note
    return summary


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
