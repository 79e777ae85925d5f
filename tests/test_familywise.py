"""Several checks in one run (``--robust-familywise holm``): the p-value of each claim from the
check's own test, Holm's step-down, the family-wise error rate by simulation, and the family and
the adjustment in every report.

``python tests/test_familywise.py`` prints the simulated family-wise error rates.
"""

from __future__ import annotations

import json
import math
import types
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from test_plugin import CONFTEST
from test_reports import SUITE

from pytest_robust.checks.smoothing.rounds import CERTIFIED, OPEN, REFUTED, GatePlan, GateState
from pytest_robust.checks.smoothing.rounds import p_values as certified_p_values
from pytest_robust.familywise import gate_confidence, holm_adjust
from pytest_robust.results import decide
from pytest_robust.stats import (
    SequentialGate,
    clopper_pearson_lower,
    clopper_pearson_p_values,
    clopper_pearson_upper,
    holm,
    t_sf,
)
from pytest_robust.stats import group_sequential as gs
from pytest_robust.stats.betting import _advance, _Running

ALPHA = 0.05


# -- Holm's step-down ----------------------------------------------------------------------------


def test_holm_steps_down_and_stops_at_the_first_p_value_above_its_level():
    assert holm([0.01, 0.04, 0.03, 0.5], ALPHA) == [1, None, None, None]  # 0.03 > 0.05 / 3
    assert holm([0.001, 0.02, 0.04], ALPHA) == [1, 2, 3]  # 0.001 <= 0.05/3, 0.02 <= 0.05/2, 0.04 <= 0.05
    assert holm([0.001, 0.02, 0.04], ALPHA, family=5) == [1, None, None]  # two more members, p = 1
    assert holm([0.05 / 3 * (1 + 1e-12)], ALPHA, family=3) == [1]  # a level written as 1 - confidence rounds
    with pytest.raises(ValueError, match="smaller than"):
        holm([0.1, 0.2], ALPHA, family=1)


def test_gate_confidence_is_alpha_over_k_or_a_stricter_own_level_over_k():
    assert gate_confidence(0.95, ALPHA, 10) == pytest.approx(1 - 0.005)
    assert gate_confidence(0.99, ALPHA, 10) == pytest.approx(1 - 0.001)  # its own level is stricter
    assert gate_confidence(0.90, ALPHA, 10) == pytest.approx(1 - 0.005)  # never looser than the family's
    assert gate_confidence(0.95, ALPHA, 0) == pytest.approx(0.95)


# -- each check's p-values agree with its own bounds ---------------------------------------------


def test_clopper_pearson_p_values_are_the_levels_at_which_the_bounds_cross():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 400))
        k, m = int(rng.integers(0, n + 1)), float(rng.uniform(0.02, 0.98))
        above, below = clopper_pearson_p_values(k, n, m)
        for alpha in (0.1, 0.05, 0.01, 0.001):
            assert (clopper_pearson_lower(k, n, alpha) >= m) == (above <= alpha)
            assert (clopper_pearson_upper(k, n, alpha) <= m) == (below <= alpha)
    assert clopper_pearson_p_values(10, 10, 0.9) == pytest.approx((0.9**10, 1.0))
    assert clopper_pearson_p_values(0, 10, 0.1) == pytest.approx((1.0, 0.9**10))


def test_exact_tails_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for k, n, m in ((3, 20, 0.3), (17, 20, 0.6), (190, 200, 0.9), (0, 5, 0.5)):
        above, below = clopper_pearson_p_values(k, n, m)
        assert above == pytest.approx(stats.binom.sf(k - 1, n, m), rel=1e-9, abs=1e-14)
        assert below == pytest.approx(stats.binom.cdf(k, n, m), rel=1e-9, abs=1e-14)
    for t, dof in ((-2.0, 5), (0.0, 9), (1.7, 15), (4.0, 63)):
        assert t_sf(t, dof) == pytest.approx(stats.t.sf(t, dof), rel=1e-9)


