"""Check declarations: what a check is, as data (pure Python; no torch, no pytest).

A check is declared once, as a ``Metric``: its title, direction, default budget, the namespace of
its random streams, its body (the function that evaluates it inside a ``run.Run``) and its
parameters, each a ``Param`` with a validator, a default and a one-line doc. Everything else
follows from that one declaration:

- the marker's keywords and the YAML suite's keys (``checks.parse_marker``), validated at
  collection by the same validators (a usage error, exit 4);
- the library function and the ``robust`` fixture's method, with one signature:
  ``name(model, data, *, <threshold>=None, <parameters>, confidence, budget, seed, batch_size,
  device, normalize, logits)`` (``library.function``);
- the help text (``Metric.help``) and the reports' display name (``Metric.title``).

The threshold's keyword is the metric's name on a marker (``tsrm=0.9``) and ``threshold`` in a
call (``tsrm(model, data, perturbation=..., threshold=0.9)``), unless the declaration names one
(``threshold_key="max_loss"``: ``q=100, max_loss=0.5`` on a marker, and ``q=100, max_loss=0.5``
in a call, where the metric keyword is then a parameter of the metric's name).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from . import validation
from .errors import ArgumentError, SettingError


class _Required:
    def __repr__(self) -> str:
        return "required"


#: The default of a parameter that has none: the marker, YAML check or call must give it.
REQUIRED = _Required()


def load(target: str | Callable) -> Callable:
    """``target`` itself, or the object at its import path "module:name" (imported now)."""
    if callable(target):
        return target
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


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
    factory) whose value is used, resolved when the check runs and validated then.
    """

    name: str
    check: Callable | None = None
    default: object = None
    doc: str = ""
    fixture: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def validate(self, value):
        """The value as the body receives it (None stays None: the default applies)."""
        if value is None or self.check is None or (self.fixture and isinstance(value, str)):
            return value
        return load(self.check)(self.name, value)


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
    None: the check has no paired form.
    """

    body: str | Callable
    params: tuple[Param, ...] = ()
    title: str = ""
    direction: str = ">="
    budget: int = 100_000
    threshold_key: str | None = None
    settings: tuple[str, ...] = ()
    streams: str = ""
    certificate: bool = False
    perturbation: str | Callable | None = None
    paired: str | None = None
    doc: str = ""

    def __post_init__(self):
        validation.choice(">=", "<=")("direction", self.direction)

    def keywords(self, name: str) -> tuple[str, tuple[str, ...]]:
        """(the threshold's keyword on a marker, the parameters' keywords) of metric ``name``."""
        return self.threshold_key or name, tuple(p.name for p in self.params)

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
                                f"(the largest {key.split('_')[1]} allowed)")
        if threshold is not None:
            raise ArgumentError(f"{name}: give either {threshold_key}= (an absolute requirement) or reference= with "
                                f"{key}= (a paired comparison), not both")
        check = validation.non_negative_float if self.direction == "<=" else validation.unit_interval
        return reference, check(key, margin)

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
        if self.direction == "<=":
            return validation.non_negative_float(key, value)
        return validation.open_unit(key, value)

    def validate(self, params: dict) -> dict:
        """``params`` with every value checked by its parameter's validator (SettingError)."""
        return {k: self.param(k).validate(v) for k, v in params.items()}

    def resolved(self, params: dict, settings) -> dict:
        """Every parameter's value for the body: ``params`` (validated) with the defaults filled in
        (``FromSetting`` defaults from ``settings``), plus the ``settings`` keys the body takes."""
        out = {}
        for p in self.params:
            value = params.get(p.name)
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
        lines = [f"{name} ({self.title or name}): {self.doc}",
                 f"  {self.threshold_key or name}=  the threshold ({'at most' if self.direction == '<=' else 'at least'})"]
        lines += [f"  {p.name}=  {p.doc} (default: {p.default!r})" for p in self.params]
        return "\n".join(lines)


def perturbation(key: str, value):
    """A perturbation instance, or a callable ``(x, generator) -> x'`` (a class, or a callable of
    another signature, is refused; torch is loaded already when the user built one)."""
    if not callable(value):
        raise ArgumentError(f"{key} must be a perturbation such as UniformLinf(eps=0.1) or a callable (x, generator) "
                            f"-> x', got {value!r}")
    from .inspection import check_perturbation_object

    try:
        check_perturbation_object(value)
    except TypeError as err:
        raise ArgumentError(str(err)) from None
    return value
