"""Robustness gates on a breast-cancer classifier (30 features, 2 classes): noise and attacks in
the features' units, with 95% confidence. docs/tabular.md explains each choice.

Measured once with 20 000 draws or every input (seed 0, for orientation): TSRM 0.943 under
GaussianNoise(sigma=0.3) in standard deviations, 0.954 under UniformLinf(eps=0.1 scale_) on the raw
features; adversarial accuracy 0.912 / 0.860 / 0.696 at L-inf eps 0.05 / 0.1 / 0.2 standard
deviations; certified accuracy 0.901 at L2 radius 0.25 (sigma 0.25). Clean accuracy 0.953 on the
171 held-out tumours (python examples/tabular/cancer_model.py).
"""

import math

import pytest
import torch
from cancer_model import FEATURES, SCALER

from pytest_robust import GaussianNoise, UniformLinf

#: The training scaler's per-feature std (StandardScaler's scale_): one standard deviation of each
#: feature in its own units (millimetres, square millimetres, ratios ...).
SCALE = torch.tensor(SCALER.scale_, dtype=torch.float32)
#: The measurements of the nuclei's size may be off by a tenth of their spread; the other features
#: are taken as exact (a size of 0 keeps a feature fixed).
SIZE = torch.tensor([0.1 if name.split()[-1] in ("radius", "perimeter", "area") else 0.0 for name in FEATURES])


@pytest.mark.robust(tsrm=0.90, perturbation=GaussianNoise(sigma=0.3, bounds=None))
def test_noise_of_a_third_of_a_standard_deviation():
    """Standardized features: sigma is in standard deviations, and there is no box (bounds=None)."""


@pytest.mark.robust(tsrm=0.90, perturbation=UniformLinf(eps=0.1 * SCALE, bounds=(0, math.inf)), model="raw_model",
                    data="raw_data")
def test_measurement_error_of_a_tenth_of_each_features_spread():
    """Raw features: one eps per feature, from the training scaler; measurements stay non-negative."""


@pytest.mark.robust(adversarial_accuracy=0.75, eps=0.1, bounds=None)
def test_worst_case_shift_of_a_tenth_of_a_standard_deviation():
    """An attacker who moves every standardized feature by up to 0.1 (L-inf) leaves 75% correct."""


@pytest.mark.robust(adversarial_accuracy=0.80, eps=SIZE * SCALE, bounds=(0, math.inf), model="raw_model",
                    data="raw_data")
def test_worst_case_error_in_the_size_measurements_only():
    """Per-feature eps: the size measurements move by up to 0.1 std each, the others stay fixed."""


@pytest.mark.robust(certified_accuracy=0.80, radius=0.25, sigma=0.25)
def test_certified_within_a_quarter_of_a_standard_deviation():
    """Randomized smoothing on standardized features: certified accuracy at L2 radius 0.25."""
