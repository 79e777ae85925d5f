"""The certified_accuracy marker end to end with pytester: pass, fail, messages, properties, errors."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

import pytest_robust.checks.smoothing.check  # noqa: F401  (imported once, outside the inline runs)

# A half-space classifier with known smoothed behaviour: class 1 iff x' < 0, so under
# N(0, sigma^2) noise input x is classified 1 (its label) with probability Phi(-x / sigma).
# 40 inputs at x = -1 (p = Phi(4) > Phi(0.5 / 0.25) = 0.977: certifiable at radius 0.5) and 10 on
# the boundary x = 0 (p = 1/2: not certifiable), so the true certified accuracy is 0.8.
CONFTEST = """
import pytest, torch

class HalfSpace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        d = -x[:, :1] * self.w
        return torch.cat([-d, d], dim=1)

@pytest.fixture(scope="session")
def robust_model():
    return HalfSpace()

@pytest.fixture(scope="session")
def robust_data():
    x = torch.cat([torch.full((40, 1), -1.0), torch.zeros(10, 1)])
    return x, torch.ones(50, dtype=torch.long)
"""

TEST = """
import pytest

@pytest.mark.robust(certified_accuracy={threshold}, radius=0.5, sigma=0.25{extra})
def test_smoothed():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


def write(suite, threshold, extra=""):
    suite.makepyfile(TEST.format(threshold=threshold, extra=extra))


def properties(path) -> dict[str, str]:
    case = next(ET.parse(path).getroot().iter("testcase"))
    return {p.get("name"): p.get("value") for p in case.iter("property")}


def test_passing_marker_reports_its_numbers(suite):
    write(suite, 0.6)
    result = suite.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    props = properties(suite.path / "out.xml")
    assert props["robust.metric"] == "certified_accuracy"
    assert props["robust.verdict"] == "pass"
    assert props["robust.perturbation"] == "Gaussian smoothing sigma=0.25, L2 radius 0.5, alpha=0.001"
    assert float(props["robust.estimate"]) == 0.8
    assert 0.6 <= float(props["robust.lower"]) < 0.8 < float(props["robust.upper"])
    assert props["robust.n_inputs"] == "50"
    assert props["robust.budget"] == "2000000"
    result.stdout.fnmatch_lines(["*robustness checks*", "*test_smoothed*certified accuracy*Gaussian smoothing*PASS"])


def test_failing_marker_message_says_what_was_certified(suite):
    write(suite, 0.9)
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.re_match_lines([
        r".*certified accuracy 0\.800 \(95% lower bound 0\.\d{3}, upper bound 0\.\d{3}\) < required 0\.9 under "
        r"Gaussian smoothing sigma=0\.25, L2 radius 0\.5, alpha=0\.001, \d+ draws on 50 inputs, seed 0, "
        r"\d+ of 2000000 model evaluations; "
        r"40 of 50 inputs certified, 10 proven not certifiable"
    ])
    assert "Traceback" not in result.stdout.str()


def test_optional_parameters_reach_the_check(suite):
    write(suite, 0.6, ", alpha=0.01, max_draws=2000")
    result = suite.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    assert properties(suite.path / "out.xml")["robust.perturbation"] == (
        "Gaussian smoothing sigma=0.25, L2 radius 0.5, alpha=0.01"
    )


@pytest.mark.parametrize(
    "threshold, extra, expected",
    [
        (0.6, ", max_draws=100", "*robust check could not run: max_draws=100 is invalid: expected at least 319*"),
        (0.6, ", sigma_typo=1", None),
        (0.99, "", "*robust check could not run: threshold=0.99 is invalid: expected at most*use at least*inputs*"),
    ],
)
def test_requests_that_cannot_pass_fail_with_a_clear_reason(suite, threshold, extra, expected):
    write(suite, threshold, extra)
    result = suite.runpytest()
    if expected is None:  # an unknown keyword is a usage error at collection
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*unknown keyword(s) sigma_typo*"])
        return
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([expected])


def test_invalid_sigma_is_a_usage_error_at_collection(suite):
    suite.makepyfile("""
        import pytest

        @pytest.mark.robust(certified_accuracy=0.6, radius=0.5, sigma=0)
        def test_x():
            pass
    """)
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*sigma=0 is invalid: expected a finite number > 0*"])


def test_missing_radius_is_a_usage_error(suite):
    suite.makepyfile("""
        import pytest

        @pytest.mark.robust(certified_accuracy=0.6, sigma=0.25)
        def test_x():
            pass
    """)
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*robust(certified_accuracy=...) needs radius=*"])


def test_results_reach_the_xdist_controller_and_the_report(suite):
    """Details (per-input decisions and draws) are plain JSON, so they travel from xdist workers."""
    suite.makepyfile(
        test_a=TEST.format(threshold=0.6, extra=""),
        test_b=TEST.format(threshold=0.9, extra=""),
    )
    result = suite.runpytest_subprocess("-n", "2", "--robust-report", "report")
    result.assert_outcomes(passed=1, failed=1)
    results = json.loads((suite.path / "report" / "results.json").read_text())["results"]
    assert sorted(r["verdict"] for r in results) == ["fail", "pass"]
    for r in results:
        assert r["details"]["per_input"]["outcome"].count("certified") == 40
        assert len(r["details"]["per_input"]["draws"]) == 50
