"""Every code block of README.md and docs/*.md runs as written, so the documentation cannot rot.

Blocks are fenced with their language, and every fence must name one of ``LANGUAGES``:

- ``python`` blocks that are test files (they contain ``def test_`` or start with a ``# test_x.py``
  comment) run in a pytest run of their own (``pytester``); a ``# conftest.py`` block is the
  conftest of the headed test files and YAML suites that follow it on the same page (a conftest
  block that nothing follows runs on its own, with one empty test). Fixtures the examples take
  for granted come from ``DOCS_FIXTURES``: ``robust_model`` (the digits standard CNN of
  examples/digits), ``noise_model`` (its noise-trained twin), ``smoothed_model`` (trained with
  Gaussian noise at sigma 0.25) and ``robust_data`` (the first ``N_INPUTS`` held-out test digits);
  a page's own conftest overrides them;
- a ``python`` block headed ``# name.py`` that is neither a test file nor a conftest is a module:
  the blocks after it on the same page can import it (it is saved as ``name.py`` beside them, as a
  reader would save it);
- other ``python`` blocks are executed, each in a fresh namespace holding ``model`` (the standard
  CNN), ``noise_model``, ``x``, ``y`` and ``data = (x, y)``, as the pages call them;
- ``yaml`` blocks must parse, and a ``# robust_x.yaml`` block is a suite that runs like a test file;
- ``toml`` blocks must parse; ``bash``, ``console`` and ``text`` blocks are not run (commands,
  output, and anything that needs a GPU or the network).

A line ``--8<-- "path"`` (pymdownx.snippets, as the site renders it) is replaced by that file of the
repository before a block runs.

docs/bring-your-own-model.md is run by tests/test_docs_byom.py (it needs transformers and timm).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "bring-your-own-model.md")
DIGITS = ROOT / "examples" / "digits"
LANGUAGES = {"python", "yaml", "toml", "bash", "console", "text"}
#: Held-out test digits the examples run on: enough for every check, few enough to stay fast.
N_INPUTS = 16

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", flags=re.M | re.S)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"[ \t]*$', flags=re.M)
HEADER = re.compile(r"# (\S+\.(?:py|ya?ml))\n")

DOCS_FIXTURES = f"""
import sys

import pytest

sys.path.insert(0, {str(DIGITS)!r})
from digits_model import digits_split, load_model  # noqa: E402


@pytest.fixture(scope="session")
def robust_model(robust_device):
    return load_model("standard").to(robust_device)


@pytest.fixture(scope="session")
def noise_model(robust_device):
    return load_model("noise").to(robust_device)


@pytest.fixture(scope="session")
def smoothed_model(robust_device):
    return load_model("gaussian_0.25").to(robust_device)


@pytest.fixture(scope="session")
def robust_data():
    x, y = digits_split()[1]
    return x[:{N_INPUTS}], y[:{N_INPUTS}]
"""


class Block:
    def __init__(self, page: Path, line: int, language: str, code: str):
        self.page, self.line, self.language, self.code = page, line, language, code
        header = HEADER.match(code)
        self.file = header.group(1) if header else None
        self.conftest: Block | None = None  # the page's conftest for a headed test file or suite
        self.modules: list[Block] = []  # the page's module blocks before this one
        self.standalone = False  # a conftest block that no test file or suite follows

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_test_file(self) -> bool:
        if self.language != "python" or self.file == "conftest.py":
            return False
        return "def test_" in self.code or (self.file or "").startswith("test_")

    @property
    def is_module(self) -> bool:
        return self.language == "python" and self.file not in (None, "conftest.py") and not self.is_test_file

    @property
    def is_suite(self) -> bool:
        return self.language == "yaml" and re.fullmatch(r"robust_\w+\.ya?ml", self.file or "") is not None


def read_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    blocks = [Block(page, text.count("\n", 0, m.start()) + 1, m.group(1).strip(),
                    SNIPPET.sub(lambda s: (ROOT / s.group(1)).read_text(), m.group(2)))
              for m in FENCE.finditer(text)]
    conftest, used, modules = None, set(), []
    for block in blocks:
        block.modules = list(modules)
        if block.is_module:
            modules.append(block)
        if block.language == "python" and block.file == "conftest.py":
            conftest = block
        elif (block.is_test_file and block.file) or block.is_suite:
            block.conftest = conftest
            if conftest is not None:
                used.add(id(conftest))
    for block in blocks:
        block.standalone = block.language == "python" and block.file == "conftest.py" and id(block) not in used
    return blocks


BLOCKS = [block for page in PAGES for block in read_blocks(page)]
RUNS = [b for b in BLOCKS if b.is_test_file or b.is_suite or b.standalone]
EXECS = [b for b in BLOCKS if b.language == "python" and not b.is_test_file and b.file != "conftest.py"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The digits CNN is tiny: one thread computes it as fast as two, without fighting a neighbour.

    Also imports the extension modules the examples use before any pytester run: pytester removes
    the modules a run imported, and numpy or torch cannot be imported twice in one process."""
    import sklearn.datasets  # noqa: F401
    import torch

    try:
        import matplotlib.pyplot  # noqa: F401  (the report directory's plots)
    except ImportError:
        pass
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def digits():
    sys.path.insert(0, str(DIGITS))
    try:
        from digits_model import digits_split, load_model
    finally:
        sys.path.remove(str(DIGITS))
    x, y = digits_split()[1]
    return {"model": load_model("standard"), "noise_model": load_model("noise"), "x": x[:N_INPUTS], "y": y[:N_INPUTS]}


