"""Console output shown in the docs is what the tool prints (issue 27): each shown run is rerun
here and its lines must appear, in order, in the real output (timings, which vary, aside). On a
mismatch the message holds the real output to paste."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from test_docs_code_blocks import read_blocks

from pytest_robust.suites.factories import perturbation_factories
from pytest_robust.suites.schema import load_suite

ROOT = Path(__file__).parents[1]
QUICK_STARTS = [ROOT / "README.md", ROOT / "docs" / "quick-start.md"]


def normalized(text: str) -> list[str]:
    """Lines without what varies between runs (durations, the padding of pytest's rules)."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"^[=_-]{3,} (.*?) [=_-]{3,}$", r"== \1 ==", line.rstrip())
        line = re.sub(r"\bin \d+\.\d+s\b", "in <t>s", line)
        line = re.sub(r"\bseconds \d+\.\d+", "seconds <t>", line)
        line = re.sub(r" {2,}", " ", line)
        if line.strip():
            out.append(line.strip())
    return out


def in_order(shown: list[str], real: list[str]) -> list[str]:
    """The shown lines that are not found, in order, among the real ones."""
    missing, at = [], 0
    for line in shown:
        hit = next((i for i in range(at, len(real)) if real[i] == line), None)
        if hit is None:
            missing.append(line)
        else:
            at = hit + 1
    return missing


@pytest.mark.skipif(torch.cuda.is_available(), reason="the docs show a run on a machine without a GPU")
@pytest.mark.parametrize("page", QUICK_STARTS, ids=lambda p: p.name)
def test_the_quick_start_output_is_what_the_quick_start_prints(page, pytester, monkeypatch):
    blocks = {b.file: b for b in read_blocks(page) if b.file}
    shown = next(b.code for b in read_blocks(page) if b.language == "text" and b.code.startswith("$ pytest"))
    pytester.makeconftest(blocks["conftest.py"].code)
    pytester.makepyfile(test_robustness=blocks["test_robustness.py"].code)
    monkeypatch.setenv("COLUMNS", "120")
    for ci_marker in ("CI", "BUILD_NUMBER"):  # on CI pytest does not shorten the summary lines the docs show
        monkeypatch.delenv(ci_marker, raising=False)
    real = pytester.runpytest("test_robustness.py", "-p", "no:cacheprovider").stdout.str()
    missing = in_order(normalized(shown)[1:], normalized(real))
    assert not missing, f"{page.name}: not printed:\n" + "\n".join(missing) + "\n\nthe real output:\n" + real


def test_the_suite_error_examples_are_the_errors_of_those_mistakes():
    """docs/yaml-suites.md shows three collection errors of examples/digits/robust_digits.yaml: each
    is made here, in a copy of the suite, and its message compared."""
    page = ROOT / "docs" / "yaml-suites.md"
    shown = next(b.code for b in read_blocks(page) if b.language == "text" and "robust_digits.yaml:" in b.code)
    suite = (ROOT / "examples" / "digits" / "robust_digits.yaml").read_text()
    mistakes = {
        "unknown perturbation": suite.replace("{UniformLinf: {eps: 0.2}}", "{Uniform: {eps: 0.2}}", 1),
        "not found": suite.replace("model: digits_model:load_model", "model: digit_model:load_model", 1),
        "nighty": suite,
    }
    from pytest_robust.checks import BUILTIN
    from pytest_robust.errors import SuiteError
    from pytest_robust.settings.keys import Settings

    hooks = perturbation_factories(type("NoHook", (), {"pytest_robust_perturbations": lambda self: []})())
    for (key, text), line in zip(mistakes.items(), shown.splitlines()):
        path = ROOT / "examples" / "digits" / "robust_digits.yaml"
        copy = path.with_name("robust_digits_copy_for_docs.yaml")
        copy.write_text(text)
        try:
            with pytest.raises(SuiteError) as err:
                load_suite(copy, "robust_digits.yaml", Settings(profile="nighty" if key == "nighty" else None),
                           hooks, BUILTIN)
        finally:
            copy.unlink()
        real = str(err.value).replace(str(path.parent), "/src/examples/digits")
        assert real == line, f"docs/yaml-suites.md shows\n{line}\nthe error is\n{real}"
        assert str(err.value).startswith(f"robust_digits.yaml:{real.split(':')[1]}: ")


def test_the_certified_accuracy_message_is_the_reruns():
    """docs/certified.md's failing message: the noise-trained digits CNN on 50 held-out digits."""
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "digits"))
    from digits_model import digits_split, load_model

    from pytest_robust import certified_accuracy

    x, y = digits_split()[1]
    result = certified_accuracy(load_model("gaussian_0.25"), (x[:50], y[:50]), threshold=0.9, radius=0.5, sigma=0.25)
    page = (ROOT / "docs" / "certified.md").read_text()
    shown = next(b.code for b in read_blocks(ROOT / "docs" / "certified.md")
                 if b.language == "text" and b.code.startswith("certified accuracy"))
    assert " ".join(shown.split()) == result.message() and "failing check's message" in page
