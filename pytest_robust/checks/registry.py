"""Check declarations: what a check is, as data (pure Python; no torch, no pytest).

A check is declared once, as a ``Metric``: its title, direction, default budget, the namespace of
its random streams, its body (the function that evaluates it inside a ``run.Run``) and its
parameters, each a ``Param`` with a validator, a default and a one-line doc. Everything else
follows from that one declaration:

- which keywords the check takes, on a marker, in a YAML check, in a fixture call and in a library
  call: one door, ``Metric.accept``, validated by the same validators (on a marker or in YAML at
  collection: a usage error, exit 4); a check's own parameter beats a setting of the same name
  (``eps`` of NPPR and adversarial accuracy);
- the library function and the ``robust`` fixture's method, with one signature:
  ``name(model, data, *, <threshold>=None, <parameters>, confidence, budget, seed, batch_size,
  device, normalize, logits)`` (``library.function``);
- the help text (``Metric.help``) and the reports' display name (``Metric.title``).

An analysis (``gate=False``: the q-curve, CERTIFY, PREDICT, the pA report) is declared the same way
and goes through the same door; it has no threshold and no marker (``checks.ANALYSES``), and its body
may return a per-input object with ``to_result(confidence)`` (a ``Certification``) instead of a Result.

The threshold's keyword is the metric's name on a marker (``tsrm=0.9``) and ``threshold`` in a
call (``tsrm(model, data, perturbation=..., threshold=0.9)``), unless the declaration names one
(``threshold_key="max_loss"``: ``q=100, max_loss=0.5`` on a marker, and ``q=100, max_loss=0.5``
in a call, where the metric keyword is then a parameter of the metric's name).
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Callable

from pytest_robust.errors import ArgumentError
from pytest_robust.settings import validation
from pytest_robust.settings.keys import CHECK_KEY_NAMES, PER_RUN, parse_layer


class _Required:
    def __repr__(self) -> str:
        return "required"


#: The default of a parameter that has none: the marker, YAML check or call must give it.
REQUIRED = _Required()


def _is_given(value) -> bool:
    """Whether a keyword's value counts as given: None, ``REQUIRED`` and ``FromSetting`` do not."""
    return value is not None and value is not REQUIRED and not isinstance(value, FromSetting)


def _overrides(given: dict, settings: tuple[str, ...], own: tuple, source: str) -> dict:
    """The settings among ``given`` that are not the check's own keywords, validated (``parse_layer``)."""
    overrides = {k: v for k, v in given.items() if k in settings and k not in own}
    parse_layer(overrides, source)
    return overrides


#: How each door spells a check, by ``spelling``: (how messages name the check, what follows a key).
SPELLINGS = {"marker": ("robust({name}=...)", "="), "suite": ("a {name} check", ":"), "call": ("{name}(...)", "=")}


def load(target: str | Callable) -> Callable:
    """``target`` itself, or the object at its import path "module:name" (imported now)."""
    if callable(target):
        return target
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def suggest(word: str, options) -> str:
    """' (did you mean X?)' for the closest of ``options``, or '': among the close ones, one that
    shares the word's first three letters wins (epsilon -> eps, not precision)."""
    word = str(word)  # a YAML key may be a number
    close = difflib.get_close_matches(word, list(options), n=3)
    close = [c for c in close if c[:3] == word[:3]] + close
    return f" (did you mean {close[0]}?)" if close else ""


@dataclass
class CheckSpec:
    """One requirement on ``metric`` against ``threshold`` (None: an estimate, or the paired form),
    its parameters (validated; fixture names unresolved), the settings it overrides and its
    paired form ({"reference": a fixture name or a model, "margin": the largest drop/increase})."""

    metric: str
    threshold: float | None
    params: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    paired: dict | None = None


@dataclass(frozen=True)
class FromSetting:
    """A default taken from the resolved settings: ``build(settings)``; ``shown`` names it in help."""

    build: Callable
    shown: str

    def __repr__(self) -> str:
        return self.shown


