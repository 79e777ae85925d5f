"""Fixtures for the text robustness suite: the sentiment model on token ids and 500 held-out
generated sentences (``sentiment_model``)."""

import pytest
import torch
from sentiment_model import sentences, train_model

# The model is tiny: one CPU thread computes it as fast as two (the digits suite does the same).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def robust_model(robust_device):
    """The sentiment model, trained once per session (seeded, about a second)."""
    return train_model().to(robust_device)


@pytest.fixture(scope="session")
def robust_data():
    """500 generated sentences the model never saw (424 after dropping ties), as token ids."""
    return sentences(500, seed=2)
