"""Every message, option help and docstring of the package that points at documentation points at
a page that exists, and at a section of it that exists (issue 27): "docs/<page>.md, '<section>'",
"README, '<section>'" and "(docs: <page>)"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SOURCES = sorted((ROOT / "pytest_robust").rglob("*.py"))
#: A page, optionally followed by the title (or the start of the title) of one of its sections.
POINTER = re.compile(r"(docs/[\w-]+\.md|README(?:\.md)?)(?:,? (?:section )?'([^']+)')?|\(docs: ([\w-]+)\)")


def pointers() -> list[tuple[str, str, str | None]]:
    found = []
    for path in SOURCES:
        text = re.sub(r'"\s*\n\s*(?:f?")', "", path.read_text())  # join implicitly concatenated strings
        for m in POINTER.finditer(text):
            page = m.group(1) or f"docs/{m.group(3)}.md"
            page = "README.md" if page.startswith("README") else page
            found.append((path.relative_to(ROOT).as_posix(), page, m.group(2)))
    return found


def test_the_package_points_at_its_docs():
    pages = {page for _, page, _ in pointers()}
    assert {"docs/bring-your-own-model.md", "docs/settings.md", "docs/reports-and-baselines.md",
            "docs/extending.md"} <= pages


@pytest.mark.parametrize("source, page, section", pointers())
def test_every_pointer_names_a_page_and_section_that_exist(source, page, section):
    assert (ROOT / page).is_file(), f"{source} points at {page}, which does not exist"
    if section:
        titles = [line.lstrip("#").strip() for line in (ROOT / page).read_text().splitlines() if line.startswith("#")]
        assert any(t.startswith(section) for t in titles), f"{source} points at {page}, '{section}': no such section"


PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_install_instructions_work_without_an_index_release(page):
    """No release is on a package index yet: no page installs pytest-robust from one, every
    ``python -m build`` comes with ``pip install build``, and a wheel named in full has the
    version of pyproject.toml."""
    import tomllib

    text = page.read_text()
    assert not re.search(r"pip install '?pytest-robust", text), f"{page.name} installs from a package index"
    if "python -m build" in text:
        assert "pip install build" in text
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert set(re.findall(r"pytest_robust-(\d[\w.]*)-py3", text)) <= {version}
