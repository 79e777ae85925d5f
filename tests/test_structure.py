"""The shape of the package (docs/architecture.md): no import cycle, layers that import downward
only, a small package root and small modules. Imports inside functions count: a lazy import may
keep torch out of the plugin's start-up, never hide an upward import."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_robust"

#: Layer of each sub-package (the package root's modules are the pytest layer, 8): a module may
#: import from a lower layer, or from its own sub-package; the pytest layer's modules import each other.
LAYERS = {"errors": 0, "results": 0, "files": 1, "settings": 2, "stats": 2, "engine": 3, "perturbations": 4,
          "procedures": 5, "attacks": 5, "checks": 6, "report": 7, "suites": 8}
PYTEST_LAYER = 8
ROOT_MODULES_MAX = 12
MODULE_LINES_MAX = 400


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, module: str, known: set) -> set:
    """The package modules ``module`` imports anywhere in its file (inside functions too)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else (node.module or "")
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return (found & known) - {module}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], PYTEST_LAYER) if len(parts) > 1 else PYTEST_LAYER


def _home(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else module


def test_the_package_has_no_import_cycle_counting_imports_inside_functions():
    files = _modules()
    graph = {m: _imports(p, m, set(files)) for m, p in files.items()}
    cycles, done = [], set()

    def visit(m, path):
        if m in path:
            cycles.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        for n in sorted(graph[m]):
            visit(n, path + [m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])
    assert cycles == []


def test_layers_import_downward_only():
    files = _modules()
    upward = []
    for m, p in files.items():
        for target in _imports(p, m, set(files)) - {"pytest_robust"}:
            mine, theirs = _layer(m), _layer(target)
            same_home = _home(m) == _home(target) or mine == theirs == PYTEST_LAYER
            if mine < theirs or (mine == theirs and not same_home):
                upward.append(f"{m} (layer {mine}) imports {target} (layer {theirs})")
    assert upward == []


def test_the_layer_table_names_every_sub_package():
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(LAYERS) - {"errors", "results", "files"}


def test_the_root_is_small_and_no_module_is_long():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MODULES_MAX, root
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MODULE_LINES_MAX}
    assert long == {}


def test_the_layer_rule_sees_an_upward_import(tmp_path):
    """The rule is not vacuous: an engine module importing a check breaks it."""
    fake = tmp_path / "run.py"
    fake.write_text("from pytest_robust.checks.registry import Metric\n")
    files = set(_modules())
    imported = _imports(fake, "pytest_robust.engine.run", files)
    assert imported == {"pytest_robust.checks.registry"}
    assert _layer("pytest_robust.engine.run") < _layer("pytest_robust.checks.registry")
