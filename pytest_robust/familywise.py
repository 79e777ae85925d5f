"""The family-wise error of a session's checks (``--robust-familywise holm``): the policy that
``session.ResultCollector`` applies (the step-down itself is ``stats.familywise``). Each check's
verdict has error probability at most alpha = 1 - confidence on its own, so k checks can give up
to k alpha false fails (or false passes). With holm the family is the session's checks with a threshold:

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

import pytest

from pytest_robust.errors import SettingError
from pytest_robust.recording import SETTINGS, SPECS
from pytest_robust.report.terminal import familywise_lines
from pytest_robust.settings.keys import Settings
from pytest_robust.settings.validation import choice, open_unit
from pytest_robust.stats.familywise import holm, level

#: The methods of ``--robust-familywise`` (ini ``robust_familywise``).
FAMILYWISE = ("none", "holm")


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


def gate_family(config: pytest.Config, items: list[pytest.Item]) -> tuple[Settings, int]:
    """After collection, under holm: count the family (``family_size``) and gate every declared
    check at its family level (``gate_confidence``): the session's confidence, ``confidence=`` on
    markers and each YAML check's settings. Returns the session's settings as declared (before the
    gating) and the family's size."""
    declared = config.stash[SETTINGS]
    alpha, k = 1.0 - declared.confidence, family_size(items)
    source = "--robust-familywise holm"

    def gated(confidence) -> float:
        return gate_confidence(open_unit("confidence", confidence), alpha, k)

    config.stash[SETTINGS] = declared.replace({"confidence": gated(declared.confidence)}, source)
    for item in items:
        for spec in item.stash.get(SPECS, []):
            if spec.overrides.get("confidence") is not None:
                spec.overrides["confidence"] = gated(spec.overrides["confidence"])
        check = getattr(item, "check", None)  # a YAML suite check carries its resolved settings
        if check is not None and dataclasses.is_dataclass(check) and hasattr(check, "settings"):
            item.check = dataclasses.replace(
                check, settings=check.settings.replace({"confidence": gated(check.settings.confidence)}, source))
    return declared, k


def adjust(results: list[dict], declared: Settings, collected: int) -> tuple[dict, list[str], bool]:
    """Holm's step-down over the session's family at the end (``holm_adjust``), before any report
    is written: (the family's summary, the terminal's lines, whether the run must fail: a test
    passed on a verdict the adjustment does not confirm, under ``inconclusive = fail``).
    ``collected`` is the family known at collection on this process; the results carry the size
    their own process knew (xdist workers), and the largest counts."""
    stamped = [r["details"].get("familywise", {}).get("collected") for r in results]
    collected = max([c for c in stamped if isinstance(c, int)] + [collected])
    alpha = float(f"{1.0 - declared.confidence:.12g}")  # 0.05, not 0.050000000000000044
    family = holm_adjust(results, alpha, collected, declared.inconclusive)
    lines = familywise_lines(family)
    fails = declared.inconclusive == "fail" and any(
        r["was"] == "pass" and r["outcome"] in ("passed", "xpassed") for r in family["retracted"])
    if fails:
        lines.append("  --robust-familywise holm: failing the run (a test passed on a verdict that the family-wise "
                     "adjustment does not confirm)")
    return family, lines, fails


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
    claims = [_claims(r) for r in members]
    steps = {side: holm([c[side] for c, _ in claims], alpha, family) for side in ("fail", "pass")}
    summary = {"method": "holm", "alpha": alpha, "family": family, "collected": collected,
               "members": len(members), "gate_level": alpha / max(collected, 1), "inconclusive": inconclusive,
               "confirmed": {"fail": 0, "pass": 0}, "retracted": [], "allowed": []}
    for i, (r, claim) in enumerate(zip(members, claims)):
        r["details"]["familywise"] = _judge(r, claim, {side: steps[side][i] for side in steps}, steps, summary)
    return summary


def _judge(r: dict, claim: tuple[dict, str], held: dict, steps: dict, summary: dict) -> dict:
    """Holm's word on one member ``r`` of the family (``holm_adjust``): its note, with the verdict
    retracted (made "inconclusive", with the reason) when Holm does not confirm it, and the summary's
    counts of confirmed, retracted and allowed claims updated."""
    (p, source), alpha, family, collected = claim, summary["alpha"], summary["family"], summary["collected"]
    holm_says = next((side for side in ("fail", "pass") if held[side] is not None), None)
    own_level = 1.0 - r["confidence"] if r["estimate"] is not None else None
    note = {"method": "holm", "member": True, "alpha": alpha, "family": family, "collected": collected,
            "gate_level": own_level, "p_fail": p["fail"], "p_pass": p["pass"], "p_source": source,
            "holm_step_fail": held["fail"], "holm_step_pass": held["pass"], "holm": holm_says,
            "holm_level": None if holm_says is None else level(alpha, family, held[holm_says])}
    verdict = r["verdict"]
    if verdict in ("pass", "fail") and held[verdict] is None:
        done = sum(s is not None for s in steps[verdict])
        r["details"]["inconclusive_reason"] = (
            f"Holm's step-down over the family of {family} checks with a threshold at alpha={alpha:g} does "
            f"not confirm this {verdict}: it confirms {done} {verdict} claim(s) and stops at the level "
            f"{level(alpha, family, done + 1):.3g}, above which lies this check's p-value "
            f"{p[verdict]:.3g}. Its test was gated at {own_level:.3g} while it ran, a level the family does "
            f"not support: the family is larger than the {collected} checks known at collection "
            "(robust.<metric>(..., threshold=...) calls count only when they run), or the check ran at a "
            "confidence= of its own; declare the checks as markers or YAML suite checks so that the family "
            "is known up front")
        note.update(retracted=verdict, verdict_before=verdict)
        r["verdict"] = "inconclusive"
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
    return note
