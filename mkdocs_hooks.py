"""MkDocs hook of the documentation site (mkdocs.yml: ``hooks``).

In the API reference, ``::: pytest_robust.<name>`` documents the object the package exports under
that name, wherever it is defined: the package imports its names lazily, so mkdocstrings is given
the module that holds the object (``pytest_robust._EXPORTS``, else the object's ``__module__``).
A module may move without the reference pages changing; a name the package stops exporting fails
the strict build. The library functions are generated (``checks.library.function``) and carry the
``__module__`` of their check's body module, so griffe finds them where ``_EXPORTS`` says.
mkdocs.yml sets ``force_inspection``: griffe imports the package and documents
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


def on_page_markdown(markdown, page, config, files):
    def resolve(match):
        holder = _holder(match.group(1))
        return f"::: {holder}.{match.group(1)}" if holder else match.group(0)

    return EXPORTED.sub(resolve, markdown)
