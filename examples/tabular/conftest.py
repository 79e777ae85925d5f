"""Fixtures for the tabular robustness suite: the breast-cancer MLP on standardized features
(``robust_model``, ``robust_data``) and the same MLP with the training scaler inside it, on the raw
features in their own units (``raw_model``, ``raw_data``)."""

import pytest
import torch
from cancer_model import cancer_split, train_model, with_scaler

# The MLP is tiny: one CPU thread computes it as fast as two (the digits suite does the same).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def mlp():
    """The MLP, trained once per session (seeded, about 0.2 s)."""
    return train_model()


@pytest.fixture(scope="session")
def robust_model(mlp, robust_device):
    """The MLP on standardized features (standard deviations of the training split)."""
    return mlp.to(robust_device)


@pytest.fixture(scope="session")
def robust_data():
    """The 171 held-out tumours, standardized with the training scaler."""
    return cancer_split(standardize=True)[1]


@pytest.fixture(scope="session")
def raw_model(mlp, robust_device):
    """The MLP with the training scaler as its first layer: it takes the raw measurements."""
    return with_scaler(mlp).to(robust_device)


@pytest.fixture(scope="session")
def raw_data():
    """The 171 held-out tumours in the measurements' own units (all non-negative)."""
    return cancer_split()[1]
