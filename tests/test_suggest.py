"""--robust-suggest (issue 27): every check runs as an estimate, and each gets a suggested threshold
(its lower bound rounded down to the grid; a loss's upper bound rounded up), the text to paste
where it was declared, and a file in the report directory; the rerun probabilities that
docs/settings.md derives hold in simulation."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from test_suites import FACTORIES, REGISTER

from pytest_robust.report.suggest import GRID, suggestion
from pytest_robust.results import Result
from pytest_robust.stats.binomial import clopper_pearson_lower

TESTS = """
import pytest
from factories import halves, step
from pytest_robust import UniformLinf

@pytest.fixture
def robust_model():
    return step(0.8)

@pytest.fixture
def robust_data():
    return halves(400)

@pytest.mark.robust(tsrm=0.99, perturbation=UniformLinf(eps=0.5), budget=400)
def test_marker():
    pass

def test_fixture(robust, robust_model, robust_data):
    robust.tsrm(robust_model, robust_data, threshold=0.99, perturbation=UniformLinf(eps=0.5), budget=400)
"""

SUITE = """\
model: factories:step
data: factories:halves
checks:
  - name: from-yaml
    tsrm: 0.99
    perturbation: {UniformLinf: {eps: 0.5}}
    budget: 400
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(REGISTER)
    pytester.makepyfile(factories=FACTORIES, test_suggested=TESTS)
    pytester.makefile(".yaml", robust_toy=SUITE)
    return pytester


def test_suggest_runs_estimates_and_prints_what_to_paste_then_the_suggestion_passes(project):
    plain = project.runpytest()
    plain.assert_outcomes(failed=3)  # the thresholds of 0.99 fail (TSRM = 0.8)
    result = project.runpytest("--robust-suggest", "--robust-report", "rep")
    result.assert_outcomes(passed=3)  # estimates: thresholds ignored
    out = result.stdout.str()
    assert "suggested thresholds: the 95% lower bound rounded down to the grid 0.01" in out
    pasted = {name: (kind, float(value)) for name, kind, value in
              re.findall(r"::(\S+): TSRM 0\.\d+, bound 0\.\d+ -> (tsrm=|tsrm: |threshold=)(0\.\d\d) \(green: 0\.\d\d\)",
                         out)}
    assert {k: v[0] for k, v in pasted.items()} == {"test_marker": "tsrm=", "test_fixture": "threshold=",
                                                     "from-yaml": "tsrm: "}
    assert all(0.6 <= v <= 0.8 for _, v in pasted.values())
    table = (project.path / "rep" / "suggested_thresholds.md").read_text()
    assert "`tsrm: " in table and "`threshold=" in table and "| green |" in table
    value = pasted["test_marker"][1]
    project.makepyfile(test_suggested=TESTS.replace("0.99", f"{value:.2f}"))
    project.makefile(".yaml", robust_toy=SUITE.replace("0.99", f"{pasted['from-yaml'][1]:.2f}"))
    project.runpytest().assert_outcomes(passed=3)  # the same seed repeats the draws: the suggestion passes


def result(estimate, lower, upper, direction=">="):
    return Result(metric="m", estimate=estimate, lower=lower, upper=upper, threshold=None, confidence=0.95,
                  verdict="estimate", n_inputs=1, draws=1, forward_passes=1, seconds=0.0, device="cpu", seed=0,
                  perturbation="p", budget=1, direction=direction)


def test_the_grid_rounds_away_from_the_estimate():
    assert suggestion(result(0.9, 0.8765, 0.93), "tsrm", "=")["paste"] == "tsrm=0.87"
    assert suggestion(result(0.9, 0.87, 0.93), "tsrm", "=")["threshold"] == 0.87  # on the grid: itself
    loss = suggestion(result(0.30, 0.25, 0.3412, "<="), "max_loss", ": ")
    assert (loss["paste"], loss["green"]) == ("max_loss: 0.35", math.ceil((0.3412 + 2 ** 0.5 * 0.0412) / GRID) * GRID)
    assert suggestion(result(0.02, 0.001, 0.05), "tsrm", "=")["green"] == 0.0  # never below 0


def test_a_rerun_on_new_draws_passes_the_bound_half_the_time_and_the_green_threshold_at_the_confidence():
    """The derivation of docs/settings.md ('Choosing thresholds'), simulated with the exact
    Clopper-Pearson bound at 95%: n = 2000 draws, true accuracy 0.9, 4000 pairs of runs."""
    rng = np.random.default_rng(0)
    n, p, alpha = 2000, 0.9, 0.05
    first, second = rng.binomial(n, p, 4000), rng.binomial(n, p, 4000)
    lower = {k: clopper_pearson_lower(int(k), n, alpha) for k in np.unique(np.concatenate([first, second]))}
    at_bound = green = 0
    for k1, k2 in zip(first, second):
        s = suggestion(result(k1 / n, lower[k1], 1.0), "tsrm", "=")
        at_bound += lower[k2] >= s["threshold"]
        green += lower[k2] >= s["green"]
    assert 0.45 <= at_bound / 4000 <= 0.75  # about 1/2 (rounding down to the grid adds a little)
    assert green / 4000 >= 0.95


def test_a_suggestion_from_a_model_near_chance_says_not_to_paste_it(pytester):
    """Swapped labels: the estimate is low, the label check speaks in the estimate mode of
    --robust-suggest, and the suggestion carries its advice instead of standing alone."""
    pytester.makeconftest(REGISTER)
    pytester.makepyfile(factories=FACTORIES, test_swapped="""
import pytest
import torch
from factories import halves, step
from pytest_robust import UniformLinf

@pytest.fixture
def robust_model():
    return step(0.8)

@pytest.fixture
def robust_data():
    x, y = halves(400)
    return x, 1 - torch.as_tensor(y)

@pytest.mark.robust(tsrm=0.9, perturbation=UniformLinf(eps=0.5), budget=400)
def test_marker():
    pass
""")
    out = pytester.runpytest("--robust-suggest", "-W", "ignore::pytest_robust.errors.RobustWarning").stdout.str()
    line = next(line for line in out.splitlines() if "-> tsrm=" in line)
    assert "do not paste it before the label check is answered: the model is near or below chance" in line
