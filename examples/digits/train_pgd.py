"""Train the PGD adversarially trained digits model (Madry et al. 2018) shipped as checkpoints/pgd.pt.

    python examples/digits/train_pgd.py        # about a minute on one CPU core

Every training batch is replaced by its PGD adversarial examples in the L-inf ball of radius
EPS = 0.3 intersected with [0, 1] (PGD_STEPS signed-gradient steps of size 2.5 * EPS / PGD_STEPS
from a uniform random start, ``pytest_robust.attacks.pgd``), the "PGD" row of the paper's Table 1
next to the standard and noise-trained models of train.py. ``train.train(corrupt=...)`` cannot
be reused as is: its corruption does not see the model being trained, which PGD needs. The
optimiser, epochs, batch size and seeds are train.py's.
"""

from __future__ import annotations

import torch
from torch import nn

from digits_model import CHECKPOINTS, DigitsCNN, digits_split
from train import BATCH, EPOCHS, accuracy

from pytest_robust.attacks import pgd

EPS = 0.3
PGD_STEPS = 7


def train_pgd(seed: int = 0) -> DigitsCNN:
    torch.manual_seed(seed)
    (x, y), _ = digits_split()
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(EPOCHS):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), BATCH):
            idx = order[start : start + BATCH]
            x_adv, _ = pgd(model, x[idx], y[idx], EPS, steps=PGD_STEPS, generator=gen)
            loss = nn.functional.cross_entropy(model(x_adv), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def main() -> None:
    torch.set_num_threads(1)
    CHECKPOINTS.mkdir(exist_ok=True)
    model = train_pgd()
    path = CHECKPOINTS / "pgd.pt"
    torch.save(model.state_dict(), path)
    print(f"pgd: clean test accuracy {accuracy(model):.4f} -> {path}")


if __name__ == "__main__":
    main()
