"""Fixtures for the CIFAR-10 robustness suite: data and weights come from environment variables.

- ``ROBUST_CIFAR10_DIR``: the folder holding ``cifar-10-batches-py`` (the python version of
  CIFAR-10, unpacked), or that folder itself;
- ``ROBUST_CIFAR10_WEIGHTS``: the standard-trained ResNet-18 (``train_resnet18.py``);
- ``ROBUST_CIFAR10_SMOOTHING_WEIGHTS``: the ResNet-18 trained with Gaussian noise of sigma = 0.25
  (``train_resnet18.py --noise-sigma 0.25``), used by the randomized-smoothing check only.

When a variable is unset every test that needs it is skipped, with the variable's name in the
reason; collection never needs them. A variable that is set but points nowhere is an error, not a
skip: a runner that was meant to gate must not pass by skipping.
"""

from __future__ import annotations

import os

import pytest
from cifar10_resnet import load_model, load_split

README = "examples/cifar10/README.md"
DATA_VAR = "ROBUST_CIFAR10_DIR"
WEIGHTS_VAR = "ROBUST_CIFAR10_WEIGHTS"
SMOOTHING_WEIGHTS_VAR = "ROBUST_CIFAR10_SMOOTHING_WEIGHTS"
#: Every CERTIFICATION_STRIDE-th test image is certified (500 of 10 000, as in Cohen et al. 2019).
CERTIFICATION_STRIDE = 20


def _env_paths(*names: str) -> list[str]:
    """The values of ``names``; skips the requesting tests, naming the unset ones, if any is unset."""
    values = {name: os.environ.get(name, "").strip() for name in names}
    missing = [name for name, value in values.items() if not value]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: the CIFAR-10 suite "
            f"needs the dataset and trained weights on this machine (see {README})"
        )
    return [values[name] for name in names]


@pytest.fixture(scope="session", autouse=True)
def cifar10_paths() -> tuple[str, str]:
    """(data folder, weights file) from the environment; every test here is skipped without them."""
    data, weights = _env_paths(DATA_VAR, WEIGHTS_VAR)
    return data, weights


@pytest.fixture(scope="session")
def robust_data(cifar10_paths):
    """The 10 000 CIFAR-10 test images as an (x, y) pair, x in [0, 1] pixel units."""
    return load_split(cifar10_paths[0], "test")


@pytest.fixture(scope="session")
def certification_data(robust_data):
    """Every 20th test image (500 of them): certification spends thousands of draws per input."""
    x, y = robust_data
    return x[::CERTIFICATION_STRIDE], y[::CERTIFICATION_STRIDE]


@pytest.fixture(scope="session")
def robust_model(cifar10_paths, robust_device):
    """The standard-trained ResNet-18 (normalization inside), on the device the checks run on."""
    return load_model(cifar10_paths[1]).to(robust_device)


@pytest.fixture(scope="session")
def smoothed_model(robust_device):
    """The ResNet-18 trained under Gaussian noise of sigma = 0.25, the base classifier of smoothing."""
    (weights,) = _env_paths(SMOOTHING_WEIGHTS_VAR)
    return load_model(weights).to(robust_device)
