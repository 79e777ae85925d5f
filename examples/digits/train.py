"""Train the digits models whose checkpoints ship in checkpoints/ (seconds on a CPU).

    python examples/digits/train.py

- standard.pt: ordinary training on clean images;
- noise.pt:    corruption training (Wang et al., section 6): every training image is replaced by a
               draw from UniformLinf(eps=0.3) around it, the TSRM counterpart of adversarial training.
Seeded (torch.manual_seed(0), one thread); prints clean test accuracy for each model.
"""

from __future__ import annotations

import torch
from digits_model import CHECKPOINTS, DigitsCNN, digits_split
from torch import nn

from pytest_robust import UniformLinf

EPOCHS = 60
BATCH = 64
NOISE_EPS = 0.3


def train(corrupt=None, seed: int = 0, attack=None) -> DigitsCNN:
    """Adam on cross-entropy; each batch is replaced by ``corrupt(x, generator)`` (random corruption)
    or by ``attack(model, x, y, generator)`` (adversarial examples against the model being trained)."""
    torch.manual_seed(seed)
    (x, y), _ = digits_split()
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(EPOCHS):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), BATCH):
            idx = order[start : start + BATCH]
            xb = x[idx]
            if corrupt is not None:
                xb = corrupt(xb, gen)
            if attack is not None:
                xb = attack(model, xb, y[idx], gen)
            loss = nn.functional.cross_entropy(model(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def accuracy(model: DigitsCNN) -> float:
    _, (x, y) = digits_split()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main() -> None:
    torch.set_num_threads(1)
    CHECKPOINTS.mkdir(exist_ok=True)
    for name, corrupt in (("standard", None), ("noise", UniformLinf(eps=NOISE_EPS))):
        model = train(corrupt)
        torch.save(model.state_dict(), CHECKPOINTS / f"{name}.pt")
        print(f"{name}: clean test accuracy {accuracy(model):.4f} -> {CHECKPOINTS / (name + '.pt')}")


if __name__ == "__main__":
    main()