def test_every_fence_names_its_language():
    bad = [f"{b.id} ({b.language or 'no language'})" for b in BLOCKS if b.language not in LANGUAGES]
    assert not bad, f"fence these blocks as one of {sorted(LANGUAGES)}: {bad}"


def test_the_pages_have_code_to_run():
    assert len(RUNS) >= 10 and len(EXECS) >= 10, (len(RUNS), len(EXECS))
    assert any(b.page.name == "README.md" and b.conftest is not None for b in RUNS), "README's quick start"


#: What the docs tests hand a library block (``test_python_blocks_run``): a reader must be told.
GIVEN = {"model": "`model`", "noise_model": "`noise_model`", "x": "(x, y)", "y": "(x, y)", "data": "`data`"}


def _free_names(code: str) -> set[str]:
    """The names of ``GIVEN`` a block reads without defining them (assignment, import, argument)."""
    import ast

    tree = ast.parse(code)
    defined = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    defined |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    defined |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return (read & set(GIVEN)) - defined


@pytest.mark.parametrize("block", [b for b in EXECS if _free_names(b.code)], ids=lambda b: b.id)
def test_a_block_that_uses_a_model_or_data_it_does_not_define_says_what_they_are(block):
    """The text before the block (since the previous block) or the block's comments name each
    model or data the block takes for granted, as a reader needs them."""
    before = "\n".join(block.page.read_text().split("\n")[:block.line - 1])
    lead = before.split("```")[-1]  # the whole page before it when it is the first block
    told = lead + "\n".join(line for line in block.code.splitlines() if line.lstrip().startswith("#"))
    untold = [name for name in sorted(_free_names(block.code)) if GIVEN[name] not in told]
    assert not untold, f"say what {', '.join(untold)} are before the block (e.g. `model` is your classifier)"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language == "yaml"], ids=lambda b: b.id)
def test_yaml_blocks_parse(block):
    assert yaml.safe_load(block.code) is not None


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language == "toml"], ids=lambda b: b.id)
def test_toml_blocks_parse(block):
    assert tomllib.loads(block.code)


@pytest.mark.parametrize("block", EXECS, ids=lambda b: b.id)
def test_python_blocks_run(block, digits, tmp_path, monkeypatch):
    for module in block.modules:
        (tmp_path / module.file).write_text(module.code)
        monkeypatch.delitem(sys.modules, Path(module.file).stem, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace = {"__name__": "docs_example", **digits, "data": (digits["x"], digits["y"])}
    exec(compile(block.code, block.id, "exec"), namespace)
    for module in block.modules:
        sys.modules.pop(Path(module.file).stem, None)


@pytest.mark.parametrize("block", RUNS, ids=lambda b: b.id)
def test_test_files_and_suites_run(block, pytester, tmp_path_factory):
    pytester.makepyfile(docs_fixtures=DOCS_FIXTURES)
    for module in block.modules:
        (pytester.path / module.file).write_text(module.code)
    pytester.syspathinsert()
    if block.conftest is not None or block.file == "conftest.py":
        pytester.makeconftest((block.conftest or block).code)
    if block.is_suite:
        (pytester.path / block.file).write_text(block.code)
    elif block.file == "conftest.py":
        pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    else:
        pytester.makepyfile(**{Path(block.file or "test_block.py").stem: block.code})
    cache = tmp_path_factory.getbasetemp() / "robust_cache"  # NPPR fits shared between the blocks
    reprec = pytester.inline_run("-p", "docs_fixtures", "--robust-report", "rep", "--robust-cache-dir", str(cache))
    passed, skipped, failed = reprec.listoutcomes()
    errors = [r for r in reprec.getreports("pytest_collectreport") if r.failed]
    assert not errors, "\n".join(r.longreprtext for r in errors)
    assert passed or failed or skipped, "no test ran"
    results_file = pytester.path / "rep" / "results.json"
    results = json.loads(results_file.read_text())["results"] if results_file.exists() else []
    bad = [r for r in results if r["verdict"] not in ("pass", "fail", "inconclusive", "estimate", "skipped")]
    assert not bad, bad
    # A robustness check that fails (or is inconclusive) is a fine example: its test fails with the
    # checks' messages and nothing else. A test body that raises, or a check that could not run, is
    # a broken example.
    from pytest_robust.results import Result

    messages = {Result.from_dict(r).message() for r in results if r["verdict"] in ("fail", "inconclusive")}
    for report in failed:
        lines = [line for line in report.longreprtext.splitlines() if line.strip()]
        assert report.when == "call" and lines and set(lines) <= messages, report.longreprtext
