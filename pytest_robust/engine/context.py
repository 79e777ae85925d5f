"""How one check runs, resolved once at its door: ``RunContext``, the one object that carries every
setting of a check that is not one of its parameters or common arguments.

Settings travel one way. Each door resolves a check's context once and hands it to ``Run`` as an
argument:

- a library call (``checks.library.function``): the context in force (``ambient``, set by the public
  ``execution()``, ``model_interface()`` and ``progress_sink()`` blocks), with the call's own
  ``normalize=``, ``logits=``, ``data_keys=`` and ``time_limit=`` laid over it, read once at the entry;
- the pytest layer (markers, fixture calls, YAML checks: ``recording.run_spec``): built from the
  check's resolved settings (``from_settings``), with the test's progress line and warning site.

Nothing below the door reads a setting from anywhere else: ``Run`` keeps the context
(``run.context``), and its parts reach the data reader (``data_keys``), the forward wrapper
(``interface``, ``execution``), the clock (``time_limit``), the progress line (``report_progress``)
and the warnings (``warning_site``). The one context variable left, ``_AMBIENT``, holds what the public
blocks set for library callers; it is read only by ``ambient()`` at a library call's entry.

Every part, and what it means:

- ``execution``: ``precision.Execution`` (precision/autocast, channels-last, compile, deterministic);
- ``interface``: ``interface.ModelInterface`` (``normalize=(mean, std)`` inside the model call, the
  ``logits=`` selector);
- ``data_keys``: (input key, label key) of mapping items, None for the common names
  (``items.input_and_label``);
- ``time_limit``: seconds the check may take (None: no limit; ``clock.Clock``);
- ``progress``: a callable taking a dict of progress fields (None: no progress line);
- ``warning_site``: (file, line) of the test that declared the check, where its warnings point when
  it runs from pytest's own machinery (``inspect.warnings.user_site``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from pytest_robust.engine.interface import ModelInterface
from pytest_robust.engine.precision import Execution
from pytest_robust.settings import validation
from pytest_robust.settings.keys import data_key_pair


@dataclass(frozen=True)
class RunContext:
    """The resolved settings one check runs under (see the module docstring)."""

    execution: Execution = field(default_factory=Execution)
    interface: ModelInterface = field(default_factory=ModelInterface)
    data_keys: tuple[str, str] | None = None
    time_limit: float | None = None
    progress: Callable | None = None
    warning_site: tuple[str, int] | None = None

    def __post_init__(self):  # validated here: SettingError names the key
        if self.data_keys is not None:
            object.__setattr__(self, "data_keys", data_key_pair("data_keys", self.data_keys))
        if self.time_limit is not None:
            object.__setattr__(self, "time_limit", validation.positive_float("time_limit", self.time_limit))

    @classmethod
    def from_settings(cls, settings, progress: Callable | None = None,
                      warning_site: tuple[str, int] | None = None) -> "RunContext":
        """The context of a check whose settings (``settings.keys.Settings``) the pytest layer resolved."""
        return cls(Execution(settings.precision, settings.channels_last, settings.compile, settings.deterministic),
                   ModelInterface(settings.normalize, settings.logits, settings.embedding), settings.data_keys,
                   settings.time_limit,
                   progress, warning_site)

    def replace(self, **changes) -> "RunContext":
        """This context with ``changes`` (a value of None keeps the part as it is)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def report_progress(self, **fields) -> None:
        """Tell the progress line (if any) how a long check is doing; values may be callables that
        are evaluated only when the line decides to show them (e.g. a confidence bound)."""
        if self.progress is not None:
            self.progress(fields)


_AMBIENT: contextvars.ContextVar = contextvars.ContextVar("robust_run_context", default=RunContext())


def ambient() -> RunContext:
    """The context a library call starts from: defaults, changed by the enclosing public blocks."""
    return _AMBIENT.get()


@contextlib.contextmanager
def _layered(**changes):
    token = _AMBIENT.set(dataclasses.replace(ambient(), **changes))
    try:
        yield ambient()
    finally:
        _AMBIENT.reset(token)


@contextlib.contextmanager
def execution(precision: str = "fp32", channels_last: bool = False, compile: bool = False,
              deterministic: bool = False):
    """Library calls inside the block run the model with these execution settings (validated here;
    ``precision.Execution``): ``with pytest_robust.execution(precision="bf16"): tsrm(...)``."""
    with _layered(execution=Execution(precision, channels_last, compile, deterministic)) as now:
        yield now.execution


@contextlib.contextmanager
def model_interface(normalize=None, logits=None, embedding=None):
    """Library calls inside the block normalize inside the model call, pick the logits and read
    token ids through the embedding so (validated here; ``interface.ModelInterface``); a call's own
    ``normalize=``/``logits=``/``embedding=`` win."""
    with _layered(interface=ModelInterface(normalize, logits, embedding)) as now:
        yield now.interface


@contextlib.contextmanager
def progress_sink(callback: Callable):
    """Library calls inside the block report their progress to ``callback(fields: dict)``."""
    with _layered(progress=callback):
        yield
