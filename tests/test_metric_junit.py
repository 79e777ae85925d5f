"""The metric-level JUnit file (``--robust-junitxml``): a check recorded with ``enforce=False`` is
never a failure there, and one model is one suite whether a marker or a fixture call checked it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from test_plugin import CONFTEST

from pytest_robust.report.junit import case_name, metric_junit
from pytest_robust.results import Result

CHECKS = """
import pytest
from pytest_robust import UniformLinf

BALL = UniformLinf(eps=0.5)

def test_look_only(robust, robust_model, robust_data):
    robust.tsrm(robust_model, robust_data, perturbation=BALL, threshold=0.95, enforce=False)

def test_enforced(robust, robust_model, robust_data):
    robust.tsrm(robust_model, robust_data, perturbation=BALL, threshold=0.95)

@pytest.mark.robust(tsrm=0.7, perturbation=BALL)
def test_marker():
    pass

def test_other_model(robust, weak_model, robust_data):
    robust.tsrm(weak_model, robust_data, perturbation=BALL, budget=500)

def test_model_of_no_fixture(robust, robust_model, robust_data):
    robust.tsrm(type(robust_model)(0.8), robust_data, perturbation=BALL, budget=500)
"""


@pytest.fixture
def run(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_checks=CHECKS)
    result = pytester.runpytest("--robust-junitxml", "metric.xml", "--robust-report", "out")
    result.assert_outcomes(passed=4, failed=1)
    suites = {s.get("name"): list(s.iter("testcase")) for s in ET.parse(pytester.path / "metric.xml").getroot()
              .iter("testsuite")}
    results = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    return suites, {r["test_id"].split("::")[1]: r for r in results}


def test_a_check_recorded_with_enforce_false_is_no_failure_in_the_metric_junit(run):
    suites, results = run
    cases = {c.get("name").rsplit("::", 1)[1]: c for cs in suites.values() for c in cs}
    look = cases["test_look_only"]
    assert look.find("failure") is None and look.find("error") is None and look.find("skipped") is None
    assert "FAIL, NOT ENFORCED | UniformLinf(eps=0.5)" in look.get("name")
    assert look.find("system-out").text.startswith("not enforced (enforce=False): TSRM 0.")
    assert results["test_look_only"]["verdict"] == "fail" and results["test_look_only"]["details"]["enforced"] is False
    enforced = cases["test_enforced"]  # the same check, enforced: a failure
    assert enforced.find("failure") is not None and "NOT ENFORCED" not in enforced.get("name")
    assert "enforced" not in results["test_enforced"]["details"]


def test_one_model_is_one_suite_whether_a_marker_or_a_fixture_call_checked_it(run):
    suites, results = run
    assert {name: sorted(c.get("name").rsplit("::", 1)[1] for c in cases) for name, cases in suites.items()} == {
        "robustness of robust_model": ["test_enforced", "test_look_only", "test_marker"],
        "robustness of weak_model": ["test_other_model"],
        "robustness of Step": ["test_model_of_no_fixture"],  # not a fixture of the test: its class names it
    }
    assert results["test_look_only"]["model"] == results["test_marker"]["model"] == "robust_model"


def test_not_enforced_stays_a_pass_in_the_junit_of_any_verdict():
    base = dict(metric="tsrm", estimate=0.6, lower=0.5, upper=0.7, threshold=0.8, confidence=0.95, n_inputs=10,
                draws=100, forward_passes=100, seconds=1.0, device="cpu", seed=0, perturbation="P", budget=1000,
                test_id="t::a", model="m")
    for verdict in ("fail", "inconclusive", "pass"):
        r = Result(**base, verdict=verdict, details={"title": "TSRM", "enforced": False})
        xml = metric_junit([r.to_dict()], {"hostname": "h"})
        assert "<failure" not in xml and f"{verdict.upper()}, NOT ENFORCED" in case_name(r)