@pytest.mark.parametrize("horizon", [None, 3000])
def test_gate_p_values_are_one_over_the_largest_capital_and_agree_with_its_decision(horizon):
    rng = np.random.default_rng(1)
    decided = 0
    for _ in range(150):
        threshold, alpha = float(rng.uniform(0.1, 0.9)), float(rng.choice([0.05, 0.01, 0.001]))
        mean = float(np.clip(threshold + rng.normal(0, 0.04), 0, 1))
        gate, x = SequentialGate(threshold, alpha, horizon=horizon), (rng.random(3000) < mean).astype(float)
        for block in np.array_split(x, 5):
            gate.update(block)
        p = gate.p_values()
        for side in ("pass", "fail"):
            assert (p[side] <= alpha) == (gate.decision is not None and gate.decision.verdict == side)
        decided += gate.decision is not None
        if horizon is None:  # the plug-in Kelly process: recompute the largest capital of each side
            used = gate.decision.at if gate.decision else len(x)
            best_pass = max(0.0, _advance(x[:used], threshold, _Running()).max())
            best_fail = max(0.0, _advance(1 - x[:used], 1 - threshold, _Running()).max())
            for side, best in (("pass", best_pass), ("fail", best_fail)):
                if abs(best - math.log(1 / alpha)) > 1e-9:  # away from the level, no rounding to resolve
                    assert p[side] == pytest.approx(min(1.0, math.exp(-best)), rel=1e-12)
    assert 20 < decided < 150  # both decided and undecided gates were exercised


def _estimate(z: np.ndarray, v: np.ndarray, problems=()) -> types.SimpleNamespace:
    return types.SimpleNamespace(per_input=z, between_chain_var=v, arithmetic=None, problems=list(problems))


def test_group_sequential_p_values_agree_with_the_looks_decision():
    rng = np.random.default_rng(2)
    seen = set()
    for i in range(150):
        n_total, n = 64, 64
        z = rng.gamma(2.0, float(rng.uniform(0.2, 0.6)), size=n)
        v = rng.uniform(0, 0.05, size=n)
        arithmetic = (z * 1.02, v * 1.1) if i % 2 else None
        threshold = float(rng.uniform(0.2, 1.4))
        problems = ["unhealthy"] if i % 7 == 0 else []

        def at(m):
            est = _estimate(z[:m], v[:m], problems)
            est.arithmetic = None if arithmetic is None else (arithmetic[0][:m], arithmetic[1][:m])
            return est

        est, (_, lower, upper, _), record = gs.sequential(gs.looks(n, True), at, n_total, threshold, ALPHA)
        verdict = decide(threshold, lower, upper, "<=", not est.problems)
        p = gs.p_values(record)
        assert (p["fail"] <= ALPHA) == (verdict == "fail") and (p["pass"] <= ALPHA) == (verdict == "pass")
        seen.add(verdict)
        assert {type(value) for look in record for value in look.values()} <= {int, float, bool}
    assert seen == {"pass", "fail", "inconclusive"}


def test_an_early_fail_has_the_p_value_of_its_look_over_its_share():
    z = np.full(16, 2.0)
    est = _estimate(z, np.full(16, 0.01))
    _, _, record = gs.sequential([16, 40], lambda n: est, 40, 0.7, ALPHA)
    assert len(record) == 1  # 0.8 > 0.7 after 16 of 40: fail at the first look
    statistic = (z.sum() - 40 * 0.7) / math.sqrt(0.16)
    share = 16 / (16 + 40)
    assert gs.p_values(record)["fail"] == pytest.approx(min(ALPHA, t_sf(statistic, 15) / share))
    assert gs.p_values(record)["pass"] == 1.0  # no pass before the last look


def test_certified_accuracy_p_values_agree_with_its_bounds():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(10, 300))
        codes = rng.choice([CERTIFIED, OPEN, REFUTED], size=n, p=rng.dirichlet([2, 1, 1]))
        zeros = np.zeros(n, np.int64)
        state = GateState(codes.astype(np.int64), zeros, zeros, zeros)
        plan = GatePlan(0.25, 0.84, float(rng.choice([1e-3, 0.01])), 10_000, 1000, 10,
                        float(rng.uniform(0.1, 0.9)), 0.95)
        verdict = decide(plan.threshold, *state.bounds(plan))
        p = certified_p_values(plan, state)
        assert (p["pass"] <= 0.05) == (verdict == "pass") and (p["fail"] <= 0.05) == (verdict == "fail")


@pytest.mark.parametrize("case", ["tsrm_gate", "corruption_accuracy", "q_gate", "certified_accuracy",
                                  "adversarial_accuracy"])
def test_every_built_in_check_states_p_values_that_agree_with_its_verdict(case):
    from numbers_snapshot import _cases

    r = _cases()[case]()
    p, alpha = r.details["p_values"], 1 - r.confidence
    assert set(p) == {"pass", "fail"} and all(0.0 <= v <= 1.0 for v in p.values())
    assert (p["pass"] <= alpha) == (r.verdict == "pass") and (p["fail"] <= alpha) == (r.verdict == "fail")


# -- the family-wise error rate, simulated ---------------------------------------------------------


