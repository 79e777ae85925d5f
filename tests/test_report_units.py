"""Numbers in messages carry their units and a sensible format (issue 27): NPPR's per-input draw
count is a rounded mean per input, never a raw float."""

from __future__ import annotations

import re

from test_model_interface import SIX, images, small_net


def test_nppr_states_its_per_input_draws_as_a_rounded_mean_per_input():
    result = SIX["nppr"](small_net(), images())
    message = result.message()
    assert re.search(r"per-input PR over \d+\.\d draws per input on average: mean", message), message
    assert not re.search(r"\d\.\d{3,} draws", message)
    assert isinstance(result.details["per_input_pr"]["draws"], float)  # the exact mean stays in the details
