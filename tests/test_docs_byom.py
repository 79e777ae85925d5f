"""The "bring your own model" page (docs/bring-your-own-model.md) runs as written: its library
examples in one namespace, block after block, and its conftest.py / test file pair as a pytest run
(with --robust-budget 400, as the page says)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("timm")

PAGE = Path(__file__).parents[1] / "docs" / "bring-your-own-model.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
#: Blocks that are files of a test suite, named by their first line ("# conftest.py").
FILES = {m.group(1): b for b in BLOCKS if (m := re.match(r"# (\S+\.py)\n", b))}
#: The first block shows the call's shape with names the page defines later; the rest run.
LIBRARY = [b for b in BLOCKS[1:] if not re.match(r"# \S+\.py\n", b)]


def test_the_page_has_its_examples():
    assert set(FILES) == {"conftest.py", "test_robustness.py"} and len(LIBRARY) == 7
    assert all("normalize=" in b for b in LIBRARY[:4]) and "logits=0" in LIBRARY[4]
    assert "transforms.Normalize" in LIBRARY[0] and "pretrained_cfg" in LIBRARY[2]  # your pipeline's statistics
    assert "image processor hold the statistics of the *pretrained*" in PAGE.read_text()
    assert "Linear(3 * 8 * 8, 1)" in LIBRARY[5] and "functools.partial" in LIBRARY[6]


@pytest.mark.parametrize("block", range(len(LIBRARY)))
def test_library_examples_run(block, capsys):
    exec(compile(LIBRARY[block], f"{PAGE.name} block {block}", "exec"), {"__name__": "docs_example"})
    assert "model evaluations" in capsys.readouterr().out


def test_pytest_example_runs_its_checks(pytester):
    pytester.makeconftest(FILES["conftest.py"])
    pytester.makepyfile(test_robustness=FILES["test_robustness.py"])
    result = pytester.runpytest("--robust-budget", "400", "--robust-report", "rep")
    results = json.loads((pytester.path / "rep" / "results.json").read_text())["results"]
    assert sorted(r["metric"] for r in results) == ["certified_accuracy", "tsrm"]
    assert all(r["verdict"] in ("pass", "fail", "inconclusive") for r in results), result.stdout.str()
    assert all("pixel units, normalized inside the model" in r["details"]["space"] for r in results)
