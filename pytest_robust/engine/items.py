"""Reading the user's data the same way every time: data items as (input, label), mapping items by
their common key names or by the ``data_keys`` setting. Shared by the data loader (``data``) and
the data inspections (``inspect.data``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pytest_robust.errors import RobustDataError

#: Keys of mapping items (the Hugging Face datasets shape) read as the input and as the label.
INPUT_KEYS = ("image", "pixel_values", "input_ids", "input", "inputs", "x")


LABEL_KEYS = ("label", "labels", "target", "targets", "y")


def input_and_label(item, keys: tuple[str, str] | None = None) -> tuple:
    """(input, label) of a data item or batch: an (input, label) pair, or a mapping with the keys
    ``keys`` = (input key, label key) (the check's ``data_keys`` setting, ``context.RunContext``)
    when given, else with one of ``INPUT_KEYS`` and one of ``LABEL_KEYS``;
    anything else is a RobustDataError naming what was found and how to name the keys."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    if isinstance(item, Mapping):
        _check_no_padding(item)
        named = keys
        keys = sorted(map(str, item))
        if named is not None:
            missing = [k for k in named if k not in item]
            if not missing:
                return item[named[0]], item[named[1]]
            raise RobustDataError(
                f"a data item is a mapping with keys {keys}, without {', '.join(map(repr, missing))} named by "
                f"data_keys={named!r}: name its input and label keys with data_keys=(input_key, label_key) "
                "(on the marker, robust_data_keys in ini, --robust-data-keys input_key,label_key)"
            )
        found = [next((k for k in keys_ if k in item), None) for keys_ in (INPUT_KEYS, LABEL_KEYS)]
        if None not in found:
            return item[found[0]], item[found[1]]
        features = [k for k in keys if k != found[1]]
        if found[0] is None and found[1] is not None and len(features) > 1:
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
    raise RobustDataError(f"each data item must be an (input, label) pair or a mapping, got {type(item).__name__}")


def _check_no_padding(item: Mapping) -> None:
    """A mapping item whose ``attention_mask`` has padded positions (zeros) is refused: a check calls
    the model with the input alone, so the mask would be dropped and the padding read as tokens."""
    mask = item.get("attention_mask")
    try:
        padded = mask is not None and not bool((torch.as_tensor(mask) != 0).all())
    except (TypeError, ValueError, RuntimeError):
        padded = False  # not a mask of numbers: not this check's to judge
    if padded:
        raise RobustDataError(
            "the data items carry an attention_mask with padded positions, which a check cannot pass to the model "
            "(it calls model(input_ids) alone, so the padding would be read as tokens): give inputs of one length "
            "without padding (all-ones masks are ignored), e.g. sentences cut or grouped to one length")


