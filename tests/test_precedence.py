"""One precedence for every setting (issue 27): a marker or a suite check's own key > the command
line > a suite's settings: or --robust-config > ini > defaults (settings.keys.PRECEDENCE), the
same in the header, in results.json and in pytest's JUnit properties, and documented in one
table (docs/settings.md) that the README points to."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_suites import FACTORIES, REGISTER

from pytest_robust.settings.keys import PRECEDENCE

SUITE = """\
model: factories:step
data: factories:halves
settings: {budget: 20000, confidence: 0.95, seed: 5}
checks:
  - name: suite-settings
    tsrm: 0.5
    perturbation: {UniformLinf: {eps: 0.5}}
  - name: own-keys
    tsrm: 0.5
    budget: 700
    confidence: 0.9
    perturbation: {UniformLinf: {eps: 0.5}}
"""

MARKED = """
import pytest
import torch
from factories import halves, step

@pytest.fixture
def robust_model():
    return step(0.8)

@pytest.fixture
def robust_data():
    return halves()

@pytest.mark.robust(tsrm=0.5, perturbation=__import__("pytest_robust").UniformLinf(eps=0.5), budget=600)
def test_marked():
    pass

@pytest.mark.robust(tsrm=0.5, perturbation=__import__("pytest_robust").UniformLinf(eps=0.5))
def test_plain():
    pass
"""


def run(pytester: pytest.Pytester, *args) -> tuple[dict, dict, str]:
    """(results.json by test name, JUnit properties by test name, stdout) of a run with ``args``."""
    result = pytester.runpytest("--robust-report", "rep", "--junitxml=out.xml", *args)
    by_name = {r["test_id"].rsplit("::", 1)[-1]: r for r in
               json.loads((pytester.path / "rep" / "results.json").read_text())["results"]}
    props = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
             for case in ET.parse(pytester.path / "out.xml").getroot().iter("testcase")}
    return by_name, props, result.stdout.str()


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(REGISTER)
    pytester.makepyfile(factories=FACTORIES, test_marked=MARKED)
    pytester.makefile(".yaml", robust_toy=SUITE)
    pytester.makefile(".yaml", **{"robust-settings": "budget: 900\nconfidence: 0.99\n"})
    pytester.makeini("[pytest]\nrobust_budget = 800\nrobust_confidence = 0.97\n")
    return pytester


def test_the_command_line_beats_suite_settings_and_config_and_the_results_record_what_was_used(project):
    results, props, out = run(project, "--robust-budget", "300", "--robust-confidence", "0.8",
                              "--robust-config", "robust-settings.yaml")
    assert "budget=300 model evaluations" in out and "confidence=0.8" in out  # the header
    for name in ("suite-settings", "test_plain"):  # the command line over settings:, --robust-config and ini
        assert (results[name]["budget"], results[name]["confidence"]) == (300, 0.8)
        assert (props[name]["robust.budget"], props[name]["robust.confidence"]) == ("300", "0.8")
        assert results[name]["forward_passes"] <= 300
    assert (results["own-keys"]["budget"], results["own-keys"]["confidence"]) == (700, 0.9)  # a check's own keys
    assert (props["test_marked"]["robust.budget"], props["test_marked"]["robust.confidence"]) == ("600", "0.8")
    assert results["suite-settings"]["seed"] == 5  # not on the command line: the suite's settings:


def test_without_the_command_line_suite_settings_beat_config_which_beats_ini(project):
    results, _, out = run(project, "--robust-config", "robust-settings.yaml")
    assert (results["suite-settings"]["budget"], results["suite-settings"]["confidence"]) == (20000, 0.95)
    assert (results["test_plain"]["budget"], results["test_plain"]["confidence"]) == (900, 0.99)  # config > ini
    assert "budget=900 model evaluations" in out
    results, _, _ = run(project)
    assert (results["test_plain"]["budget"], results["test_plain"]["confidence"]) == (800, 0.97)  # ini


DOCS = Path(__file__).parents[1] / "docs" / "settings.md"


def test_docs_show_the_one_precedence_table():
    text = DOCS.read_text()
    table = re.search(r"<!-- precedence -->\n(.*?)\n<!-- /precedence -->", text, flags=re.S).group(1)
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Rank")]
    assert [tuple(c.strip() for c in row.strip("|").split("|"))[1:] for row in rows] == [tuple(p) for p in PRECEDENCE]
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "marker or per-check key > command line > suite `settings:` or `--robust-config` > ini > defaults" in readme
    assert "docs/settings.md" in readme
