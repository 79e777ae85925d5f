"""The exception family of pytest-robust (pure Python; no torch, no pytest).

Everything a user must fix derives from ``RobustError``: the pytest layer catches this family and
turns it into a failed test (or, for settings, a usage error) that shows the message without a
traceback. Any other exception is a bug in pytest-robust or in the model and keeps its traceback.
"""

from __future__ import annotations


class RobustError(Exception):
    """Base class: something the user must change (a setting, the model, the data)."""


class SettingError(RobustError, ValueError):
    """An invalid value for a named setting or argument."""

    def __init__(self, key: str, value, accepted: str):
        self.key, self.value, self.accepted = key, value, accepted
        super().__init__(f"{key}={value!r} is invalid: expected {accepted}")


class MarkerError(RobustError, ValueError):
    """A ``robust`` marker (or YAML check) that cannot be run as written."""


class RobustDataError(RobustError, ValueError):
    """The data cannot be evaluated as given (empty, wrong shape or type, labels out of range)."""


class RobustModelError(RobustError, RuntimeError):
    """The model cannot be evaluated as given (wrong device, bad logits, modifies itself)."""


class RobustWarning(UserWarning):
    """Something the user should know about how a check was evaluated."""


class ArgumentError(RobustError, ValueError, TypeError):
    """An argument that cannot work (a perturbation's parameters or output, a device); the message
    says what is accepted."""
