"""The suite schema: the keys a suite, a profile and a check may have, the factories they name
(``module:callable``) and how a check's keywords and settings are read (``load_suite``)."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pytest_robust.checks.registry import CheckSpec, suggest
from pytest_robust.checks.spec import budget_of
from pytest_robust.errors import ArgumentError, SettingError, SuiteError
from pytest_robust.settings.keys import COMMAND_LINE_SOURCE, KEY_NAMES, PER_RUN, Settings, parse_layer
from pytest_robust.settings.validation import positive_float
from pytest_robust.suites.document import KeyPath, SuiteDocument, shown_value
from pytest_robust.suites.factories import Factory, factory, perturbation_of

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
    **PER_RUN,
}


SUITE_SETTINGS = tuple(k for k in KEY_NAMES if k not in NOT_IN_SUITES)


#: Keys of a check besides its metric, the metric's parameters and settings.
CHECK_KEYS = ("name", "profiles", "model", "model_args", "data", "data_args", "reference_args")


#: The profile used when --robust-profile is not given, if the suite defines it.
DEFAULT_PROFILE = "ci"


# ---------------------------------------------------------------------------------------------
# the suite as data: factories, profiles, checks
# ---------------------------------------------------------------------------------------------




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
               registered: dict, command_line: dict | None = None) -> list[Check]:
    """Parse and validate the suite at ``path``; ``where`` names it in messages (its node id).

    ``session`` holds the session settings (including the chosen profile), ``command_line`` the
    settings given on the command line, which beat the suite's ``settings:`` and profile (a check's
    own keys beat them all: ``settings.keys.PRECEDENCE``), and ``perturbations``
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
    model = factory(doc, (), top, "model", folder)
    data = factory(doc, (), top, "data", folder)
    suite_settings = _settings(doc, ("settings",), doc.mapping(("settings",), top.get("settings"), "a mapping"))
    profiles = _profiles(doc, top.get("profiles"))
    profile = _select(doc, profiles, session.profile)
    command_line = command_line or {}
    base = (session.replace(suite_settings, f"in {where}").replace(profile.settings, f"profile {profile.name}")
            .replace(command_line, COMMAND_LINE_SOURCE))
    entries = doc.expect(("checks",), top["checks"], list, "a list of checks")
    if not entries:
        raise doc.error(("checks",), "the list of checks is empty")
    context = _Context(doc, folder, model, data, base, profile, profiles, perturbations, registered, names={},
                       budget_given="budget" in command_line)
    return [_check(context, index, entry) for index, entry in enumerate(entries)]






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
            raise doc.error(path + (key,), f"{shown_value(value)} is invalid: expected {err.accepted}") from None
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
            problem = f"{shown_value(scale)} is invalid: expected {err.accepted}"
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
    budget_given: bool = False  # --robust-budget on the command line: used as given, not scaled by the profile


def _check(ctx: _Context, index: int, raw) -> Check:
    """Validate one entry of ``checks`` and resolve it into a ``Check``."""
    doc, path = ctx.doc, ("checks", index)
    doc.expect(path, raw, dict, "a check: a mapping such as {name: a, tsrm: 0.9, perturbation: {UniformLinf: ...}}")
    name = _check_name(ctx, path, raw, index)
    metric_name = _metric_of(ctx, path, raw)
    metric = ctx.metrics[metric_name]
    keywords = {k: v for k, v in raw.items() if k not in CHECK_KEYS}
    if "reference" in keywords:  # a factory, built when the check runs; the door sees a name
        keywords["reference"] = "reference"
    if "perturbation" in keywords:
        keywords["perturbation"] = perturbation_of(doc, path + ("perturbation",), raw["perturbation"],
                                                   ctx.perturbations)
    overrides = _settings(doc, path, {k: v for k, v in raw.items() if k in SUITE_SETTINGS})
    try:  # the one door: the marker's keyword rules, errors located at the key they name
        spec = metric.accept(metric_name, keywords, spelling="suite", settings=CHECK_KEYS + SUITE_SETTINGS)
    except (ArgumentError, SettingError) as err:
        raise doc.error(path + ((err.key,) if err.key in raw else (metric_name,)), str(err)) from None
    if spec.paired:
        spec.paired["reference"] = factory(doc, path, raw, "reference", ctx.folder)
    settings = ctx.settings.replace(overrides, f"in {doc.where}")
    scale = 1.0 if ctx.budget_given and "budget" not in overrides else ctx.profile.budget_scale
    settings = dataclasses.replace(settings, budget=max(1, round(budget_of(settings, metric) * scale)))
    return Check(
        name=name,
        line=doc.line(path),
        spec=spec,
        settings=settings,
        model=factory(doc, path, raw, "model", ctx.folder, default=ctx.model),
        data=factory(doc, path, raw, "data", ctx.folder, default=ctx.data),
        profile=ctx.profile,
        profiles=_only_profiles(ctx, path + ("profiles",), raw.get("profiles")),
    )


def _check_name(ctx: _Context, path: KeyPath, raw: dict, index: int) -> str:
    """The check's name (its test id): non-empty text, without '::', unique in the suite."""
    doc = ctx.doc
    if "name" not in raw:
        raise doc.error(path, "every check needs a name: (its test id), e.g. name: uniform-0.1")
    name = doc.expect(path + ("name",), raw["name"], str, "text (the test id)")
    if not name.strip() or name != name.strip() or "::" in name or "\n" in name:
        raise doc.error(path + ("name",), f"{name!r} cannot be a test id: use non-empty text without '::' "
                                          "and without leading or trailing spaces")
    if name in ctx.names:
        raise doc.error(path + ("name",), f"duplicate check name {name!r} (also checks[{ctx.names[name]}])")
    ctx.names[name] = index
    return name


def _metric_of(ctx: _Context, path: KeyPath, raw: dict) -> str:
    """The one metric a check names (a misspelt one is named with the closest metric)."""
    metrics = [k for k in raw if k in ctx.metrics]
    for key in raw if not metrics else ():
        if difflib.get_close_matches(key, list(ctx.metrics), n=1):  # a misspelt metric, e.g. "tsr"
            raise ctx.doc.error(path + (key,), f"unknown key{suggest(key, ctx.metrics)}; metrics: "
                                               f"{_metric_examples(ctx.metrics)}")
    if len(metrics) != 1:
        found = f"several ({', '.join(metrics)})" if metrics else "none"
        raise ctx.doc.error(path, f"a check names exactly one metric with its threshold "
                                  f"({_metric_examples(ctx.metrics)}); found {found}: write one check per metric")
    return metrics[0]


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