def simulate_clopper_pearson(k=10, n=200, threshold=0.9, reps=20_000, alpha=ALPHA, seed=0) -> dict:
    """k fixed-sample checks (Clopper-Pearson over n inputs) whose true rate is exactly their
    threshold: the rate of at least one false fail / false pass, each check at alpha on its own
    ("unadjusted") and under Holm at alpha (gated at alpha / k, then the step-down)."""
    table = np.array([clopper_pearson_p_values(x, n, threshold) for x in range(n + 1)])  # (above, below)
    counts = np.random.default_rng(seed).binomial(n, threshold, size=(reps, k))
    out = {}
    for claim, column in (("fail", 1), ("pass", 0)):
        p = table[counts, column]
        holm_any = np.array([any(s is not None for s in holm(list(row), alpha)) for row in p[:2000]])
        out[claim] = {"unadjusted": float((p <= alpha).any(axis=1).mean()),
                      # Holm rejects something exactly when the smallest p-value is <= alpha / k
                      "holm": float((p.min(axis=1) <= alpha / k).mean()),
                      "holm_by_step_down": float(holm_any.mean()), "reps": reps}
    return out


def simulate_gates(k=10, draws=2000, threshold=0.5, reps=300, alpha=ALPHA, seed=1) -> dict:
    """k Bernoulli-stream gates (the anytime-valid betting test) on streams whose mean is exactly
    the threshold: unadjusted (each gate at alpha) and under Holm (each at alpha / k, then Holm's
    step-down on the gates' p-values at alpha)."""
    rng = np.random.default_rng(seed)
    hits = {(how, claim): 0 for how in ("unadjusted", "holm") for claim in ("fail", "pass")}
    for _ in range(reps):
        for how, level in (("unadjusted", alpha), ("holm", alpha / k)):
            p = []
            for _ in range(k):
                gate = SequentialGate(threshold, level)
                gate.update((rng.random(draws) < threshold).astype(float))
                p.append(gate.p_values())
            for claim in ("fail", "pass"):
                values = [q[claim] for q in p]
                rejected = (min(values) <= alpha if how == "unadjusted"
                            else any(s is not None for s in holm(values, alpha)))
                hits[how, claim] += rejected
    return {claim: {how: hits[how, claim] / reps for how in ("unadjusted", "holm")} | {"reps": reps}
            for claim in ("fail", "pass")}


def simulate_group_sequential(k=10, reps=300, alpha=ALPHA, seed=2) -> dict:
    """k q-style checks (looks of 16, 32, 64 inputs from a large population, alpha spent over the
    looks) whose population mean is exactly the threshold (normal per-input values)."""
    rng = np.random.default_rng(seed)
    threshold, population = 5.0, 10**6
    hits = {(how, claim): 0 for how in ("unadjusted", "holm") for claim in ("fail", "pass")}
    for _ in range(reps):
        for how, level in (("unadjusted", alpha), ("holm", alpha / k)):
            p = []
            for _ in range(k):
                z = rng.normal(threshold, 1.0, size=64)
                _, _, record = gs.sequential([16, 32, 64], lambda n: _estimate(z[:n], np.zeros(n)), population,
                                             threshold, level)
                p.append(gs.p_values(record))
            for claim in ("fail", "pass"):
                values = [q[claim] for q in p]
                hits[how, claim] += (min(values) <= alpha if how == "unadjusted"
                                     else any(s is not None for s in holm(values, alpha)))
    return {claim: {how: hits[how, claim] / reps for how in ("unadjusted", "holm")} | {"reps": reps}
            for claim in ("fail", "pass")}


def _within(rate: float, bound: float, reps: int) -> bool:
    """rate <= bound up to 3 Monte Carlo standard errors."""
    return rate <= bound + 3 * math.sqrt(bound * (1 - bound) / reps)


def test_holm_keeps_the_familywise_error_at_alpha_where_ten_unadjusted_checks_reach_k_alpha():
    k = 10
    for claim, rates in simulate_clopper_pearson(k=k).items():
        assert _within(rates["holm"], ALPHA, rates["reps"]), (claim, rates)
        assert rates["holm_by_step_down"] == pytest.approx(rates["holm"], abs=0.02)
        assert rates["unadjusted"] > 4 * ALPHA, (claim, rates)  # about 1 - (1 - 0.04)^10 = 0.34, not 0.05


def test_holm_over_sequential_gates_keeps_the_familywise_error_at_alpha():
    for claim, rates in simulate_gates(reps=150).items():
        assert _within(rates["holm"], ALPHA, rates["reps"]), (claim, rates)
        assert rates["unadjusted"] > 2 * ALPHA, (claim, rates)


