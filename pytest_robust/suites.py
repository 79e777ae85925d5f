"""Declarative suites: ``robust_*.yaml`` files collected as pytest tests, one test per check.

A suite names its model and data by import path, the checks with their thresholds, and profiles
that scale the draw budgets::

    model: digits_model:load_model        # "module:callable"; the module is imported from the
    model_args: {name: standard}          #   suite's folder or sys.path, called with model_args
    data: digits_factories:held_out       # returns (x, y), a Dataset or a DataLoader
    settings: {confidence: 0.95}          # suite-wide settings: settings.KEYS but model, data,
                                          #   profile and report (see NOT_IN_SUITES)
    profiles:                             # chosen with --robust-profile NAME; default: ci if defined
      smoke: {budget_scale: 0.1, inconclusive: skip}
      ci: {budget_scale: 1}
      nightly: {budget_scale: 10}
    checks:
      - name: uniform-0.1                 # the test id: robust_digits.yaml::uniform-0.1
        tsrm: 0.95                        # a metric and its threshold, as on a robust marker
        perturbation: {UniformLinf: {eps: 0.1}}
        budget: 20000                     # per-check settings
      - name: noise-trained
        model_args: {name: noise}         # per-check model (or data) factory and arguments
        tsrm: 0.9
        perturbation: {UniformLinf: {eps: 0.3}}
      - name: q100
        profiles: [nightly]               # runs only under these profiles (skipped otherwise)
        q: 100
        max_loss: 0.5

A check takes the same keywords as a ``robust`` marker (``checks.parse_marker``); a perturbation
is written ``{Name: {param: value}}`` or ``Name``, where Name is a built-in perturbation or one
that a ``pytest_robust_perturbations`` hook adds. Settings resolve as: session (defaults < ini <
--robust-config < command line) < the suite's ``settings`` < the selected profile's settings <
the check's own keys; the resulting budget is then multiplied by the profile's ``budget_scale``
(rounded, at least 1). A suite without ``profiles`` runs every check at scale 1 whatever profile
is chosen; a suite with ``profiles`` must define the chosen one.

Everything but the factory calls is checked at collection (which imports the factories'
modules, and so torch): a malformed suite is a collection error of its file (the run stops
with exit code 2 before any test runs) whose message names the file, the line and the key, e.g.
``robust_digits.yaml:14: checks[1].perturbation: unknown perturbation 'Uniform'; known: ...``.
Check indices count from 0. The model and data factories are called when the file's first test
runs (once per file and device); a factory that raises fails the file's tests, with the same
location and the factory's own traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from .checks import CheckSpec, budget_of, parse_marker, suggest
from .errors import ArgumentError, FactoryError, MarkerError, RobustError, SettingError, SuiteError
from .recording import RECORDED, SETTINGS, SPECS, enforce, metrics, run_spec
from .settings import KEY_NAMES, Settings, parse_layer
from .validation import positive_float

#: Perturbation classes a suite may name, and their modules in ``pytest_robust``.
BUILTIN_PERTURBATIONS = {"UniformLinf": "perturbations", "UniformL2": "perturbations", "GaussianNoise": "perturbations",
                         "CauchyNoise": "perturbations", "Spatial": "perturbations", "Corruption": "corruptions"}

#: Top-level keys of a suite file and what each holds (the text is used in error messages).
SUITE_KEYS = {
    "model": "the model factory, 'module:callable'",
    "model_args": "keyword arguments of the model factory",
    "data": "the data factory, 'module:callable'",
    "data_args": "keyword arguments of the data factory",
    "settings": "suite-wide settings",
    "profiles": "named profiles: {name: {budget_scale: x, <setting>: value}}",
    "checks": "the list of checks",
}
REQUIRED_SUITE_KEYS = ("model", "data", "checks")

#: Settings keys that have no meaning in a suite, and what to do instead.
NOT_IN_SUITES = {
    "model": "names a fixture for robust markers; a suite gives its model factory with model: "
    "'module:callable' (at the top level, or per check)",
    "data": "names a fixture for robust markers; a suite gives its data factory with data: "
    "'module:callable' (at the top level, or per check)",
    "profile": "is chosen per run with --robust-profile (or robust_profile in ini)",
    "report": "is one directory per session: use --robust-report or robust_report in ini",
}
SUITE_SETTINGS = tuple(k for k in KEY_NAMES if k not in NOT_IN_SUITES)

#: Keys of a check besides its metric, the metric's parameters and settings.
CHECK_KEYS = ("name", "profiles", "model", "model_args", "data", "data_args", "reference_args")

#: The profile used when --robust-profile is not given, if the suite defines it.
DEFAULT_PROFILE = "ci"

KeyPath = tuple  # mapping keys (str) and list indices (int) from the document root


def is_suite_file(file_path: Path) -> bool:
    """True for ``robust_*.yaml`` and ``robust_*.yml``."""
    return file_path.name.startswith("robust_") and file_path.suffix in (".yaml", ".yml")


def collect_file(file_path: Path, parent: pytest.Collector) -> "SuiteFile | None":
    """The ``pytest_collect_file`` implementation: a ``SuiteFile`` node for suite files."""
    if is_suite_file(file_path):
        return SuiteFile.from_parent(parent, path=file_path)
    return None


# ---------------------------------------------------------------------------------------------
# errors and the located YAML document
# ---------------------------------------------------------------------------------------------


def key_name(path: KeyPath) -> str:
    """``("checks", 1, "perturbation")`` -> ``"checks[1].perturbation"``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _shown(value) -> str:
    """A value for an error message: its YAML kind and (shortened) text."""
    kind = {dict: "a mapping", list: "a list", str: "the text", bool: "the boolean"}.get(type(value))
    if kind is None:
        kind = "null" if value is None else "the number" if isinstance(value, (int, float)) else type(value).__name__
    text = "" if value is None else " " + (repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "...")
    return kind + text