@dataclass(frozen=True)
class Param:
    """One parameter of a check.

    ``check(key, value)`` (a function or "module:function", imported when a value is checked)
    returns the value as the body receives it or raises ``SettingError`` (see ``validation``); None
    accepts anything. ``default`` is a value, ``REQUIRED`` or a
    ``FromSetting``. With ``fixture=True`` a string on a marker or in YAML names a fixture (or
    factory) whose value is used, resolved when the check runs and validated then. With
    ``nullable=True`` None is a value of its own, not "not given" (``bounds=None``: no box), in
    every door: a library or fixture call, a marker and YAML (``bounds: null``).
    """

    name: str
    check: Callable | None = None
    default: object = None
    doc: str = ""
    fixture: bool = False
    nullable: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def validate(self, value):
        """The value as the body receives it (None stays None: the default applies)."""
        if value is None or self.check is None or (self.fixture and isinstance(value, str)):
            return value
        try:
            return load(self.check)(self.name, value)
        except ArgumentError as err:  # the parameter's own error names it (RobustError.key)
            err.key = err.key or self.name
            raise


@dataclass(frozen=True)
class Metric:
    """A check's declaration (see the module docstring).

    ``body`` is the function, or its import path "module:function", that evaluates the check: it
    is called as ``body(run, **parameters)`` inside the check's ``run.Run`` (which holds the
    model, the data, the common arguments, the direction, the streams and the budget) and returns
    ``run.result(...)``. Imported when the check runs, which keeps torch out of collection.
    ``direction`` is ">=" for "at least" requirements (the threshold is a probability in (0, 1))
    and "<=" for "at most" ones (a number >= 0). ``settings`` names settings keys the body takes
    as parameters (e.g. ``cache_dir``); ``streams`` namespaces the check's random streams
    (default: its name); ``certificate`` marks a check whose result is a certificate (a warning
    when the model's logits are not float32). ``perturbation`` (a function or "module:function")
    builds, from the parameters, the perturbation the check draws from, which the run inspects the
    inputs against and shows in the gallery; by default it is the ``perturbation`` parameter, if
    the check has one. ``paired`` names the check's paired form against a reference model
    (``procedures.paired``): "bernoulli" (the check draws from its perturbation with the Bernoulli
    procedure), "outcomes" (its per-input table's outcomes) or "values" (its per-input estimates);
    None: the check has no paired form. ``discrete=True``: the check also takes integer inputs (token
    ids) with a perturbation of the user's that takes and returns them (``Perturbation.discrete``):
    its draws only perturb inputs and call the model (TSRM and its paired form).

    ``gate=False`` declares an analysis: no threshold, no paired form, no marker (its verdict is
    "estimate"). ``positional`` names parameters a call may also give positionally after (model,
    data) (``certify(model, data, 0.25)``). ``budget=None``: the work is set by the parameters, not
    capped (no ``budget`` keyword); ``budget_per`` names a parameter the budget applies to each element
    of (the q-curve's budget is per value of ``qs``).
    """

    body: str | Callable
    params: tuple[Param, ...] = ()
    title: str = ""
    direction: str = ">="
    budget: int | None = 100_000
    threshold_key: str | None = None
    settings: tuple[str, ...] = ()
    streams: str = ""
    certificate: bool = False
    perturbation: str | Callable | None = None
    paired: str | None = None
    doc: str = ""
    gate: bool = True
    positional: tuple[str, ...] = ()
    budget_per: str = ""
    discrete: bool = False

    def __post_init__(self):
        validation.choice(">=", "<=")("direction", self.direction)

    def keywords(self, name: str) -> tuple[str, tuple[str, ...]]:
        """(the threshold's keyword on a marker, the parameters' keywords) of metric ``name``."""
        return self.threshold_key or name, tuple(p.name for p in self.params)

    def threshold_keyword(self, name: str, spelling: str) -> str | None:
        """The threshold's keyword of metric ``name`` on a marker (``spelling="marker"``) or in a call;
        None for an analysis."""
        if not self.gate:
            return None
        return self.call_threshold() if spelling == "call" else (self.threshold_key or name)

    def paired_keys(self) -> tuple[str, ...]:
        """The keywords of the paired form: ("reference", "max_drop") for an "at least" check,
        ("reference", "max_increase") for an "at most" one; () without a paired form."""
        if self.paired is None:
            return ()
        return "reference", "max_increase" if self.direction == "<=" else "max_drop"

    def pairing(self, name: str, threshold_key: str, threshold, reference, margin) -> tuple | None:
        """(reference, margin) of a request for the paired form, validated, or None for an ordinary
        check: ``reference`` and the margin (``max_drop`` / ``max_increase``) go together, and the
        threshold (``threshold_key``, as the caller spells it) must then be None. ``name`` is how
        the caller shows the check in messages."""
        if reference is None and margin is None:
            return None
        key = self.paired_keys()[1]
        if reference is None or margin is None:
            raise ArgumentError(f"{name}: the paired form needs both reference= (the reference model) and {key}= "
                                f"(the largest {key.split('_')[1]} allowed)", key="reference" if margin is None
                                else key)
        if threshold is not None:
            raise ArgumentError(f"{name}: give either {threshold_key}= (an absolute requirement) or reference= with "
                                f"{key}= (a paired comparison), not both", key="reference")
        check = validation.non_negative_float if self.direction == "<=" else validation.unit_interval
        return reference, check(key, margin)

    def accept(self, name: str, keywords: dict, *, spelling: str = "marker", where: str | None = None,
               settings: tuple[str, ...] = CHECK_KEY_NAMES) -> CheckSpec:
        """The one door: which ``keywords`` check ``name`` takes, as a ``CheckSpec``.

        The same rule for a marker (``spelling="marker"``: the threshold is ``name=``, or the
        declared ``threshold_key``), a YAML check (``spelling="suite"``: the same keys, shown as
        ``key:``) and a fixture or library call (``spelling="call"``: ``threshold=``): the
        threshold, the paired form's keys, the check's
        own parameters and the ``settings`` keys; anything else is an ``ArgumentError`` naming the
        key (with the closest valid one) and every valid keyword. A keyword that is both a
        parameter of the check and a setting (``eps``) is the parameter, for this check: it
        overrides no setting. A value of None (or ``REQUIRED``) is a keyword not given. ``where``
        names the check in messages (default ``SPELLINGS``). Invalid values raise the validators'
        ``SettingError``; every error carries the keyword it is about (``RobustError.key``), where
        there is one, so that a YAML suite locates it."""
        threshold_key = self.threshold_keyword(name, spelling)
        where, assign = where or SPELLINGS[spelling][0].format(name=name), SPELLINGS[spelling][1]
        own = ((threshold_key,) if self.gate else ()) + tuple(p.name for p in self.params) + self.paired_keys()
        self._refuse_unknown(name, keywords, own + tuple(settings), spelling, where, settings)
        given = self._given(keywords)
        pairing = self._requested_pairing(where, threshold_key, given, keywords, spelling)
        needs_threshold = self.gate and pairing is None and spelling != "call"
        missing = [k for k in ((threshold_key,) if needs_threshold else ()) + self.required if k not in given]
        if missing:
            raise ArgumentError(f"{where} needs {', '.join(k + assign for k in missing)}; "
                                + self.valid_keywords(name, spelling, where, settings))
        params = {p.name: p.validate(given[p.name]) for p in self.params if p.name in given}
        overrides = _overrides(given, settings, own, "on the robust marker" if spelling == "marker"
                               else f"argument of {where}" if spelling == "call" else f"in {where}")
        threshold = given.get(threshold_key) if pairing is None else None
        return CheckSpec(name, None if threshold is None else self.threshold(threshold_key, threshold), params,
                         overrides, None if pairing is None else {"reference": pairing[0], "margin": pairing[1]})

    def _given(self, keywords: dict) -> dict:
        """The keywords that count as given: not None (except a nullable parameter's None), not
        ``REQUIRED``, not a ``FromSetting``."""
        nullable = {p.name for p in self.params if p.nullable}
        return {k: v for k, v in keywords.items() if _is_given(v) or (v is None and k in nullable)}

    def _refuse_unknown(self, name: str, keywords: dict, allowed: tuple, spelling: str, where: str,
                        settings: tuple[str, ...]) -> None:
        """An ``ArgumentError`` for keywords outside ``allowed``: a per-run setting names where it
        belongs; any other names the closest valid keyword and every valid one."""
        allowed = tuple(dict.fromkeys(allowed))
        unknown = [k for k in keywords if k not in allowed]
        per_run = [k for k in unknown if k in PER_RUN]
        if per_run:
            raise ArgumentError(f"{per_run[0]}{SPELLINGS[spelling][1]} on {where}: {per_run[0]} "
                                f"{PER_RUN[per_run[0]]}, not per check", key=per_run[0])
        if unknown:
            # the library functions' threshold= is the check's own keyword on a marker or in a suite
            hint = f" (the threshold is the value of {name}{SPELLINGS[spelling][1]})" if "threshold" in unknown else ""
            raise ArgumentError(f"unknown keyword(s) {', '.join(k + suggest(k, allowed) for k in unknown)} on {where}"
                                f"{hint}; " + self.valid_keywords(name, spelling, where, settings), key=unknown[0])

    def _requested_pairing(self, where: str, threshold_key: str | None, given: dict, keywords: dict,
                           spelling: str) -> tuple | None:
        """(reference, margin) when ``given`` asks for the paired form (``pairing``), else None; on a
        marker, a threshold of None without the paired form is an ``ArgumentError``."""
        if not self.paired:
            return None
        reference, margin = (given.get(k) for k in self.paired_keys())
        pairing = self.pairing(where, threshold_key, given.get(threshold_key), reference, margin)
        if spelling != "call" and pairing is None and threshold_key in keywords and threshold_key not in given:
            raise ArgumentError(f"{where}: {threshold_key}=None needs a paired comparison instead: reference= (a "
                                f"fixture returning the reference model) and {self.paired_keys()[1]}=; or give "
                                f"{threshold_key}= a threshold", key=threshold_key)
        return pairing

    def valid_keywords(self, name: str, spelling: str = "marker", where: str | None = None,
                       settings: tuple[str, ...] = CHECK_KEY_NAMES) -> str:
        """'valid keywords of ...': the threshold's, the parameters' and the paired form's keywords,
        then the settings."""
        threshold_key = self.threshold_keyword(name, spelling)
        where = where or SPELLINGS[spelling][0].format(name=name)
        own = ([threshold_key] if self.gate else []) + [p.name for p in self.params if p.name != name]
        own += list(self.paired_keys())
        text = f"valid keywords of {where}: {', '.join(own)}"
        return text + (f"; {'other keys' if spelling == 'suite' else 'settings'}: {', '.join(settings)}"
                       if settings else "")

    def call_threshold(self) -> str:
        """The threshold's keyword in a library or fixture call."""
        return self.threshold_key or "threshold"

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.required)

    def load(self) -> Callable:
        return load(self.body)

    def threshold(self, key: str, value) -> float:
        """The threshold, validated: a probability in (0, 1) for ">=", a number >= 0 for "<="."""
        return validation.threshold_value(key, value, self.direction)

    def validate(self, params: dict) -> dict:
        """``params`` with every value checked by its parameter's validator (SettingError)."""
        return {k: self.param(k).validate(v) for k, v in params.items()}

    def resolved(self, params: dict, settings) -> dict:
        """Every parameter's value for the body: ``params`` (validated) with the defaults filled in
        (``FromSetting`` defaults from ``settings``), plus the ``settings`` keys the body takes."""
        out = {}
        for p in self.params:
            value = params.get(p.name)
            if p.nullable and p.name in params and value is None:
                out[p.name] = None
                continue
            if value is None or isinstance(value, FromSetting):
                value = p.default.build(settings) if isinstance(p.default, FromSetting) else p.default
                value = p.validate(value) if isinstance(p.default, FromSetting) else value
            else:
                value = p.validate(value)
            out[p.name] = value
        out.update({key: getattr(settings, key) for key in self.settings})
        return out

    def help(self, name: str) -> str:
        """One line per keyword: the threshold, then every parameter with its default and doc."""
        lines = [f"{name} ({self.title or name}): {self.doc}"]
        if self.gate:
            lines.append(f"  {self.threshold_key or name}=  the threshold "
                         f"({'at most' if self.direction == '<=' else 'at least'})")
        lines += [f"  {p.name}=  {p.doc} (default: {p.default!r})" for p in self.params]
        return "\n".join(lines)


def perturbation(key: str, value):
    """A perturbation instance, or a callable ``(x, generator) -> x'`` (a class, or a callable of
    another signature, is refused; torch is loaded already when the user built one)."""
    if not callable(value):
        raise ArgumentError(f"{key} must be a perturbation such as UniformLinf(eps=0.1) or a callable (x, generator) "
                            f"-> x', got {value!r}")
    from pytest_robust.engine.inspect.perturbation import check_perturbation_object

    try:
        check_perturbation_object(value)
    except TypeError as err:
        raise ArgumentError(str(err)) from None
    return value


#: The input box shared by the checks that clip to it.
BOX = Param("bounds", validation.box, (0.0, 1.0), "the input box (lo, hi) the perturbed inputs are clipped to; "
            "None: no box (standardized features, embeddings); either end may be infinite", nullable=True)