def test_holm_over_group_sequential_checks_keeps_the_familywise_error_at_alpha():
    for claim, rates in simulate_group_sequential(reps=100).items():
        assert _within(rates["holm"], ALPHA, rates["reps"]), (claim, rates)
        assert rates["unadjusted"] > 1.5 * ALPHA, (claim, rates)


# -- the adjustment of a session's results -------------------------------------------------------


def _result(verdict, p_fail=None, p_pass=None, confidence=1 - ALPHA / 4, **kw) -> dict:
    details = {"title": "TSRM"}
    if p_fail is not None:
        details["p_values"] = {"fail": p_fail, "pass": p_pass}
    numbers = verdict not in ("error", "skipped")
    return {"metric": "tsrm", "estimate": 0.5 if numbers else None, "threshold": 0.6, "confidence": confidence,
            "verdict": verdict, "details": details, "test_id": kw.pop("test_id", "t::x"), "outcome": "passed", **kw}


def test_holm_confirms_what_the_tests_acted_on_and_reports_what_it_would_also_allow():
    results = [_result("fail", 0.004, 1.0, test_id="t::a"), _result("pass", 1.0, 0.011, test_id="t::b"),
               _result("inconclusive", 0.015, 0.9, test_id="t::c"), _result("error", test_id="t::d"),
               _result("skipped", test_id="t::e")]
    family = holm_adjust(results, ALPHA, collected=4)
    assert family["family"] == 4 and family["members"] == 4
    assert family["confirmed"] == {"fail": 1, "pass": 1} and family["retracted"] == []
    assert [r["verdict"] for r in results] == ["fail", "pass", "inconclusive", "error", "skipped"]
    allowed = results[2]["details"]["familywise"]
    # fails: 0.004 <= 0.05/4, then 0.015 <= 0.05/3: Holm allows c's fail, which its gate at 0.0125 could not make
    assert (allowed["holm"] == "fail" and allowed["holm_step_fail"] == 2
            and "reported, not enforced" in allowed["allowed"])
    assert family["allowed"] == [{"test_id": "t::c", "metric": "tsrm", "claim": "fail", "p": 0.015}]
    assert results[3]["details"]["familywise"]["p_fail"] == 1.0  # a check that could not run claims nothing
    assert results[4]["details"]["familywise"]["member"] is False


def test_a_verdict_without_p_values_counts_at_its_level_and_an_unconfirmed_one_is_retracted():
    # three decided checks gated at alpha / 2 (two known at collection), one more joined while running
    results = [_result("pass", confidence=1 - ALPHA / 2, test_id=f"t::{i}") for i in range(3)]
    family = holm_adjust(results, ALPHA, collected=2)
    assert family["family"] == 3
    assert [r["verdict"] for r in results] == ["inconclusive"] * 3  # 0.025 > 0.05 / 3
    assert "does not confirm this pass" in results[0]["details"]["inconclusive_reason"]
    assert results[0]["details"]["familywise"]["p_source"].startswith("its verdict at its level")
    assert [r["was"] for r in family["retracted"]] == ["pass"] * 3
    fine = [_result("pass", confidence=1 - ALPHA / 3, test_id=f"t::{i}") for i in range(3)]
    assert holm_adjust(fine, ALPHA, collected=3)["retracted"] == []


# -- in a pytest session ---------------------------------------------------------------------------


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_holm_gates_every_check_at_alpha_over_k_and_every_report_states_the_family(suite):
    result = suite.runpytest("--robust-familywise", "holm", "--robust-report", "out", "--robust-junitxml", "m.xml")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "robust: *, familywise=holm",
        "*@98.33%*",
        "family-wise error: Holm's step-down at alpha=0.05 over a family of 3 checks with a threshold (3 known at "
        "collection, each gated at alpha/3 = 0.0167, i.e. confidence 0.9833, while its test ran): 1 fail(s) and "
        "2 pass(es) confirmed, 0 not confirmed, 0 more allowed",
    ])
    payload = json.loads((suite.path / "out" / "results.json").read_text())
    assert payload["settings"]["confidence"] == 0.95  # the session's setting, as given
    assert payload["familywise"]["family"] == 3 and payload["familywise"]["alpha"] == 0.05
    assert [r["verdict"] for r in payload["results"]] == ["pass", "pass", "fail"]
    for r in payload["results"]:
        assert r["confidence"] == pytest.approx(1 - 0.05 / 3)
        own = r["details"]["familywise"]
        assert own["member"] and own["holm"] == r["verdict"] and own["p_source"] == "its own test"
        assert own[f"p_{r['verdict']}"] <= 0.05 / 3 * (1 + 1e-9)
    assert "## Family-wise error" in (suite.path / "out" / "summary.md").read_text()
    (testsuite,) = ET.parse(suite.path / "m.xml").getroot().iter("testsuite")
    props = {p.get("name"): p.get("value") for p in testsuite.iter("property")}
    assert props["robust.familywise"].startswith("holm: step-down over a family of 3 checks")


