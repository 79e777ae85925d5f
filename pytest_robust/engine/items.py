"""Reading the user's data the same way every time: data items as (input, label), mapping items by
their common key names or by the ``data_keys`` setting, with what else they carry for the model
(``padding``: the attention mask and other keys; a pair's second part). Shared by the data loader
(``data``) and the data inspections (``inspect.data``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pytest_robust.errors import RobustDataError

#: Keys of mapping items (the Hugging Face datasets shape) read as the input and as the label.
INPUT_KEYS = ("image", "pixel_values", "input_ids", "input", "inputs", "x")


LABEL_KEYS = ("label", "labels", "target", "targets", "y")


def input_and_label(item, keys: tuple[str, str] | None = None) -> tuple:
    """(input, label, the rest) of a data item or batch: an (input, label) pair, or a mapping with
    the keys ``keys`` = (input key, label key) (the check's ``data_keys`` setting,
    ``context.RunContext``) when given, else with one of ``INPUT_KEYS`` and one of ``LABEL_KEYS``;
    anything else is a RobustDataError naming what was found and how to name the keys. The rest
    (``rest``) is what the item holds for the model besides the input, by key."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        inputs, extra = parts(item[0])
        return inputs, item[1], extra
    if isinstance(item, Mapping):
        input_key, label_key = _keys(item, keys)
        return item[input_key], item[label_key], rest(item, input_key, label_key)
    parts_hint = ("; for items of (input_ids, attention_mask, label), as a TensorDataset gives, pass "
                  "((input_ids, attention_mask), labels) or mapping items"
                  if isinstance(item, (tuple, list)) and len(item) == 3 else "")
    raise RobustDataError(f"each data item must be an (input, label) pair or a mapping, got {type(item).__name__}"
                          f"{f' of {len(item)}' if isinstance(item, (tuple, list)) else ''}{parts_hint}")


def parts(inputs) -> tuple:
    """(input, the rest) of an item's or a batch's input part: a pair of tensors
    (input_ids, attention_mask) passes its second tensor to the model positionally (key 1,
    ``padding``); more tensors are refused."""
    if isinstance(inputs, (tuple, list)) and inputs and all(isinstance(p, torch.Tensor) for p in inputs):
        if len(inputs) != 2:
            raise RobustDataError(
                f"the inputs are {len(inputs)} tensors: a check perturbs one input tensor and passes the model at "
                "most one more, its attention mask ((input_ids, attention_mask) pairs); pass mapping items "
                "({'input_ids': ..., 'attention_mask': ..., 'label': ...}) for more keys, or the model as a module "
                "whose forward takes one tensor")
        return inputs[0], {1: inputs[1]}
    return inputs, {}


def rest(item: Mapping, input_key, label_key) -> dict:
    """The tensors of a mapping item besides its input and its label, which may reach the model
    (``padding``); never a label key: a Hugging Face forward given labels computes a loss."""
    return {k: v for k, v in item.items()
            if k not in (input_key, label_key) and k not in LABEL_KEYS and isinstance(v, torch.Tensor)}


def _keys(item: Mapping, keys) -> tuple:
    """(input key, label key) of a mapping item (``input_and_label``)."""
    named = keys
    keys = sorted(map(str, item))
    if named is not None:
        missing = [k for k in named if k not in item]
        if not missing:
            return named
        raise RobustDataError(
            f"a data item is a mapping with keys {keys}, without {', '.join(map(repr, missing))} named by "
            f"data_keys={named!r}: name its input and label keys with data_keys=(input_key, label_key) "
            "(on the marker, robust_data_keys in ini, --robust-data-keys input_key,label_key)")
    found = [next((k for k in keys_ if k in item), None) for keys_ in (INPUT_KEYS, LABEL_KEYS)]
    if None not in found:
        return tuple(found)
    features = [k for k in keys if k != found[1]]
    scalars = all(torch.as_tensor(item[k]).ndim <= 1 for k in features  # one number per item: columns
                  if isinstance(item[k], (torch.Tensor, int, float)))
    if found[0] is None and found[1] is not None and len(features) > 1 and scalars:
        raise RobustDataError(
            f"a data item is a mapping of {len(features)} features ({', '.join(map(repr, features[:5]))}"
            f"{', ...' if len(features) > 5 else ''}) and the label {found[1]!r}: pytest-robust reads one input "
            "tensor per item, so stack the features in the model's column order, e.g. a Dataset returning "
            "(torch.tensor([item[k] for k in FEATURES], dtype=torch.float32), item['label']), or pass an (x, y) "
            "pair such as (DataFrame of the features, Series of the labels)")
    raise RobustDataError(
        f"a data item is a mapping with keys {keys}: pytest-robust reads the input from "
        f"one of {', '.join(INPUT_KEYS)} and the label from one of {', '.join(LABEL_KEYS)}; name yours with "
        "data_keys=(input_key, label_key) (on the marker, robust_data_keys in ini, --robust-data-keys "
        "input_key,label_key), rename the columns (datasets' rename_column) or pass an (x, y) tensor pair"
    )
