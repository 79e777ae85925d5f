"""Per-input results: the tables in details["per_input"], the worst inputs, per_input.csv, summary.md
and the gallery PNG (pytest_robust/per_input.py, gallery.py, report/inputs.py)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from test_model_interface import images, small_net
from toy_models import bare_run

from pytest_robust import certified_accuracy
from pytest_robust.errors import ArgumentError
from pytest_robust.report.inputs import per_input_csv, without_pixels
from pytest_robust.results import worst


def test_worst_inputs_rank_outcomes_then_estimates_in_the_metrics_direction():
    table = {"index": [0, 1, 2, 3, 4], "outcome": ["robust", "broken", "undecided", "broken", "misclassified"],
             "estimate": [1.0, 0.6, 0.9, 0.2, 0.0]}
    assert [r["index"] for r in worst(table, ">=")] == [4, 3, 1, 2, 0]
    losses = {"index": [7, 8, 9], "outcome": ["within max_loss"] * 3, "estimate": [0.1, 0.9, 0.5]}
    assert [r["index"] for r in worst(losses, "<=", k=2)] == [8, 9]
    staged = {"index": [0, 1, 2], "outcome": ["broken", "robust", "broken"], "stage": [2, None, 0]}
    assert [r["index"] for r in worst(staged)] == [2, 0, 1]


def test_worst_inputs_sorted_as_columns_are_the_rows_sorted_one_by_one():
    """The column sort of ``worst`` against the definition: every row built, sorted by (outcome rank,
    signed estimate, else stage, else last, index), stable; with ties, gaps (None, NaN, text) and
    outcome words the ranks do not know."""
    import math
    import random

    from pytest_robust.results import OUTCOME_RANK, rows

    rng = random.Random(0)
    words = ["robust", "broken", "misclassified", "undecided", "certified", "made up"]
    for direction in (">=", "<="):
        n = 300
        table = {"index": rng.sample(range(10_000), n), "outcome": [rng.choice(words) for _ in range(n)],
                 "estimate": [rng.choice([None, math.nan, "x", 0.5, rng.random()]) for _ in range(n)],
                 "stage": [rng.choice([None, 0, 1, 2, "square"]) for _ in range(n)]}
        sign = 1.0 if direction == ">=" else -1.0

        def key(row):
            number = lambda v: float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None  # noqa: E731
            estimate, stage = number(row["estimate"]), number(row["stage"])
            order = sign * estimate if estimate is not None else stage if stage is not None else math.inf
            return OUTCOME_RANK.get(row["outcome"], OUTCOME_RANK["undecided"]), order, row["index"]

        assert worst(table, direction, k=50) == sorted(rows(table), key=key)[:50]


def test_a_malformed_table_is_the_metrics_bug_named():
    with bare_run("mine", small_net(), images()) as run:
        with pytest.raises(ArgumentError,
                           match='metric mine: details\\["per_input"\\] columns must have equal lengths'):
            run.result(estimate=0.5, lower=0.4, upper=0.6, draws=1, perturbation="-",
                       details={"per_input": {"index": [0, 1], "outcome": ["robust"]}})


def test_certified_accuracy_lists_every_input_and_shows_the_worst():
    r = certified_accuracy(small_net(), images(), threshold=None, radius=0.1, sigma=0.25, alpha=0.01, max_draws=64,
                           budget=1024)
    table = r.details["per_input"]
    assert table["index"] == list(range(16)) and len(table["outcome"]) == 16
    assert all((o == "certified") == (rad == 0.1) for o, rad in zip(table["outcome"], table["radius"]))
    assert table["estimate"] == [k / d for k, d in zip(table["correct_draws"], table["draws"])]
    g = r.gallery
    assert g["index"] == [row["index"] for row in worst(table)] and g["shape"] == [3, 8, 8]
    assert g["perturbation"] == "GaussianNoise(sigma=0.25, bounds=None)"
    assert len(g["clean"]) == len(g["perturbed"]) == len(__import__("base64").b64encode(bytes(10 * 3 * 64)))
    assert "clean" not in without_pixels(r.to_dict())["gallery"]


def test_csv_has_one_row_per_input_and_the_union_of_columns():
    rows = [{"test_id": "t::a", "model": "m", "metric": "q", "perturbation": "p",
             "details": {"per_input": {"index": [3, 1], "outcome": ["above max_loss", "within max_loss"],
                                       "estimate": [2.0, 0.1]}}},
            {"test_id": "t::b", "model": "m", "metric": "adversarial_accuracy", "perturbation": "p",
             "details": {"per_input": {"index": [0], "outcome": ["broken"], "stage": ["apgd-ce"]}}},
            {"test_id": "t::c", "metric": "tsrm", "details": {}}]
    parsed = list(csv.DictReader(io.StringIO(per_input_csv(rows))))
    assert [(r["test"], r["index"], r["outcome"], r["estimate"], r["stage"]) for r in parsed] == [
        ("t::a", "3", "above max_loss", "2.0", ""), ("t::a", "1", "within max_loss", "0.1", ""),
        ("t::b", "0", "broken", "", "apgd-ce")]


CONFTEST = """
import pytest
from test_model_interface import images, small_net

@pytest.fixture
def robust_model():
    return small_net()

@pytest.fixture
def robust_data():
    return images()
"""

TESTS = """
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(certified_accuracy=0.01, radius=0.1, sigma=0.25, alpha=0.01, max_draws=64, budget=1024,
                    inconclusive="skip")
def test_smoothed():
    pass

@pytest.mark.robust(q=1, max_loss=5, estimator="mc", perturbation=UniformLinf(eps=0.05), inputs=8, pgd_steps=2)
def test_loss():
    pass

@pytest.mark.robust(tsrm=0.01, perturbation=UniformLinf(eps=0.05), budget=256)
def test_stream():
    pass
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_x=TESTS)
    return pytester


def test_report_directory_gets_tables_csv_worst_inputs_and_galleries(suite):
    result = suite.runpytest("--robust-report", "rep", "--robust-per-input", "csv")
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    rep = suite.path / "rep"
    results = json.loads((rep / "results.json").read_text())["results"]
    tables = {r["metric"]: r["details"].get("per_input") for r in results}
    assert tables["tsrm"] is None and len(tables["certified_accuracy"]["index"]) == 16
    assert len(tables["q"]["index"]) == 8 and set(tables["q"]["outcome"]) <= {"above max_loss", "within max_loss"}
    assert all("clean" not in r["gallery"] for r in results if r["gallery"])  # pixels stay out of results.json
    rows = list(csv.DictReader((rep / "per_input.csv").open()))
    assert len(rows) == 16 + 8 and {"test", "metric", "index", "outcome", "estimate", "radius"} <= set(rows[0])
    summary = (rep / "summary.md").read_text()
    assert "### Worst inputs of test_x.py::test_smoothed (certified accuracy)" in summary
    assert "10 of 16 inputs, worst first" in summary and "Pictures: `gallery-00-test_x.py_test_smoothed" in summary
    galleries = sorted(p.name for p in rep.glob("gallery-*.png"))
    assert galleries == ["gallery-00-test_x.py_test_smoothed-certified_accuracy.png",
                         "gallery-01-test_x.py_test_loss-q.png"]
    assert (rep / galleries[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--robust-per-input", "csv"],
     "*--robust-per-input='csv' is invalid: expected a report directory*--robust-report*"),
    (["--robust-per-input", "xml", "--robust-report", "r"], "*--robust-per-input='xml' is invalid: expected csv*"),
])
def test_per_input_needs_a_report_directory_and_a_known_format(suite, args, message):
    result = suite.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
