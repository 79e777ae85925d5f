"""The containers people hold data in, read as tensors (``as_tensor``), so that every container of
the same numbers gives the same check:

- torch tensors as they are; torch sparse tensors densified;
- numpy arrays as they are; numpy object arrays of numbers as float64;
- pandas DataFrames by their columns in order, and Series by their values (duck-typed: pytest-robust
  never imports pandas); a column that is not numeric (text, categories, dates) is named in an error;
- scipy.sparse matrices densified (``toarray()``).

Sparse features are densified whole when the data is read, not batch by batch: a check holds its
inputs as one dense tensor (n × d values, 4 bytes each in float32), as it does for every container.

Strings are refused: as labels with the labels found and the fix (map them to 0..K-1 in the order of
the model's outputs), as inputs with the fix (encode them as numbers, or token ids for a text model).
"""

from __future__ import annotations

import numpy as np
import torch

from pytest_robust.errors import RobustDataError

#: Distinct string labels shown in the error that refuses them.
SHOWN_LABELS = 5


def as_tensor(value, role: str) -> torch.Tensor:
    """``value`` (``role``: "inputs" or "labels") as a dense strided tensor (module docstring); a
    RobustDataError names what cannot be read as numbers and how to fix it."""
    if isinstance(value, torch.Tensor):
        return value.to_dense() if value.layout != torch.strided else value
    if hasattr(value, "columns") and hasattr(value, "dtypes") and hasattr(value, "to_numpy"):
        value = _frame_values(value, role)
    elif hasattr(value, "dtype") and hasattr(value, "to_numpy") and hasattr(value, "index"):
        value = value.to_numpy()  # a pandas Series
    elif hasattr(value, "toarray") and hasattr(value, "nnz"):
        value = value.toarray()  # a scipy.sparse matrix or array
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        try:
            return torch.stack(list(value))  # one tensor per input
        except RuntimeError:
            raise RobustDataError(f"the {role} are tensors of different shapes ({tuple(value[0].shape)}, ...; ragged "
                                  "sequences?): pad or cut them to one shape") from None
    if not isinstance(value, np.ndarray):
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            value = np.asarray(value, dtype=object)
    value = _numeric(value, role)
    return torch.as_tensor(value if value.flags.writeable else value.copy())  # pandas' copy-on-write views


def _frame_values(frame, role: str) -> np.ndarray:
    """A DataFrame's values, column by column in order, once every column is numeric (or bool);
    inputs as float64, missing values as NaN (which the data check then names)."""
    for name, dtype in zip(frame.columns, frame.dtypes):
        if getattr(dtype, "kind", "O") not in "biuf":
            what = "the input" if role == "inputs" else "the label"
            raise RobustDataError(
                f"{what} DataFrame's column {name!r} is not numeric (dtype {dtype}): pytest-robust reads a "
                "DataFrame's columns in order as numbers; encode that column as the model was trained (one-hot "
                "columns, category codes) or drop it, e.g. df.drop(columns=[...]) or pd.get_dummies(df)")
    return frame.to_numpy(dtype=np.float64, na_value=np.nan) if role == "inputs" else frame.to_numpy()


def _numeric(array: np.ndarray, role: str) -> np.ndarray:
    """A numpy array the tensor constructor takes: object arrays of numbers as float64 (int64 for
    labels that are all whole numbers); strings refused (module docstring)."""
    if array.dtype.kind in "biufc":
        return array
    if array.dtype.kind in "US" or (array.dtype.kind == "O" and any(isinstance(v, (str, bytes)) for v in array.flat)):
        raise RobustDataError(_not_numbers(array, role))
    try:
        numbers = array.astype(np.float64)
    except (TypeError, ValueError):
        raise RobustDataError(_not_numbers(array, role)) from None
    whole = role == "labels" and all(isinstance(v, (int, np.integer)) for v in array.flat)
    return numbers.astype(np.int64) if whole else numbers


def _not_numbers(array: np.ndarray, role: str) -> str:
    """The error for an array that holds values other than numbers."""
    if role == "labels":
        found = list(dict.fromkeys(map(str, array.flat)))
        shown = ", ".join(map(repr, found[:SHOWN_LABELS])) + (", ..." if len(found) > SHOWN_LABELS else "")
        return (f"the labels are not class indices: found {len(found)} distinct labels ({shown}); map them to "
                f"0..K-1 in the order of the model's outputs, e.g. y = np.array([classes.index(v) for v in y]) with "
                "classes the model's class names in output order (scikit-learn's LabelEncoder sorts them, which "
                "matches only a model trained on its codes)")
    bad = next((v for v in array.flat if isinstance(v, (str, bytes)) or not _is_number(v)), array.flat[0])
    if isinstance(bad, (list, tuple, np.ndarray)):
        return (f"the {role} are rows of different lengths (a row of {len(bad)} values; ragged sequences?): pad or "
                "cut them to one length (token ids: the tokenizer's padding=True or truncation)")
    return (f"the inputs hold a value that is not a number ({bad!r}, of type {type(bad).__name__}): encode such "
            "features as numbers as the model was trained (one-hot columns, category codes); text for a token-id "
            "model goes in as its token ids (the tokenizer's output), not as strings")


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
