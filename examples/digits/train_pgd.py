"""Train the PGD adversarially trained digits model (Madry et al. 2018) shipped as checkpoints/pgd.pt.

    python examples/digits/train_pgd.py        # about a minute on one CPU core

Every training batch is replaced by its PGD adversarial examples in the L-inf ball of radius
EPS = 0.3 intersected with [0, 1] (PGD_STEPS signed-gradient steps of size 2.5 * EPS / PGD_STEPS
from a uniform random start, ``pytest_robust.attacks.pgd``), the "PGD" row of the paper's Table 1
next to the standard and noise-trained models of train.py, whose training loop (optimiser,
epochs, batch size, seeds) it reuses with ``train(attack=...)``.
"""

from __future__ import annotations

import torch
from digits_model import CHECKPOINTS, DigitsCNN
from train import accuracy, train

from pytest_robust.attacks import pgd
from pytest_robust.engine.forward import Forward

EPS = 0.3
PGD_STEPS = 7


def train_pgd(seed: int = 0) -> DigitsCNN:
    """train.py's loop with every batch replaced by its PGD adversarial examples."""

    def attack(model, x, y, gen):
        return pgd(Forward(model, batch_size=len(x)), x, y, EPS, steps=PGD_STEPS, generator=gen).x

    return train(seed=seed, attack=attack)


def main() -> None:
    torch.set_num_threads(1)
    CHECKPOINTS.mkdir(exist_ok=True)
    model = train_pgd()
    path = CHECKPOINTS / "pgd.pt"
    torch.save(model.state_dict(), path)
    print(f"pgd: clean test accuracy {accuracy(model):.4f} -> {path}")


if __name__ == "__main__":
    main()
