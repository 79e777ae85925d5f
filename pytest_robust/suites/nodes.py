"""The pytest side of suites: ``robust_*.yaml`` files collected as ``SuiteFile`` with one
``SuiteItem`` per check."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_robust.errors import FactoryError, RobustError, SuiteError
from pytest_robust.recording import COMMAND_LINE, RECORDED, SETTINGS, SPECS, enforce, metrics, run_spec
from pytest_robust.suites.factories import Factory, perturbation_factories
from pytest_robust.suites.schema import Check, load_suite


def is_suite_file(file_path: Path) -> bool:
    """True for ``robust_*.yaml`` and ``robust_*.yml``."""
    return file_path.name.startswith("robust_") and file_path.suffix in (".yaml", ".yml")


def collect_file(file_path: Path, parent: pytest.Collector) -> "SuiteFile | None":
    """The ``pytest_collect_file`` implementation: a ``SuiteFile`` node for suite files."""
    if is_suite_file(file_path):
        return SuiteFile.from_parent(parent, path=file_path)
    return None


# ---------------------------------------------------------------------------------------------
# pytest nodes
# ---------------------------------------------------------------------------------------------


class SuiteFile(pytest.File):
    """A ``robust_*.yaml`` file: one ``SuiteItem`` per check; builds the models and data its
    checks need once (per factory, arguments and device) and shares them between its items."""

    def collect(self):
        try:
            checks = load_suite(self.path, self.nodeid, self.config.stash[SETTINGS],
                                perturbation_factories(self.ihook), metrics(self.config),
                                command_line=self.config.stash.get(COMMAND_LINE, {}))
        except SuiteError as err:
            raise self.CollectError(str(err)) from None
        except pytest.UsageError as err:
            raise self.CollectError(f"{self.nodeid}: {err}") from None
        self._built: dict[tuple, object] = {}
        for check in checks:
            yield SuiteItem.from_parent(self, name=check.name, check=check)

    def built(self, factory: Factory, device=None):
        """The factory's result, built on first use (moved to ``device`` when given and the
        result has ``.to``); a factory that raised raises the same ``FactoryError`` again."""
        key = factory.key + (str(device),)
        if key not in self._built:
            try:
                value = factory.build()
                if device is not None and hasattr(value, "to"):
                    value = value.to(device)
            except FactoryError as err:
                value = err
            self._built[key] = value
        value = self._built[key]
        if isinstance(value, FactoryError):
            raise value
        return value


class SuiteItem(pytest.Item):
    """One check of a suite file, run with the same machinery as a ``robust`` marker."""

    def __init__(self, *, check: Check, **kwargs):
        super().__init__(**kwargs)
        self.check = check
        self.stash[SPECS] = [check.spec]  # recorded as not run if the item fails before its check
        if check.profile.name:
            self.user_properties.append(("robust.profile", check.profile.name))
        if check.skip_reason:
            self.add_marker(pytest.mark.skip(reason=check.skip_reason))

    def runtest(self) -> None:
        from pytest_robust.engine.device import resolve_device

        settings = self.check.settings
        try:
            device = resolve_device(settings.device)
        except RobustError as err:
            pytest.fail(f"robust check could not run: {err}", pytrace=False)
        model = self.parent.built(self.check.model, device)
        data = self.parent.built(self.check.data)
        spec = self.check.spec
        if spec.paired:  # the reference model's factory, built like the model's; recorded as the declared check
            spec = dataclasses.replace(spec, paired={**spec.paired,
                                                     "reference": self.parent.built(spec.paired["reference"], device)})
            self.stash.setdefault(RECORDED, set()).add(id(self.check.spec))
        result = run_spec(self, spec, model, data, settings, self.check.model.label)
        enforce([(settings, result)])

    def reportinfo(self):
        # the domain titles failure sections; bracketed like doctest's "[doctest] name" so that
        # pytest does not read the dots of a name such as "uniform-0.1" as "::" separators
        return self.path, self.check.line - 1, f"[robust suite] {self.name}"

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, FactoryError):
            return excinfo.value.report()
        return super().repr_failure(excinfo, style=style)
