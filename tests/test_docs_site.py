"""The documentation site builds with `mkdocs build --strict` (a broken link, a missing page, a page
left out of the navigation or an API reference entry that no longer resolves fails it), README is
the front door that points into it, and the package ships what a real package ships."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: Project history has no place in user documentation.
HISTORY = re.compile(r"\bissue[- ]?#?\d+|\bthis session\b|project's sessions|\bround \d+\b|\bearlier we\b|"
                     r"\bbefore this work\b|\bgoal \d+ of\b", flags=re.I)


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]' (or make docs)")
    pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python",
                        reason="mkdocstrings[python] is not installed: pip install -e '.[docs]'")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "index.html").is_file() and (site / "tsrm" / "index.html").is_file()
    # the API reference is generated from the docstrings, not empty
    reference = (site / "reference" / "results" / "index.html").read_text()
    assert "Result" in reference and "decide" in reference


def test_every_docs_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert pages and not [p for p in pages if p not in nav]


def test_readme_is_the_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    for heading in ("## Install", "## Quick start", "## The checks", "## Settings", "## When something is wrong",
                    "## Documentation"):
        assert heading in text, heading
    assert "make demo" in text and "make test" in text and "pip install build" in text and "release is planned" in text


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "README links into docs/"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


@pytest.mark.parametrize("page", [README] + sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_project_history_in_user_docs(page):
    found = [m.group(0) for m in HISTORY.finditer(page.read_text())]
    assert not found, f"{page.name} tells project history: {found}"


def test_the_package_ships_license_types_and_urls():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert "the pytest-robust authors" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "pytest_robust" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["pytest_robust"]
    urls = pyproject["project"]["urls"]
    assert {"Homepage", "Documentation", "Repository", "Issues"} <= set(urls)
    assert {"docs", "test"} <= set(pyproject["project"]["optional-dependencies"])


def test_extending_lists_every_reserved_details_key():
    """The extending page's table of reserved ``details`` keys cannot drift from ``results.RESERVED_DETAILS``."""
    from pytest_robust.results import RESERVED_DETAILS

    page = (Path(__file__).parents[1] / "docs" / "extending.md").read_text()
    assert all(f"| `{key}` | {doc} |" in page for key, doc in RESERVED_DETAILS.items())
