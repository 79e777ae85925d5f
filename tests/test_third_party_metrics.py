"""The two third-party checks of examples/third_party (each one file of at most 30 lines plus a
registry entry) work through every route: the marker, the fixture, a YAML suite and two torchrun
ranks, with the numbers of a single process; their parameters are validated at collection."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[1] / "examples" / "third_party"
DIGITS = Path(__file__).parents[1] / "examples" / "digits"

CONFTEST = f'''
import sys
sys.path[:0] = [{str(EXAMPLES)!r}, {str(DIGITS)!r}]
import pytest
import torch
from digits_model import digits_split, load_model
from rotation_accuracy import ROTATION_ACCURACY
from stable_accuracy import STABLE_ACCURACY

torch.set_num_threads(1)


def pytest_robust_metrics():
    return {{"rotation_accuracy": ROTATION_ACCURACY, "stable_accuracy": STABLE_ACCURACY}}


def model():
    return load_model("standard")


def data():
    x, y = digits_split()[1]
    return x[:64], y[:64]


@pytest.fixture(scope="session")
def robust_model():
    return model()


@pytest.fixture(scope="session")
def robust_data():
    return data()
'''

TESTS = '''
import pytest


@pytest.mark.robust(rotation_accuracy=0.5, max_degrees=10, budget=3000)
def test_rotation_marker():
    pass


@pytest.mark.robust(stable_accuracy=0.5, sigma=0.1, copies=4)
def test_stable_marker():
    pass


def test_fixture(robust, robust_model, robust_data):
    r = robust.rotation_accuracy(robust_model, robust_data, max_degrees=10, threshold=0.5, budget=3000)
    s = robust.stable_accuracy(robust_model, robust_data, sigma=0.1, copies=4, threshold=0.5)
    assert r.passed and s.passed and s.n_inputs == 64
'''

SUITE = '''
model: conftest:model
data: conftest:data
checks:
  - name: rotation
    rotation_accuracy: 0.5
    max_degrees: 10
    budget: 3000
  - name: stable
    stable_accuracy: 0.5
    sigma: 0.1
    copies: 4
'''


def _numbers(path: Path) -> list[tuple]:
    results = json.loads(path.read_text())["results"]
    return [(r["test_id"].rsplit("::", 1)[-1], r["metric"], r["verdict"], r["estimate"], r["lower"], r["upper"],
             r["draws"]) for r in results]


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_custom=TESTS)
    pytester.makefile(".yaml", robust_custom=SUITE)
    return pytester


def test_marker_fixture_and_yaml_run_both_checks(suite):
    result = suite.runpytest("-p", "no:cacheprovider", "--robust-report", "out")
    result.assert_outcomes(passed=5)
    numbers = _numbers(suite.path / "out" / "results.json")
    assert sorted({n[1] for n in numbers}) == ["rotation_accuracy", "stable_accuracy"]
    by_route = {}
    for name, metric, verdict, *figures in numbers:
        assert verdict == "pass"
        by_route.setdefault(metric, set()).add(tuple(figures))
    assert all(len(v) == 1 for v in by_route.values()), by_route  # the same numbers by every route


def test_two_torchrun_ranks_reach_the_single_process_numbers(suite):
    result = suite.run(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       "-m", "pytest", "-p", "no:cacheprovider", "--robust-report", "sharded", timeout=300)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    suite.runpytest("-p", "no:cacheprovider", "--robust-report", "single")
    sharded, single = (_numbers(suite.path / d / "results.json") for d in ("sharded", "single"))
    assert sharded == single and len(sharded) == 6
    per_rank = [r["details"]["evaluations_per_rank"]
                for r in json.loads((suite.path / "sharded" / "results.json").read_text())["results"]]
    assert all(len(p) == 2 and min(p) > 0 for p in per_rank), per_rank


@pytest.mark.parametrize("keywords, message", [
    ("rotation_accuracy=0.5, max_degrees='ten'", "max_degrees='ten' is invalid: expected a finite number > 0"),
    ("stable_accuracy=0.5, copies=0", "copies=0 is invalid: expected an integer >= 1"),
    ("stable_accuracy=1.5", "stable_accuracy=1.5 is invalid: expected a number strictly between 0 and 1"),
    ("rotation_accuracy=0.5, max_degree=10", "unknown keyword(s) max_degree (did you mean max_degrees?)"),
])
def test_a_bad_parameter_is_a_usage_error_at_collection(suite, keywords, message):
    suite.makepyfile(test_custom=f"import pytest\n\n@pytest.mark.robust({keywords})\ndef test_x():\n    pass\n")
    (suite.path / "robust_custom.yaml").unlink()
    result = suite.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR or result.ret == pytest.ExitCode.INTERRUPTED
    assert message in result.stdout.str() + result.stderr.str()


def test_each_example_is_one_file_of_at_most_30_lines():
    for name in ("rotation_accuracy.py", "stable_accuracy.py"):
        assert len((EXAMPLES / name).read_text().splitlines()) <= 30, name


def test_an_at_most_check_takes_its_direction_from_its_declaration():
    """A loss-type check declared direction="<=" passes a loss below its maximum and accepts a
    maximum >= 1: the Run gets the direction from the declaration, so it cannot be inverted."""
    from toy_models import SmallNet, image_data

    from pytest_robust import Metric
    from pytest_robust.checks.library import function

    def mean_loss(run):
        return run.result(estimate=0.039, lower=0.03, upper=0.05, draws=1, perturbation="none")

    check = function("mean_loss", Metric(mean_loss, direction="<="))
    for maximum in (0.5, 2.0):
        r = check(SmallNet().eval(), image_data(n=8), threshold=maximum)
        assert (r.verdict, r.direction) == ("pass", "<=")
    assert check(SmallNet().eval(), image_data(n=8), threshold=0.01).verdict == "fail"
