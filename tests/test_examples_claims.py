"""The examples tell the truth: every expected failure (xfail) in examples/ says why, strictly, and
the digits suite fails an expected failure whose checks do not show what its reason claims
(examples/digits/claims.py, applied by examples/digits/conftest.py in every `make demo`)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DIGITS = EXAMPLES / "digits"


def _claims():
    spec = importlib.util.spec_from_file_location("digits_claims", DIGITS / "claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _xfails():
    """(file, test name, keywords) of every xfail decorator in examples/."""
    for path in sorted(EXAMPLES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("mark.xfail"):
                    yield path.relative_to(ROOT), node.name, {k.arg: k.value for k in decorator.keywords}


XFAILS = list(_xfails())


def test_the_examples_have_expected_failures():
    assert len(XFAILS) >= 5


@pytest.mark.parametrize("path, name, keywords", XFAILS, ids=[f"{p}::{n}" for p, n, _ in XFAILS])
def test_every_expected_failure_says_why_and_is_strict(path, name, keywords):
    reason = keywords.get("reason")
    text = ast.literal_eval(reason) if reason is not None else ""
    assert isinstance(text, str) and len(text) > 20, f"{path}::{name}: an xfail needs a reason= saying what it shows"
    assert "strict" in keywords and ast.literal_eval(keywords["strict"]) is True, f"{path}::{name}: strict=True"


def test_the_digits_suite_checks_every_expected_failure_against_its_verdicts():
    tree = ast.parse((DIGITS / "conftest.py").read_text())
    hooks = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "pytest_runtest_makereport"]
    assert hooks and "claim_problem" in ast.unparse(hooks[0])


@pytest.mark.parametrize(
    "reason, verdicts, shown",
    [
        ("far below the requirement: this gate shows a failure", ["fail"], True),
        ("far below the requirement: this gate shows a failure", ["inconclusive"], False),  # the demo's old lie
        ("far below the requirement: this gate shows a failure", ["fail", "inconclusive"], False),
        ("far below the requirement: this gate shows a failure", ["error"], False),  # could not run: shows nothing
        ("far below the requirement: this gate shows a failure", [], False),
        ("inconclusive at this budget: the bounds straddle 0.3", ["inconclusive"], True),
        ("inconclusive at this budget: the bounds straddle 0.3", ["fail"], False),  # it fails: say so
    ],
)
def test_a_claim_is_shown_only_by_the_verdict_it_names(reason, verdicts, shown):
    problem = _claims().claim_problem(reason, verdicts)
    assert (problem is None) == shown
    if problem:
        assert "inconclusive at this budget" in problem and str(verdicts) in problem
