"""Report files, the metric-level JUnit file and baselines, end to end with pytester."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from test_plugin import CONFTEST

from pytest_robust.report import store
from pytest_robust.report.markdown import deciding_bound, summary_markdown
from pytest_robust.report.plots import accuracy_curves, plot_heatmap, write_plots
from pytest_robust.report.terminal import summary_lines, wrap
from pytest_robust.results import Result

# The model's accuracy under UniformLinf(eps) from inputs 0.5 is known: x' ~ U[0.5 - eps, 0.5 + eps]
# and the model is right iff x' < t, so TSRM = min(1, (t - 0.5 + eps) / (2 eps)).
SUITE = """
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5))
def test_wide():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.4))
def test_narrower():
    pass

@pytest.mark.robust(tsrm=0.95, perturbation=UniformLinf(eps=0.5))
def test_too_strict():
    pass
"""

STEP_AT = "return Step(0.8)"


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_report_directory_has_results_summary_and_plots(suite):
    result = suite.runpytest("--robust-report", "out")
    result.assert_outcomes(passed=2, failed=1)
    out = suite.path / "out"
    payload = json.loads((out / "results.json").read_text())
    assert {"environment", "settings", "results"} <= set(payload)
    assert payload["environment"]["torch"] and payload["environment"]["python"]
    assert payload["settings"]["seed"] == 0
    assert [r["verdict"] for r in payload["results"]] == ["pass", "pass", "fail"]
    assert all(r["model"] == "robust_model" for r in payload["results"])
    summary = (out / "summary.md").read_text()
    assert ("| check | metric | perturbation | estimate | deciding bound | threshold | verdict "
            "| evaluations/budget | time |") in summary
    assert "test_suite.py::test_too_strict" in summary and "❌ fail" in summary
    assert "< required 0.95 under UniformLinf(eps=0.5)" in summary
    plots = sorted(p.name for p in out.glob("*.png"))
    assert plots == ["00-summary-tsrm-robust_model-UniformLinf.png"]
    assert (out / plots[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result.stdout.fnmatch_lines(["robust report: out/results.json", "robust report: out/summary.md"])


def test_metric_level_junit_has_numbers_in_names_and_messages(suite):
    suite.runpytest("--robust-junitxml", "metric.xml")
    root = ET.parse(suite.path / "metric.xml").getroot()
    (testsuite,) = root.iter("testsuite")
    assert testsuite.get("name") == "robustness of robust_model"
    props = {p.get("name"): p.get("value") for p in testsuite.iter("property")}
    assert {"python", "torch", "hostname", "commit"} <= set(props)
    cases = list(testsuite.iter("testcase"))
    assert len(cases) == 3
    assert cases[0].get("name").startswith("TSRM 0.")
    assert "PASS | UniformLinf(eps=0.5) | test_suite.py::test_wide" in cases[0].get("name")
    failure = cases[2].find("failure")
    assert failure is not None and "< required 0.95" in failure.get("message")


def test_reports_written_once_by_the_controller_under_xdist(suite):
    result = suite.runpytest_subprocess("-n", "2", "--robust-report", "out", "--robust-junitxml", "m.xml")
    result.assert_outcomes(passed=2, failed=1)
    assert len(json.loads((suite.path / "out" / "results.json").read_text())["results"]) == 3
    assert len(list(ET.parse(suite.path / "m.xml").getroot().iter("testcase"))) == 3
    assert result.stdout.str().count("robust report: out/results.json") == 1


def test_baseline_then_degraded_model_fails_compare(suite):
    suite.runpytest("--robust-save", "main").assert_outcomes(passed=2, failed=1)
    saved = list((suite.path / ".robust_baselines").glob("*/main.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["name"] == "main"

    same = suite.runpytest("--robust-compare", "main", "--robust-compare-fail")
    assert same.ret == pytest.ExitCode.TESTS_FAILED  # test_too_strict fails on its own
    # a bit-identical rerun is unchanged, however wide the bounds of its early-stopped gates
    same.stdout.fnmatch_lines(["robust baseline 'main' (commit *): 0 regressed, 0 improved, 3 unchanged"])

    suite.makeconftest(CONFTEST.replace(STEP_AT, "return Step(0.55)"))  # TSRM drops to 0.55
    worse = suite.runpytest("--robust-compare-fail", "--robust-inconclusive", "skip", "--junitxml", "pytest.xml",
                            "--robust-report", "out")
    worse.stdout.fnmatch_lines([
        "robust baseline 'main' *: * regressed*",
        "  REGRESSED test_suite.py::test_wide::tsrm::UniformLinf(eps=0.5): 0.* -> 0.*",
        "  --robust-compare-fail: failing the run*",
    ])
    assert worse.ret == pytest.ExitCode.TESTS_FAILED
    # the regression is a failure in pytest's own JUnit file, its terminal counts and summary.md's headline
    suite_xml = ET.parse(suite.path / "pytest.xml").getroot().find("testsuite")
    regressions = [c for c in suite_xml.iter("testcase") if c.get("name").startswith("robust-regression[")]
    assert int(suite_xml.get("failures")) >= len(regressions) >= 1
    assert regressions[0].get("name") == "robust-regression[tsrm::UniformLinf(eps=0.5)]"
    assert "regressed against baseline 'main'" in regressions[0].find("failure").get("message")
    worse.stdout.fnmatch_lines(
        ["FAILED test_suite.py::test_wide::robust-regression[[]tsrm::UniformLinf(eps=0.5)[]] - *", "*5 failed*"])
    payload = json.loads((suite.path / "out" / "results.json").read_text())
    wide = next(r for r in payload["results"] if r["test_id"].endswith("test_wide"))
    assert wide["comparison"]["status"] == "regressed" and wide["comparison"]["baseline"] == "main"
    assert wide["comparison"]["baseline_numbers"]["estimate"] > wide["estimate"]
    assert payload["baseline"]["name"] == "main" and payload["format"] == store.FORMAT
    assert "Against baseline main: 2 regressed" in (suite.path / "out" / "summary.md").read_text()


def test_compare_without_a_baseline_says_how_to_make_one(suite):
    result = suite.runpytest("--robust-compare")
    result.stdout.fnmatch_lines(
        ["robust baseline comparison skipped: no baseline saved for this machine*--robust-save NAME*"])


def _result(**kw) -> dict:
    base = dict(metric="tsrm", estimate=0.9, lower=0.88, upper=0.92, threshold=0.85, confidence=0.95,
                verdict="pass", n_inputs=10, draws=100, forward_passes=100, seconds=1.0, device="cpu",
                seed=0, perturbation="UniformLinf(eps=0.1)", budget=1000, test_id="t::a",
                details={"title": "TSRM", "procedure": "bernoulli"})
    return Result(**{**base, **kw}).to_dict()


@pytest.mark.parametrize(
    "now, direction, status",
    [
        (dict(estimate=0.80, lower=0.78, upper=0.82), ">=", "regressed"),
        (dict(estimate=0.87, lower=0.85, upper=0.89), ">=", "cannot tell (these bounds could only flag a change "
                                                             "larger than 0.04;"),  # overlapping, too wide
        (dict(estimate=0.9, lower=0.897, upper=0.903, details={"title": "TSRM"}), ">=", "unchanged"),
        (dict(estimate=0.97, lower=0.95, upper=0.99), ">=", "improved"),
        (dict(estimate=0.80, lower=0.78, upper=0.82), "<=", "improved"),  # a loss went down
        (dict(estimate=0.97, lower=0.95, upper=0.99), "<=", "regressed"),
    ],
)
def test_comparison_uses_non_overlapping_bounds(now, direction, status):
    narrow = dict(lower=0.897, upper=0.903) if status == "unchanged" else {}
    (row,) = store.compare([_result(direction=direction, **narrow)], [_result(direction=direction, **now)])
    assert row["status"].startswith(status)


def test_baselines_are_keyed_by_what_changes_results_not_by_the_host():
    from pytest_robust.report.environment import baseline_key

    env = {"hostname": "runner-7f3a", "machine": "x86_64", "torch": "2.14.1", "gpus": ["NVIDIA H100 80GB HBM3"]}
    assert (baseline_key(env) == baseline_key({**env, "hostname": "runner-0c11"})
            == "x86_64-torch2.14.1-NVIDIA_H100_80GB_HBM3")
    assert baseline_key({**env, "torch": "2.15.0"}) != baseline_key(env)
    bf16 = _result(precision="autocast bfloat16")
    assert [r["status"] for r in store.compare([_result()], [bf16])] == ["missing", "new"]


def test_comparison_reports_new_and_missing_checks():
    rows = store.compare([_result(test_id="t::old")], [_result(test_id="t::new")])
    assert [(r["key"].split("::")[1], r["status"]) for r in rows] == [("old", "missing"), ("new", "new")]


def test_accuracy_curves_group_by_check_model_and_family():
    results = [
        _result(perturbation=f"UniformLinf(eps={e})", model="m", estimate=1 - e) for e in (0.3, 0.1, 0.2)
    ] + [_result(perturbation="GaussianNoise(sigma=0.1)", model="m")]
    (name, curve), = accuracy_curves(results).items()
    assert name == "tsrm-m-UniformLinf" and curve["x"] == [0.1, 0.2, 0.3]
    assert curve["series"]["estimate"] == pytest.approx([0.9, 0.8, 0.7])
    assert curve["intervals"]["estimate"] == [[0.88, 0.92]] * 3 and curve["counts"]["estimate"] == [100] * 3


def test_plots_draw_intervals_and_counts_and_grey_out_thin_heatmap_cells(tmp_path):
    early = _result(perturbation="UniformLinf(eps=0.1)", estimate=1.0, lower=0.65, upper=1.0, draws=7)
    written = write_plots([early, _result(perturbation="UniformLinf(eps=0.2)")], tmp_path)
    assert [p.name for p in written] == ["00-summary-tsrm-model-UniformLinf.png"]
    heatmap = {"title": "Accuracy under corruption (a long title that used to be clipped at the figure's edge)",
               "xlabel": "severity", "rows": ["fog", "jpeg"], "columns": ["1", "2"],
               "values": [[0.9, 1.0], [None, 0.5]], "counts": [[40, 12], [0, 31]]}
    path = plot_heatmap(heatmap, tmp_path / "h.png")
    import matplotlib.image

    pixels = matplotlib.image.imread(path)[..., :3]
    grey = (abs(pixels[..., 0] - pixels[..., 1]) < 0.01) & (abs(pixels[..., 1] - pixels[..., 2]) < 0.01) & (
        pixels[..., 0] > 0.8) & (pixels[..., 0] < 0.95)
    assert grey.sum() > 500  # the 12-draw cell is grey, not green


@pytest.mark.parametrize("verdict, direction, shown", [
    ("pass", ">=", "0.8800 (95% lower)"), ("fail", ">=", "0.9200 (95% upper)"),
    ("pass", "<=", "0.9200 (95% upper)"), ("fail", "<=", "0.8800 (95% lower)"),
    ("inconclusive", ">=", "[0.8800, 0.9200] (95%)"),
])
def test_summary_shows_the_bound_that_decided(verdict, direction, shown):
    assert deciding_bound(Result.from_dict(_result(verdict=verdict, direction=direction))) == shown


def test_terminal_table_at_80_columns_keeps_ids_whole_and_the_metric():
    ids = [f"examples/digits/test_nppr_digits.py::test_{who}_model_under_learned_worst_case_noise"
           for who in ("standard", "noise_trained")]
    rows = [_result(test_id=i, metric="nppr", perturbation="LearnedGMM(eps=0.1, norm=linf, K=7, latent=128, "
                    "covariance=diagonal, dependency=joint)", details={"title": "NPPR"}) for i in ids]
    rows.append(_result(test_id="t.py::short", metric="corruption_accuracy", perturbation="UniformLinf(eps=0.3)",
                        details={"title": "corruption accuracy"}))
    lines = summary_lines(rows, 80)
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert all(i.rsplit("/", 1)[-1] in text for i in ids) and "…" not in text
    assert text.count("NPPR") == 2 and "corruption accuracy" in text
    assert "under LearnedGMM(eps=0.1, norm=linf, K=7, latent=128, covariance=diagonal," in text
    costs = [line.strip() for line in lines if line.strip().startswith("evaluations/budget ")]
    assert costs == [f"evaluations/budget {r['forward_passes']}/{r['budget']}, seconds {r['seconds']:.2f}, "
                     f"seed {r['seed']}" for r in rows]  # wrapped onto a line of their own, not dropped
    wide = summary_lines(rows, 400)
    assert len(wide) == 2 + len(rows) and wide[0].startswith("test ")  # one line per check when it fits


def test_wrap_breaks_at_separators_and_loses_nothing():
    pieces = wrap("test_nppr_digits.py::test_standard_model_under_learned_worst_case_noise", 30)
    assert all(len(p) <= 30 for p in pieces) and pieces[0] == "test_nppr_digits.py::"
    assert ("".join(p.strip() for p in pieces)
            == "test_nppr_digits.py::test_standard_model_under_learned_worst_case_noise")


def test_summary_markdown_escapes_pipes_and_lists_environment():
    text = summary_markdown([_result(perturbation="a|b")], {"torch": "2.14.1"})
    assert "a\\|b" in text and "- torch: 2.14.1" in text
