"""What a suite names by import path and by perturbation name: model, data and reference factories
(``module:callable`` with their arguments, imported from the suite's folder or sys.path) and the
perturbations (built-in classes and those ``pytest_robust_perturbations`` hooks add)."""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from pytest_robust.checks.registry import suggest
from pytest_robust.errors import ArgumentError, FactoryError
from pytest_robust.suites.document import KeyPath, SuiteDocument, key_name, shown_value


@dataclass(frozen=True)
class Factory:
    """A ``module:callable`` from a suite, its keyword arguments and where it is written."""

    target: str
    function: Callable
    args: dict
    where: str  # "robust_digits.yaml:3: model", for messages

    @property
    def label(self) -> str:
        """``digits_model:load_model(name='standard')``: names the model in reports."""
        return f"{self.target}({', '.join(f'{k}={v!r}' for k, v in self.args.items())})"

    @property
    def key(self) -> tuple:
        return self.target, repr(sorted(self.args.items()))

    def build(self):
        try:
            return self.function(**self.args)
        except Exception as err:
            raise FactoryError(f"{self.where}: {self.label} raised {type(err).__name__}: {err}") from err


def import_target(doc: SuiteDocument, path: KeyPath, target, folder: Path) -> Callable:
    """The callable named ``module:attr`` (attr may be dotted), its module imported from the
    suite's folder (put on sys.path, as pytest's default import mode does for test files) or
    from sys.path."""
    example = "e.g. digits_model:load_model"
    if not isinstance(target, str) or target.count(":") != 1:
        hint = "; suites name factories, not fixtures" if isinstance(target, str) and target.isidentifier() else ""
        raise doc.error(path, f"expected an import path 'module:callable' ({example}), got {shown_value(target)}{hint}")
    module_name, attr = target.split(":")
    if not all(part.isidentifier() for part in module_name.split(".") + attr.split(".")):
        raise doc.error(path, f"{target!r} is not an import path 'module:callable' ({example})")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise doc.error(path, f"module {module_name!r} not found (looked in {folder} and on sys.path)") from None
        raise doc.error(path, f"importing {module_name!r} failed: {type(err).__name__}: {err}") from None
    except Exception as err:
        raise doc.error(path, f"importing {module_name!r} raised {type(err).__name__}: {err}") from None
    value = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise doc.error(path, f"module {module_name!r} has no attribute {attr!r}"
                                  f"{suggest(part, [n for n in dir(value) if not n.startswith('_')])}")
        value = getattr(value, part)
    if not callable(value):
        raise doc.error(path, f"{target!r} is not callable (it is {shown_value(value)})")
    return value


def factory(doc: SuiteDocument, path: KeyPath, mapping: dict, role: str, folder: Path,
             default: Factory | None = None) -> Factory:
    """The ``role`` ("model" or "data") factory of ``mapping`` (the suite or one check).

    In a check, ``<role>_args`` alone re-uses the suite's factory with other arguments, and
    without either key the check uses the suite's factory as it is (``default``).
    """
    args_key = f"{role}_args"
    if role not in mapping and args_key not in mapping and default is not None:
        return default
    what = f"a mapping of keyword arguments of the {role} factory"
    args = doc.mapping(path + (args_key,), mapping.get(args_key), what)
    if role in mapping:
        target = mapping[role]
        function = import_target(doc, path + (role,), target, folder)
        where_path = path + (role,)
    else:
        target, function, where_path = default.target, default.function, path + (args_key,)
    try:
        inspect.signature(function).bind(**args)
    except TypeError as err:
        raise doc.error(path + (args_key,), f"{target} cannot take these arguments: {err}") from None
    except ValueError:
        pass  # no signature to check (some builtins); a mismatch shows when it is called
    return Factory(target, function, dict(args), f"{doc.where}:{doc.line(where_path)}: {key_name(where_path)}")


def perturbation_of(doc: SuiteDocument, path: KeyPath, raw, factories: dict[str, Callable]):
    """Build ``Name`` or ``{Name: {param: value}}`` with the named factory."""
    if isinstance(raw, str):
        name, params, at = raw, {}, path
    elif isinstance(raw, dict) and len(raw) == 1:
        ((name, params),) = raw.items()
        at = path + (name,)
        params = doc.mapping(at, params, f"the parameters of {name} as a mapping, e.g. {{eps: 0.1}}")
    else:
        raise doc.error(path, f"expected a perturbation name or {{Name: {{param: value}}}}, "
                              f"e.g. {{UniformLinf: {{eps: 0.1}}}}; got {shown_value(raw)}")
    if name not in factories:
        known = ", ".join(factories)
        raise doc.error(at, f"unknown perturbation {name!r}{suggest(name, factories)}; known: {known}")
    factory = factories[name]
    try:
        return factory(**params)
    except ArgumentError as err:
        raise doc.error(at, f"{name}({_call_args(params)}): {err}") from None
    except TypeError as err:
        raise doc.error(at, f"{name}({_call_args(params)}): {err}{_takes(name, factory)}") from None
    except ValueError as err:
        raise doc.error(at, f"{name}({_call_args(params)}): {err}") from None


def _call_args(params: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


def _takes(name: str, factory: Callable) -> str:
    try:
        parameters = list(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return ""
    return f"; {name} takes " + (", ".join(parameters) if parameters else "no parameters")


def perturbation_factories(hook) -> dict[str, Callable]:
    """Built-in perturbations plus those returned by ``pytest_robust_perturbations`` hooks
    (``hook`` is a node's ``ihook``, so conftest.py files apply to the suites below them).

    A hook may add names, not replace built-ins; two hooks may not claim the same name.
    Raises ``pytest.UsageError`` for a hook that returns anything else."""
    from pytest_robust.perturbations import BY_NAME  # torch, once a suite is collected

    factories = dict(BY_NAME)
    added: dict[str, Callable] = {}
    for returned in hook.pytest_robust_perturbations():
        if returned is None:
            continue
        if not isinstance(returned, dict):
            raise pytest.UsageError(
                f"pytest_robust_perturbations must return a dict {{name: factory}}, got {returned!r}"
            )
        for name, factory in returned.items():
            if not (isinstance(name, str) and name.isidentifier() and callable(factory)):
                raise pytest.UsageError(
                    f"pytest_robust_perturbations returned {name!r}: {factory!r}; names must be identifiers "
                    "and factories callables"
                )
            if name in factories:
                raise pytest.UsageError(f"pytest_robust_perturbations: {name!r} is a built-in perturbation; "
                                        "a hook may only add new names")
            if name in added and added[name] is not factory:
                raise pytest.UsageError(f"pytest_robust_perturbations: two hooks define {name!r}")
            added[name] = factory
    return {**factories, **added}
