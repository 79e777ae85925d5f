"""MkDocs hook of the documentation site (mkdocs.yml: ``hooks``).

In the API reference, ``::: pytest_robust.<name>`` documents the object the package exports under
that name, wherever it is defined: the package imports its names lazily, so mkdocstrings is given
the module that holds the object (``pytest_robust._EXPORTS``, else the object's ``__module__``).
A module may move without the reference pages changing; a name the package stops exporting fails
the strict build. mkdocs.yml sets ``force_inspection``: griffe imports the package and documents
the objects as they are at run time (signatures and docstrings of generated callables included).
"""

from __future__ import annotations

import importlib
import importlib.util
import re

EXPORTED = re.compile(r"^::: pytest_robust\.(\w+)[ \t]*$", flags=re.M)


def _holder(name: str) -> str | None:
    package = importlib.import_module("pytest_robust")
    if importlib.util.find_spec(f"pytest_robust.{name}") is not None:
        return None  # a module of the package: mkdocstrings finds it by its path
    exports = getattr(package, "_EXPORTS", {})
    if name in exports:
        return exports[name]
    obj = getattr(package, name, None)
    return getattr(obj, "__module__", None)


def _claim(holder: str, name: str) -> None:
    """Make an exported object generated elsewhere (the library functions are made by
    ``pytest_robust.library.function``) belong to the module that holds it, for this build only:
    griffe inspects ``__module__`` and would otherwise take the object for an import of a name
    that its factory's module does not have."""
    obj = getattr(importlib.import_module(holder), name, None)
    home = getattr(obj, "__module__", None)
    if home and home != holder and getattr(importlib.import_module(home), name, None) is not obj:
        obj.__module__ = holder


def on_pre_build(config):
    """Claim every exported object before any page is read (mkdocstrings loads the whole package at
    its first ``:::``, whichever page that is on)."""
    package = importlib.import_module("pytest_robust")
    for name in getattr(package, "__all__", ()):
        holder = _holder(name)
        if holder:
            _claim(holder, name)


def on_page_markdown(markdown, page, config, files):
    def resolve(match):
        holder = _holder(match.group(1))
        return f"::: {holder}.{match.group(1)}" if holder else match.group(0)

    return EXPORTED.sub(resolve, markdown)
