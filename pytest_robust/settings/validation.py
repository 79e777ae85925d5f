"""Validators for settings and check arguments; each names the problem and what is accepted.

Pure Python: the library raises ``errors.SettingError`` (a RobustError and a ValueError), the
pytest layer turns it into a ``pytest.UsageError`` that also names where the value came from.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from pytest_robust.errors import SettingError
from pytest_robust.files import dangling_link

#: The ``precision`` settings: the dtype each runs the model under with autocast (None: the model's
#: own dtype, no autocast), and "auto" (bf16 on a CUDA device that supports it, else fp32).
PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
PRECISION_CHOICES = ("auto", *PRECISIONS)
DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def _number(key, raw, kind, accepted):
    if isinstance(raw, bool):
        raise SettingError(key, raw, accepted)
    value = raw
    if kind is float and isinstance(raw, str) and re.fullmatch(r"\s*[\d.]+\s*/\s*[\d.]+\s*", raw):
        numerator, denominator = raw.split("/")  # "8/255" in YAML, ini or on the command line
        try:
            value = float(numerator) / float(denominator)
        except (ValueError, ZeroDivisionError):
            raise SettingError(key, raw, accepted) from None
    if kind is int and isinstance(raw, str) and not raw.strip().lstrip("+-").isdigit():
        try:  # "1e4" from the command line, as 1e4 on a marker
            value = float(raw)
        except ValueError:
            raise SettingError(key, raw, accepted) from None
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise SettingError(key, raw, accepted) from None
    if kind is int and isinstance(value, float) and value != number:
        raise SettingError(key, raw, accepted)
    return number


def positive_int(key: str, value) -> int:
    number = _number(key, value, int, "an integer >= 1")
    if number < 1:
        raise SettingError(key, value, "an integer >= 1")
    return number


def batch_size_value(key: str, value) -> int | str:
    """An integer >= 1, or "auto" (``engine.batching``: probed on CUDA, 1024 elsewhere)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return positive_int(key, value)
    except SettingError:
        raise SettingError(key, value, 'an integer >= 1, or "auto" (the largest batch that still speeds up on CUDA, '
                                        '1024 elsewhere)') from None


def non_negative_int(key: str, value) -> int:
    number = _number(key, value, int, "an integer >= 0")
    if number < 0:
        raise SettingError(key, value, "an integer >= 0")
    return number


def unit_interval(key: str, value) -> float:
    """A number from 0 to 1 (a share of accuracy, e.g. the largest drop allowed)."""
    number = _number(key, value, float, "a number from 0 to 1")
    if not (math.isfinite(number) and 0.0 <= number <= 1.0):
        raise SettingError(key, value, "a number from 0 to 1")
    return number


def open_unit(key: str, value) -> float:
    """A probability strictly between 0 and 1 (confidence levels, thresholds)."""
    accepted = "a number strictly between 0 and 1"
    number = _number(key, value, float, accepted)
    if not (math.isfinite(number) and 0.0 < number < 1.0):
        raise SettingError(key, value, accepted)
    return number


def non_negative_float(key: str, value) -> float:
    accepted = "a finite number >= 0"
    number = _number(key, value, float, accepted)
    if not (math.isfinite(number) and number >= 0.0):
        raise SettingError(key, value, accepted)
    return number


def positive_float(key: str, value) -> float:
    accepted = "a finite number > 0"
    number = _number(key, value, float, accepted)
    if not (math.isfinite(number) and number > 0.0):
        raise SettingError(key, value, accepted)
    return number


def path(key: str, value) -> str:
    if not (isinstance(value, str) and value.strip()):
        raise SettingError(key, value, "a directory path")
    return value


def directory_path(key: str, value) -> str:
    """A directory to write into: it may not exist yet, but must not be a file, nor lie under one, nor
    be (or lie under) a symbolic link that points nowhere."""
    where = Path(path(key, value))
    problem = dangling_link(where)
    if problem:
        raise SettingError(key, value, f"a directory path ({problem})")
    for p in (where, *where.parents):
        if p.exists() and not p.is_dir():
            raise SettingError(key, value, f"a directory path ({p} exists and is a file)")
    return value


