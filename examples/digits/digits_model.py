"""A small CNN for scikit-learn's bundled 8x8 digits, and the fixed train/test split used everywhere.

Inputs are (n, 1, 8, 8) floats in [0, 1] pixel units (the raw 0..16 grey levels divided by 16),
so eps=0.1 means 1.6 grey levels. No download: ``sklearn.datasets.load_digits`` ships the data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

CHECKPOINTS = Path(__file__).parent / "checkpoints"
TEST_FRACTION = 0.2
SPLIT_SEED = 0


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def digits_split() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """((x_train, y_train), (x_test, y_test)): a seeded 80/20 split of the 1797 digits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.from_numpy(np.random.default_rng(SPLIT_SEED).permutation(len(y)))
    n_test = int(round(TEST_FRACTION * len(y)))
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def load_model(name: str) -> DigitsCNN:
    """A trained model from checkpoints/<name>.pt (see train.py), in eval mode."""
    model = DigitsCNN()
    model.load_state_dict(torch.load(CHECKPOINTS / f"{name}.pt", weights_only=True))
    return model.eval()


def noisy_copy(model: DigitsCNN, scale: float, seed: int = 0) -> DigitsCNN:
    """A copy of ``model`` with seeded Gaussian noise of ``scale`` times each tensor's spread added
    to its weights: a candidate a little worse than the model (2-3 points of accuracy under
    UniformLinf(8/255) at scale 0.3), for the paired gate's tests and benchmark."""
    import copy

    noisy = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=generator))
    return noisy
