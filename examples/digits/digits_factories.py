"""Factories that the YAML suite robust_digits.yaml names by import path.

The suite takes its models straight from ``digits_model:load_model``; the data needs this small
adapter because ``digits_split`` returns both halves of the split.
"""

from __future__ import annotations

import torch
from digits_model import digits_split


def held_out() -> tuple[torch.Tensor, torch.Tensor]:
    """The 359 held-out test digits as an (x, y) pair, x of shape (359, 1, 8, 8) in [0, 1]."""
    return digits_split()[1]