class SuiteDocument:
    """A suite file's parsed YAML (``data``) and the line of every mapping key and list item.

    Keys must be text and unique within their mapping (plain YAML would turn ``yes:`` into a
    boolean and keep the last of two equal keys silently).
    """

    def __init__(self, where: str, text: str):
        self.where = where
        self.lines: dict[KeyPath, int] = {(): 1}
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            self.data = loader.construct_document(node) if node is not None else None
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            line = mark.line + 1 if mark else 1
            raise SuiteError(where, line, "", f"invalid YAML: {err.problem or err.context}") from None
        except yaml.YAMLError as err:
            raise SuiteError(where, 1, "", f"invalid YAML: {err}") from None
        finally:
            loader.dispose()
        if node is not None:
            self._index(node, ())

    def _index(self, node, path: KeyPath) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                line = key.start_mark.line + 1
                if key.tag.endswith(":merge"):
                    continue
                if not (isinstance(key, yaml.ScalarNode) and key.tag.endswith(":str")):
                    shown = key.value if isinstance(key, yaml.ScalarNode) else "a non-scalar key"
                    raise SuiteError(self.where, line, key_name(path), f"key {shown!r} must be text; quote it")
                child = path + (key.value,)
                if child in self.lines:
                    raise SuiteError(self.where, line, key_name(child),
                                     f"duplicate key (first given on line {self.lines[child]})")
                self.lines[child] = line
                self._index(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.lines[path + (index,)] = item.start_mark.line + 1
                self._index(item, path + (index,))

    def line(self, path: KeyPath) -> int:
        """The line of ``path``, or of its nearest enclosing key that has one."""
        while path not in self.lines:
            path = path[:-1]
        return self.lines[path]

    def error(self, path: KeyPath, problem: str) -> SuiteError:
        return SuiteError(self.where, self.line(path), key_name(path), problem)

    def expect(self, path: KeyPath, value, kind: type, what: str):
        """``value`` if it is a ``kind`` (booleans are never numbers), else a located error."""
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.error(path, f"expected {what}, got {_shown(value)}")
        return value

    def mapping(self, path: KeyPath, value, what: str) -> dict:
        """``value`` if it is a mapping, {} if it is null (``settings:`` left empty)."""
        return {} if value is None else self.expect(path, value, dict, what)

    def no_unknown_keys(self, path: KeyPath, mapping: dict, allowed, what: str) -> None:
        for key in mapping:
            if key not in allowed:
                raise self.error(path + (key,), f"unknown key{suggest(key, allowed)}; {what}: {', '.join(allowed)}")


# ---------------------------------------------------------------------------------------------
# the suite as data: factories, profiles, checks
# ---------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Profile:
    """The profile a run uses for one suite: its name (None: no profile), settings and budget scale."""

    name: str | None = None
    settings: dict = dataclasses.field(default_factory=dict)
    budget_scale: float = 1.0


@dataclass(frozen=True)
class Check:
    """One check of a suite, ready to run: its spec, fully resolved settings and factories."""

    name: str
    line: int
    spec: CheckSpec
    settings: Settings
    model: Factory
    data: Factory
    profile: Profile
    profiles: tuple[str, ...] = ()  # runs only under these profiles; empty: under every profile

    @property
    def skip_reason(self) -> str | None:
        if not self.profiles or self.profile.name in self.profiles:
            return None
        now = f"this run uses {self.profile.name!r}" if self.profile.name else "this run uses no profile"
        return f"runs only under --robust-profile {' or '.join(self.profiles)} ({now})"


def load_suite(path: Path, where: str, session: Settings, perturbations: dict[str, Callable],
               registered: dict) -> list[Check]:
    """Parse and validate the suite at ``path``; ``where`` names it in messages (its node id).

    ``session`` holds the session settings (including the chosen profile) and ``perturbations``
    the perturbation factories a check may name, ``registered`` the metrics. Imports the factories' modules (from the
    suite's folder or sys.path) but calls no factory. Raises ``SuiteError``.
    """
    try:
        doc = SuiteDocument(where, path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise SuiteError(where, 1, "", f"cannot read the suite: {err}") from None
    top = doc.data
    if top is None:
        raise doc.error((), "the suite is empty; it needs " + ", ".join(f"{k}:" for k in REQUIRED_SUITE_KEYS))
    doc.expect((), top, dict, "a mapping with the keys " + ", ".join(SUITE_KEYS))
    if "checks" not in top and set(top) <= set(KEY_NAMES) and set(top) - set(SUITE_KEYS):
        raise doc.error((), "this is a settings file (for --robust-config), not a suite: suites are robust_*.yaml "
                            "files with model:, data: and checks:; rename it, e.g. robust-settings.yaml")
    doc.no_unknown_keys((), top, SUITE_KEYS, "a suite has the keys")
    for key in REQUIRED_SUITE_KEYS:
        if key not in top:
            raise doc.error((key,), f"missing: a suite needs {key}: ({SUITE_KEYS[key]})")
    folder = path.parent
    model = _factory(doc, (), top, "model", folder)
    data = _factory(doc, (), top, "data", folder)
    suite_settings = _settings(doc, ("settings",), doc.mapping(("settings",), top.get("settings"), "a mapping"))
    profiles = _profiles(doc, top.get("profiles"))
    profile = _select(doc, profiles, session.profile)
    base = session.replace(suite_settings, f"in {where}").replace(profile.settings, f"profile {profile.name}")
    entries = doc.expect(("checks",), top["checks"], list, "a list of checks")
    if not entries:
        raise doc.error(("checks",), "the list of checks is empty")
    context = _Context(doc, folder, model, data, base, profile, profiles, perturbations, registered, names={})
    return [_check(context, index, entry) for index, entry in enumerate(entries)]


def _import(doc: SuiteDocument, path: KeyPath, target, folder: Path) -> Callable:
    """The callable named ``module:attr`` (attr may be dotted), its module imported from the
    suite's folder (put on sys.path, as pytest's default import mode does for test files) or
    from sys.path."""
    example = "e.g. digits_model:load_model"
    if not isinstance(target, str) or target.count(":") != 1:
        hint = "; suites name factories, not fixtures" if isinstance(target, str) and target.isidentifier() else ""
        raise doc.error(path, f"expected an import path 'module:callable' ({example}), got {_shown(target)}{hint}")
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
        raise doc.error(path, f"{target!r} is not callable (it is {_shown(value)})")
    return value


def _factory(doc: SuiteDocument, path: KeyPath, mapping: dict, role: str, folder: Path,
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
        function = _import(doc, path + (role,), target, folder)
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


def _settings(doc: SuiteDocument, path: KeyPath, values: dict) -> dict:
    """Validate the settings in ``values`` key by key (only ``SUITE_SETTINGS`` are allowed)."""
    parsed = {}
    for key, value in values.items():
        if key in NOT_IN_SUITES:
            raise doc.error(path + (key,), f"not a suite setting: {key} {NOT_IN_SUITES[key]}")
        if key not in SUITE_SETTINGS:
            raise doc.error(path + (key,), f"unknown setting{suggest(key, SUITE_SETTINGS)}; "
                                           f"settings: {', '.join(SUITE_SETTINGS)}")
        try:
            parsed.update(parse_layer({key: value}, doc.where))
        except SettingError as err:
            raise doc.error(path + (key,), f"{_shown(value)} is invalid: expected {err.accepted}") from None
    return parsed


def _profiles(doc: SuiteDocument, raw) -> dict[str, Profile]:
    """Every profile the suite defines (all validated, whichever one is selected)."""
    if raw is None:
        return {}
    doc.expect(("profiles",), raw, dict, "a mapping of profile names to {budget_scale: x, <setting>: value}")
    profiles = {}
    for name, body in raw.items():
        path = ("profiles", name)
        try:
            parse_layer({"profile": name}, doc.where)
        except SettingError:
            raise doc.error(path, "cannot be chosen with --robust-profile, which takes a name of "
                                  "letters, digits, '_', '-' or '.'") from None
        values = dict(doc.mapping(path, body, "a mapping such as {budget_scale: 0.1}"))
        scale = values.pop("budget_scale", 1.0)
        try:
            scale = positive_float("budget_scale", scale)
        except SettingError as err:
            problem = f"{_shown(scale)} is invalid: expected {err.accepted}"
            raise doc.error(path + ("budget_scale",), problem) from None
        # keys that are no setting at all are listed against the profile's keys; settings keys
        # (including those not allowed in suites) get _settings' messages
        not_settings = [k for k in values if k not in KEY_NAMES]
        doc.no_unknown_keys(path, not_settings, ("budget_scale",) + SUITE_SETTINGS, "a profile has the keys")
        profiles[name] = Profile(name, _settings(doc, path, values), scale)
    return profiles


def _select(doc: SuiteDocument, profiles: dict[str, Profile], chosen: str | None) -> Profile:
    """The profile this run uses: the chosen one, else ``ci`` if defined, else none (scale 1)."""
    if not profiles:
        return Profile()
    if chosen is None:
        return profiles.get(DEFAULT_PROFILE, Profile())
    if chosen not in profiles:
        raise doc.error(("profiles",), f"profile {chosen!r} (chosen with --robust-profile) is not defined "
                                       f"in this suite{suggest(chosen, profiles)}; defined: {', '.join(profiles)}")
    return profiles[chosen]


@dataclass(frozen=True)
class _Context:
    """What every check of one suite shares while it is parsed."""

    doc: SuiteDocument
    folder: Path
    model: Factory
    data: Factory
    settings: Settings
    profile: Profile
    profiles: dict
    perturbations: dict
    metrics: dict  # the registered metrics
    names: dict  # check name -> index, filled while the checks are parsed


def _check(ctx: _Context, index: int, raw) -> Check:
    """Validate one entry of ``checks`` and resolve it into a ``Check``."""
    doc, path = ctx.doc, ("checks", index)
    doc.expect(path, raw, dict, "a check: a mapping such as {name: a, tsrm: 0.9, perturbation: {UniformLinf: ...}}")
    if "name" not in raw:
        raise doc.error(path, "every check needs a name: (its test id), e.g. name: uniform-0.1")
    name = doc.expect(path + ("name",), raw["name"], str, "text (the test id)")
    if not name.strip() or name != name.strip() or "::" in name or "\n" in name:
        raise doc.error(path + ("name",), f"{name!r} cannot be a test id: use non-empty text without '::' "
                                          "and without leading or trailing spaces")
    if name in ctx.names:
        raise doc.error(path + ("name",), f"duplicate check name {name!r} (also checks[{ctx.names[name]}])")
    ctx.names[name] = index
    metrics = [k for k in raw if k in ctx.metrics]
    for key in raw if not metrics else ():
        if difflib.get_close_matches(key, list(ctx.metrics), n=1):  # a misspelt metric, e.g. "tsr"
            raise doc.error(path + (key,), f"unknown key{suggest(key, ctx.metrics)}; metrics: "
                                           f"{_metric_examples(ctx.metrics)}")
    if len(metrics) != 1:
        found = f"several ({', '.join(metrics)})" if metrics else "none"
        raise doc.error(path, f"a check names exactly one metric with its threshold ({_metric_examples(ctx.metrics)}); "
                              f"found {found}: write one check per metric")
    metric_name = metrics[0]
    metric = ctx.metrics[metric_name]
    threshold_key, params = metric.keywords(metric_name)
    allowed = tuple(dict.fromkeys((metric_name, threshold_key) + params + metric.paired_keys() + CHECK_KEYS
                                  + SUITE_SETTINGS))
    for key in raw:
        if key in NOT_IN_SUITES and key not in allowed:
            raise doc.error(path + (key,), f"not a suite setting: {key} {NOT_IN_SUITES[key]}")
    doc.no_unknown_keys(path, raw, allowed, f"a {metric_name} check takes")
    missing = [k for k in (() if "reference" in raw else (threshold_key,)) + metric.required if k not in raw]
    if missing:
        raise doc.error(path + (metric_name,), f"a {metric_name} check needs " + ", ".join(f"{k}:" for k in missing))
    overrides = _settings(doc, path, {k: v for k, v in raw.items() if k in SUITE_SETTINGS})
    kwargs = {k: v for k, v in raw.items() if k in (metric_name, threshold_key) + params + metric.paired_keys()}
    if "reference" in kwargs:  # a factory, built when the check runs; the marker rules see a name
        kwargs["reference"] = "reference"
    if "perturbation" in kwargs:
        kwargs["perturbation"] = _perturbation(doc, path + ("perturbation",), raw["perturbation"], ctx.perturbations)
    try:
        spec = parse_marker((), {**kwargs, **overrides}, ctx.metrics)
    except MarkerError as err:
        raise doc.error(path + (threshold_key,), str(err)) from None
    if spec.paired:
        spec.paired["reference"] = _factory(doc, path, raw, "reference", ctx.folder)
    settings = ctx.settings.replace(overrides, f"in {doc.where}")
    settings = dataclasses.replace(
        settings, budget=max(1, round(budget_of(settings, metric) * ctx.profile.budget_scale)))
    return Check(
        name=name,
        line=doc.line(path),
        spec=spec,
        settings=settings,
        model=_factory(doc, path, raw, "model", ctx.folder, default=ctx.model),
        data=_factory(doc, path, raw, "data", ctx.folder, default=ctx.data),
        profile=ctx.profile,
        profiles=_only_profiles(ctx, path + ("profiles",), raw.get("profiles")),
    )


def _metric_examples(registered: dict) -> str:
    examples = []
    for name, metric in registered.items():
        extra = f" with {metric.threshold_key}:" if metric.threshold_key else ""
        examples.append(f"{name}:{extra}")
    return ", ".join(examples)


def _only_profiles(ctx: _Context, path: KeyPath, raw) -> tuple[str, ...]:
    if raw is None:
        return ()
    names = [raw] if isinstance(raw, str) else ctx.doc.expect(path, raw, list, "a list of profile names")
    if not ctx.profiles:
        raise ctx.doc.error(path, "the suite defines no profiles: add them under profiles:")
    for i, name in enumerate(names):
        if name not in ctx.profiles:
            raise ctx.doc.error(path + (i,) if isinstance(raw, list) else path,
                                f"profile {name!r} is not defined in this suite{suggest(name, ctx.profiles)}; "
                                f"defined: {', '.join(ctx.profiles)}")
    return tuple(names)


def _perturbation(doc: SuiteDocument, path: KeyPath, raw, factories: dict[str, Callable]):
    """Build ``Name`` or ``{Name: {param: value}}`` with the named factory."""
    if isinstance(raw, str):
        name, params, at = raw, {}, path
    elif isinstance(raw, dict) and len(raw) == 1:
        ((name, params),) = raw.items()
        at = path + (name,)
        params = doc.mapping(at, params, f"the parameters of {name} as a mapping, e.g. {{eps: 0.1}}")
    else:
        raise doc.error(path, f"expected a perturbation name or {{Name: {{param: value}}}}, "
                              f"e.g. {{UniformLinf: {{eps: 0.1}}}}; got {_shown(raw)}")
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
    factories = {name: getattr(importlib.import_module(f"pytest_robust.{module}"), name)
                 for name, module in BUILTIN_PERTURBATIONS.items()}
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


# ---------------------------------------------------------------------------------------------
# pytest nodes
# ---------------------------------------------------------------------------------------------


class SuiteFile(pytest.File):
    """A ``robust_*.yaml`` file: one ``SuiteItem`` per check; builds the models and data its
    checks need once (per factory, arguments and device) and shares them between its items."""

    def collect(self):
        try:
            checks = load_suite(self.path, self.nodeid, self.config.stash[SETTINGS],
                                perturbation_factories(self.ihook), metrics(self.config))
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
        from .engine import resolve_device

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