def file_path(key: str, value) -> str:
    """A file to write: it may not exist yet, but must not be a directory, nor lie under a file."""
    from pathlib import Path

    where = Path(path(key, value))
    if where.is_dir():
        raise SettingError(key, value,
                           "a file path (it is an existing directory; name a file such as robust.xml in it)")
    directory_path(key, str(where.parent))
    return value


#: Longest baseline name: it becomes a file name (``<name>.json``), well within the 255 bytes file
#: systems allow.
MAX_BASELINE_NAME = 128


def baseline_name(key: str, value) -> str:
    """A baseline's name becomes a file name: at most ``MAX_BASELINE_NAME`` letters, digits, '_', '-'
    and '.', not '.' or '..'."""
    if (not (isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", value)) or set(value) == {"."}
            or len(value) > MAX_BASELINE_NAME):
        raise SettingError(key, value, f"a baseline name of at most {MAX_BASELINE_NAME} letters, digits, '_', '-' "
                           "or '.' (no path separators or '..')")
    return value


def boolean(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SettingError(key, value, "true or false")


def device(key: str, value) -> str:
    text = str(value)
    if not DEVICE_RE.match(text):
        raise SettingError(key, value, "auto, cpu, cuda, cuda:N or mps")
    return text


def identifier(key: str, value) -> str:
    if not (isinstance(value, str) and value.isidentifier()):
        raise SettingError(key, value, "a fixture name (a Python identifier)")
    return value


def name(key: str, value) -> str:
    """A short name such as a profile: letters, digits, '_', '-' and '.'."""
    if not (isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", value)):
        raise SettingError(key, value, "a name of letters, digits, '_', '-' or '.'")
    return value


def choice(*options: str):
    """One of ``options``, spelt as they are (a value that differs only in case is named)."""
    def check(key: str, value) -> str:
        if value not in options:
            same = [o for o in options if isinstance(value, str) and o.lower() == value.lower()]
            raise SettingError(key, value, " or ".join(options) + (f" (did you mean {same[0]!r}?)" if same else ""))
        return value

    return check


def at_least(least: int):
    """An integer >= ``least``."""
    def check(key: str, value) -> int:
        number = _number(key, value, int, f"an integer >= {least}")
        if number < least:
            raise SettingError(key, value, f"an integer >= {least}")
        return number

    return check


def positive_pair(key: str, value) -> tuple[float, float]:
    """Two numbers > 0, e.g. a (start, end) schedule."""
    accepted = "a pair (start, end) of numbers > 0"
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise SettingError(key, value, accepted)
    try:
        return tuple(positive_float(key, v) for v in value)
    except SettingError:
        raise SettingError(key, value, accepted) from None


def function(key: str, value):
    """A callable (a function or an object with __call__)."""
    if not callable(value):
        raise SettingError(key, value, "a function")
    return value


def text(key: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise SettingError(key, value, "non-empty text")
    return value


def box(key: str, value):
    """The input box (lo, hi), or None for no box.

    Each bound is a number (either may be infinite: ``(0, inf)`` bounds count features from below
    only), a sequence of numbers or a tensor / array; lo < hi wherever both are given (the two
    broadcast together). How the bounds lie against an input (numpy's rule: by trailing
    dimensions) is checked against the inputs when the check runs (``inspect.perturbation.box_for``).
    Messages name the key; the one rule for every perturbation, check, marker, YAML file and call."""
    accepted = ("None (no box), or (lo, hi): numbers (either may be infinite, e.g. (0, inf)), sequences or tensors "
                "that broadcast against one input, with lo < hi everywhere, e.g. (0.0, 1.0)")
    if value is None:
        return None
    if isinstance(value, str) or not hasattr(value, "__len__") or len(value) != 2:
        raise SettingError(key, value, accepted)
    import numpy as np  # only when a box is given: the plugin starts without it

    lo, hi = (_bound_array(key, value, v, accepted) for v in value)
    try:
        ordered = bool((np.broadcast_to(lo, np.broadcast_shapes(lo.shape, hi.shape))
                        < np.broadcast_to(hi, np.broadcast_shapes(lo.shape, hi.shape))).all())
    except ValueError:
        raise SettingError(key, value, accepted + f" (lo of shape {lo.shape} and hi of shape {hi.shape} do not "
                                                  "broadcast together)") from None
    if not ordered:
        raise SettingError(key, value, accepted + " (lo >= hi somewhere)")
    return tuple(value)


def _bound_array(key: str, value, bound, accepted: str):
    """One bound as a float array (a tensor is read through numpy); NaN or a non-number is refused."""
    import numpy as np

    if isinstance(bound, bool):
        raise SettingError(key, value, accepted)
    data = bound.detach().cpu().numpy() if hasattr(bound, "detach") else bound
    try:
        array = np.asarray(data, dtype=float)
    except (TypeError, ValueError):
        raise SettingError(key, value, accepted) from None
    if np.isnan(array).any():
        raise SettingError(key, value, accepted + " (a bound is NaN)")
    return array


def size(key: str, value):
    """A size in input units: a finite number > 0, or one number >= 0 per feature (a sequence,
    tensor or array, not all 0; 0 keeps a feature fixed), returned as given (its shape is checked
    against the inputs when the check runs)."""
    if isinstance(value, str) or not hasattr(value, "__len__"):
        return positive_float(key, value)
    import numpy as np

    accepted = "a finite number > 0, or one number >= 0 per feature (0 keeps a feature fixed), not all 0"
    try:
        array = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value, dtype=float)
    except (TypeError, ValueError):
        raise SettingError(key, value, accepted) from None
    if array.size == 0 or not np.isfinite(array).all() or (array < 0).any() or not (array > 0).any():
        raise SettingError(key, value, accepted)
    return value


def text_list(key: str, value) -> list[str]:
    """A list of names (one name is a list of one)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(v, str) for v in items):
        raise SettingError(key, value, "a name or a non-empty list of names")
    return list(items)


def int_list(key: str, value) -> list[int]:
    """A list of integers >= 1 (one integer is a list of one)."""
    items = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise SettingError(key, value, "an integer or a non-empty list of integers >= 1")
    return [positive_int(key, v) for v in items]


@dataclass(frozen=True)
class RunArgs:
    """The common arguments of a metric function, validated and converted."""

    threshold: float | None
    confidence: float
    budget: int | None  # None: no cap (fixed-size procedures, whose work is set by their arguments)
    seed: int
    batch_size: int | str  # "auto": engine.batching

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence


def threshold_value(key: str, value, direction: str = ">=") -> float:
    """The one rule for thresholds: of an "at least" requirement (``direction`` ">=", an accuracy)
    a probability strictly between 0 and 1, of an "at most" one ("<=", a loss) a number >= 0."""
    return non_negative_float(key, value) if direction == "<=" else open_unit(key, value)


def check_run_args(*, threshold, confidence, budget, seed, batch_size, direction: str = ">=") -> RunArgs:
    """Validate and convert the common arguments of a metric function (raises SettingError).

    A threshold of an "at least" requirement (``direction`` ">=", an accuracy) is a probability
    strictly between 0 and 1; one of an "at most" requirement ("<=", a loss) is a number >= 0."""
    return RunArgs(
        threshold=None if threshold is None else threshold_value("threshold", threshold, direction),
        confidence=open_unit("confidence", confidence),
        budget=None if budget is None else positive_int("budget", budget),
        seed=non_negative_int("seed", seed),
        batch_size=batch_size_value("batch_size", batch_size),
    )
