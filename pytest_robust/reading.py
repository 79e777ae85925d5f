"""Reading the user's data the same way every time: data items as (input, label), and the host RNG.

Shared by the engine (``load_data``) and the inspections (``check_reads_repeat``), so neither
imports the other for it. Pure torch, no other module of the package.
"""

from __future__ import annotations

import contextlib

import torch

from .errors import RobustDataError


@contextlib.contextmanager
def host_rng(seed: int):
    """Run the block with the global CPU generator seeded with ``seed``, restoring its state after.

    Only the CPU generator is touched (``torch.manual_seed`` would also reseed every CUDA device,
    and ``fork_rng(devices=[])`` would not restore them): a user's CUDA RNG is never changed.
    """
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


#: Keys of mapping items (the Hugging Face datasets shape) read as the input and as the label.
INPUT_KEYS = ("image", "pixel_values", "input", "inputs", "x")
LABEL_KEYS = ("label", "labels", "target", "targets", "y")


def input_and_label(item) -> tuple:
    """(input, label) of a data item or batch: an (input, label) pair, or a mapping with one of
    ``INPUT_KEYS`` and one of ``LABEL_KEYS``; anything else is a RobustDataError naming what was found."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    if isinstance(item, dict):
        found = [next((k for k in keys if k in item), None) for keys in (INPUT_KEYS, LABEL_KEYS)]
        if None not in found:
            return item[found[0]], item[found[1]]
        raise RobustDataError(
            f"a data item is a mapping with keys {sorted(map(str, item))}: pytest-robust reads the input from "
            f"one of {', '.join(INPUT_KEYS)} and the label from one of {', '.join(LABEL_KEYS)}; rename the "
            "columns (datasets' rename_column) or pass an (x, y) tensor pair"
        )
    raise RobustDataError(f"each data item must be an (input, label) pair or a mapping, got {type(item).__name__}")
