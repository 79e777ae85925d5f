"""The q-loss marker end to end with pytester: pass, fail, inconclusive, defaults, errors, JUnit.

The model's first logit is exp(2 (x - 0.5)) and the custom loss reads it, so on inputs 0.5 under
UniformLinf(eps=0.5) the loss is exp(2 delta), delta ~ U[-0.5, 0.5], and
Z_10 = (sinh(10) / 10)^(1/10) = 2.01 exactly.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

import pytest_robust.checks.q.check  # noqa: F401  (import the core once, before pytester runs)

CONFTEST = """
import pytest, torch

class Exp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        s = x[:, 0] - 0.5
        return torch.stack([torch.exp(2 * s), torch.zeros_like(s)], dim=1) + self.bias

@pytest.fixture(scope="session")
def robust_model():
    return Exp()

@pytest.fixture(scope="session")
def robust_data():
    return torch.full((12, 1), 0.5), torch.zeros(12, dtype=torch.long)
"""

HEADER = """
import pytest
from pytest_robust import UniformLinf

def first_logit(logits, y):
    return logits[:, 0]

BOX = UniformLinf(eps=0.5)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


def properties(path) -> list[dict[str, str]]:
    root = ET.parse(path).getroot()
    return [{p.get("name"): p.get("value") for p in case.iter("property")} for case in root.iter("testcase")]


def test_q_marker_passes_and_fails_against_the_closed_form(suite):
    suite.makepyfile(HEADER + """
@pytest.mark.robust(q=10, max_loss=2.5, perturbation=BOX, loss=first_logit, steps=30)
def test_within():
    pass

@pytest.mark.robust(q=10, max_loss=1.5, perturbation=BOX, loss=first_logit, steps=30)
def test_beyond():
    pass
""")
    result = suite.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.re_match_lines([
        r".*q-loss \d\.\d{3} \(95% lower bound \d\.\d{3}, upper bound \d\.\d{3}\) > allowed 1\.5 under "
        r"UniformLinf\(eps=0\.5\), 1440 draws on 12 inputs, seed 0, \d+ of 1000000 model evaluations; "
        r"q=10, path sampling \(HMC\).*"
        r"not a guarantee.*Monte Carlo \d\.\d+, PGD adversarial loss 2\.7\d* \(q=inf\).*"
    ])
    within, beyond = properties(suite.path / "out.xml")
    assert within["robust.metric"] == "q" and within["robust.verdict"] == "pass"
    assert float(within["robust.upper"]) <= 2.5 and within["robust.threshold"] == "2.5"
    assert beyond["robust.verdict"] == "fail" and float(beyond["robust.lower"]) > 1.5
    assert float(within["robust.estimate"]) == pytest.approx(2.0146, rel=0.05)
    assert int(within["robust.forward_passes"]) <= int(within["robust.budget"]) == 1_000_000


def test_default_perturbation_is_uniform_linf_with_the_eps_setting(suite):
    suite.makepyfile(HEADER + """
@pytest.mark.robust(q=1, max_loss=1.5, loss=first_logit, steps=20)
def test_default():
    pass
""")
    result = suite.runpytest("--robust-eps", "0.5", "--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    (props,) = properties(suite.path / "out.xml")
    assert props["robust.perturbation"] == "UniformLinf(eps=0.5)"
    assert float(props["robust.lower"]) <= 1.1752 <= float(props["robust.upper"])  # sinh(1)


def test_unhealthy_chains_make_the_test_fail_as_inconclusive_with_the_fix(suite):
    suite.makepyfile(HEADER + """
@pytest.mark.robust(q=100, max_loss=100, perturbation=BOX, loss=first_logit, warmup=0, path_len=1e-4,
                    leapfrog=1, steps=30)
def test_frozen_chains():
    pass
""")
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*q-loss * is inconclusive against <= 100*: the MCMC diagnostics are unhealthy: "
        "median split R-hat*raise steps=*"
    ])
    result = suite.runpytest("--robust-inconclusive", "skip")
    result.assert_outcomes(skipped=1)


@pytest.mark.parametrize(
    "marker, expected",
    [
        ("q=100", "needs max_loss="),
        ("q=100, max_loss=-1", "max_loss=-1 is invalid: expected a finite number >= 0"),
        ("q=0, max_loss=1, perturbation=BOX", "q=0 is invalid: expected a finite number > 0"),  # one rule
        ("q=100, max_loss=1, leapfrogs=3", "unknown keyword(s) leapfrogs (did you mean leapfrog?) on robust(q=...)"),
    ],
)
def test_bad_q_markers_are_usage_errors(suite, marker, expected):
    suite.makepyfile(HEADER + f"""
@pytest.mark.robust({marker})
def test_x():
    pass
""")
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{expected}*"])
    if "keyword" in expected:
        result.stderr.fnmatch_lines(["*valid keywords of robust(q=...): max_loss*mh_steps*inputs*"])


@pytest.mark.parametrize(
    "marker, expected",
    [
        ("q=10, max_loss=1, perturbation=BOX, loss=first_logit, budget=1000",
         "budget=1000 is invalid: expected at least * model evaluations"),
        ("q=10, max_loss=1, perturbation=BOX, loss=lambda z, y: -z[:, 0]", "non-negative, finite loss"),
    ],
)
def test_requests_that_cannot_run_fail_the_test_with_the_reason(suite, marker, expected):
    suite.makepyfile(HEADER + f"""
@pytest.mark.robust({marker})
def test_x():
    pass
""")
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*robust check could not run: *{expected}*"])
    assert "Traceback" not in result.stdout.str()
