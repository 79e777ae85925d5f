"""The exception family of pytest-robust (pure Python; no torch, no pytest).

Everything a user must fix derives from ``RobustError``: the pytest layer catches this family and
turns it into a failed test (or, for settings, a usage error) that shows the message without a
traceback. Any other exception is a bug in pytest-robust or in the model and keeps its traceback.
"""

from __future__ import annotations

import traceback


class RobustError(Exception):
    """Base class: something the user must change (a setting, the model, the data).

    ``key``: the keyword (of a marker, a call or a YAML check) the error is about, or None; a YAML
    suite locates the error at that key's line."""

    key: str | None = None


class SettingError(RobustError, ValueError):
    """An invalid value for a named setting or argument."""

    def __init__(self, key: str, value, accepted: str, *, name: str | None = None):
        self.key, self.value, self.accepted = name or key, value, accepted
        super().__init__(f"{key}={value!r} is invalid: expected {accepted}")


class MarkerError(RobustError, ValueError):
    """A ``robust`` marker (or YAML check) that cannot be run as written."""

    def __init__(self, message: str = "", key: str | None = None):
        super().__init__(message)
        self.key = key


class RobustDataError(RobustError, ValueError):
    """The data cannot be evaluated as given (empty, wrong shape or type, labels out of range)."""


class RobustModelError(RobustError, RuntimeError):
    """The model cannot be evaluated as given (wrong device, bad logits, modifies itself)."""


def of_model(err: RobustDataError | RobustModelError, role: str) -> RobustError:
    """``err`` with its message headed by the model's ``role`` ("the reference model (reference=)" in a
    paired check), so that a failing reference is not reported as the model under test (once: an
    error already headed by it is returned as it is)."""
    return err if str(err).startswith(f"{role}: ") else type(err)(f"{role}: {err}")


class RobustWarning(UserWarning):
    """Something the user should know about how a check was evaluated."""


class ArgumentError(RobustError, ValueError, TypeError):
    """An argument that cannot work (a perturbation's parameters or output, a device); the message
    says what is accepted."""

    def __init__(self, message: str = "", key: str | None = None):
        super().__init__(message)
        self.key = key


class BudgetError(RobustError):
    """A check needed more model evaluations than its budget allows."""


class NotDifferentiable(RobustModelError):
    """A gradient was asked of an objective (a loss) that does not carry one."""


class SuiteError(Exception):
    """A problem in a suite file, located by file, line and key."""

    def __init__(self, where: str, line: int, key: str, problem: str):
        self.where, self.line, self.key, self.problem = where, line, key, problem
        super().__init__(f"{where}:{line}: {key + ': ' if key else ''}{problem}")


class FactoryError(Exception):
    """A model or data factory that raised; the message locates the factory in the suite."""

    def report(self) -> str:
        """The message, then the factory's traceback (from its own frame on)."""
        cause = self.__cause__
        if cause is None:
            return str(self)
        tb = cause.__traceback__.tb_next if cause.__traceback__ else None
        return f"{self}\n\n" + "".join(traceback.format_exception(type(cause), cause, tb)).rstrip()