def test_without_the_option_nothing_changes(suite):
    suite.runpytest("--robust-report", "out").assert_outcomes(passed=2, failed=1)
    payload = json.loads((suite.path / "out" / "results.json").read_text())
    assert "familywise" not in payload
    assert all(r["confidence"] == 0.95 and "familywise" not in r["details"] for r in payload["results"])
    assert all(set(r["details"]["p_values"]) == {"pass", "fail"} for r in payload["results"])


def test_ini_holm_and_a_stricter_marker_confidence(suite):
    suite.makeini("[pytest]\nrobust_familywise = holm\n")
    suite.makepyfile(test_strict="""
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.5, perturbation=UniformLinf(eps=0.5), confidence=0.999)
def test_own_level():
    pass
""")
    suite.runpytest("--robust-report", "out").assert_outcomes(passed=3, failed=1)
    results = json.loads((suite.path / "out" / "results.json").read_text())["results"]
    levels = {r["test_id"].split("::")[1]: round(1 - r["confidence"], 9) for r in results}
    assert levels == {"test_own_level": round(0.001 / 4, 9), "test_wide": 0.0125, "test_narrower": 0.0125,
                      "test_too_strict": 0.0125}


def test_holm_gates_yaml_suite_checks_too(pytester):
    from test_suites import BASIC, FACTORIES, REGISTER

    pytester.makeconftest(REGISTER)
    pytester.makepyfile(factories=FACTORIES)
    pytester.makefile(".yaml", robust_toy=BASIC)
    pytester.runpytest("--robust-familywise", "holm", "--robust-report", "out").assert_outcomes(passed=1, failed=1)
    payload = json.loads((pytester.path / "out" / "results.json").read_text())
    assert payload["familywise"]["collected"] == 2
    assert [r["confidence"] for r in payload["results"]] == pytest.approx([1 - 0.05 / 2] * 2)


def test_a_bad_method_is_a_usage_error(suite):
    suite.makeini("[pytest]\nrobust_familywise = bonferroni\n")
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*robust_familywise*bonferroni*none or holm*"])


def test_a_family_that_grows_while_the_tests_run_retracts_what_holm_does_not_confirm(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_grows="""
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5))
def test_wide():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.4))
def test_narrower():
    pass

def test_fixture_call(robust, robust_model, robust_data):
    robust.tsrm(robust_model, robust_data, perturbation=UniformLinf(eps=0.3), threshold=0.7)
""")
    result = pytester.runpytest("--robust-familywise", "holm", "--robust-report", "out")
    result.assert_outcomes(passed=3)  # each test passed at alpha/2, the level known when it ran
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "family-wise error: *family of 3 checks*(2 known at collection*",
        "  not confirmed, now inconclusive: test_grows.py::test_wide tsrm pass (p = *)",
        "*--robust-familywise holm: failing the run*",
    ])
    results = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    retracted = [r for r in results if r["details"]["familywise"].get("retracted")]
    assert retracted and all(r["verdict"] == "inconclusive" for r in retracted)
    assert "does not confirm this pass" in retracted[0]["details"]["inconclusive_reason"]


def test_holm_under_xdist_counts_the_family_on_the_workers(suite):
    pytest.importorskip("xdist")
    result = suite.runpytest_subprocess("-n", "2", "--robust-familywise", "holm", "--robust-report", "out")
    result.assert_outcomes(passed=2, failed=1)
    payload = json.loads((suite.path / "out" / "results.json").read_text())
    assert payload["familywise"]["collected"] == 3 and payload["familywise"]["retracted"] == []
    assert all(r["confidence"] == pytest.approx(1 - 0.05 / 3) for r in payload["results"])


if __name__ == "__main__":
    print(f"family-wise error rates at alpha={ALPHA}: the rate of at least one false claim among k checks whose "
          "true value is exactly their threshold")
    for name, rates in (("Clopper-Pearson, k=10, n=200, threshold 0.9", simulate_clopper_pearson()),
                        ("betting gates, k=10, 2000 draws, threshold 0.5", simulate_gates()),
                        ("group-sequential t, k=10, looks 16/32/64", simulate_group_sequential())):
        for claim, r in rates.items():
            print(f"  {name}: false {claim}: unadjusted {r['unadjusted']:.3f}, holm {r['holm']:.3f} "
                  f"({r['reps']} runs)")
