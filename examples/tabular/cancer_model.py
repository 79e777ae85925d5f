"""The tabular example: scikit-learn's bundled breast-cancer data (569 tumours, 30 non-negative
measurements; label 0 malignant, 1 benign) and a small MLP trained on it in well under a second.

``cancer_split`` holds out a fixed 30% of the rows (scikit-learn's ``train_test_split``, seeded);
``SCALER`` is a ``StandardScaler`` fitted on the training rows (``mean_``, ``scale_`` per feature);
``train_model`` trains the MLP on standardized features (seeded, full batch); ``with_scaler`` puts
the scaler inside the model, for checks in the features' own units.

    python examples/tabular/cancer_model.py   # trains and prints the held-out accuracy
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

DATA = load_breast_cancer()
FEATURES = list(DATA.feature_names)
X_TRAIN, X_TEST, Y_TRAIN, Y_TEST = train_test_split(DATA.data, DATA.target, test_size=0.3, random_state=0)
#: The training scaler: one standard deviation of each feature, in its own units, is SCALER.scale_.
SCALER = StandardScaler().fit(X_TRAIN)
#: Adam steps of the full-batch training (about 0.2 s on one CPU core).
STEPS = 300


def cancer_split(standardize: bool = False):
    """((x_train, y_train), (x_test, y_test)) as float32 features and integer labels: the raw
    measurements, or with ``standardize`` the training scaler's output."""
    prepare = SCALER.transform if standardize else (lambda x: x)
    return tuple((torch.tensor(prepare(x), dtype=torch.float32), torch.tensor(y))
                 for x, y in ((X_TRAIN, Y_TRAIN), (X_TEST, Y_TEST)))


def train_model(seed: int = 0) -> torch.nn.Module:
    """A 30-32-2 MLP trained on the standardized training split (cross-entropy, Adam, weight decay)."""
    (x, y), _ = cancer_split(standardize=True)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(30, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-3)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


class Standardize(torch.nn.Module):
    """The training scaler as the model's first layer: raw features in, standard deviations out."""

    def __init__(self, scaler: StandardScaler):
        super().__init__()
        self.register_buffer("mean", torch.tensor(scaler.mean_, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(scaler.scale_, dtype=torch.float32))

    def forward(self, x):
        return (x - self.mean) / self.std


def with_scaler(model: torch.nn.Module) -> torch.nn.Module:
    """The model on raw features: Sequential(Standardize(SCALER), model)."""
    return torch.nn.Sequential(Standardize(SCALER), model).eval()


if __name__ == "__main__":
    model = train_model()
    x_test, y_test = cancer_split(standardize=True)[1]
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean()
    print(f"held-out accuracy {accuracy:.3f} on {len(y_test)} tumours")
