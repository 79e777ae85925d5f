"""Fixtures for the digits robustness suite: the models and the held-out test split."""

import pytest

from digits_model import digits_split, load_model


@pytest.fixture(scope="session")
def robust_model(robust_device):
    """The standard (clean-trained) CNN, on the device the checks run on."""
    return load_model("standard").to(robust_device)


@pytest.fixture(scope="session")
def noise_model(robust_device):
    """The CNN corruption-trained with UniformLinf(eps=0.3) noise."""
    return load_model("noise").to(robust_device)


@pytest.fixture(scope="session")
def robust_data():
    """The 359 held-out test digits as an (x, y) pair, x in [0, 1] pixel units."""
    return digits_split()[1]
