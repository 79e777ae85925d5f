"""Train the digits models for randomized smoothing (seconds on a CPU).

    python examples/digits/train_smoothing.py

Gaussian training (Cohen et al. 2019): every training image is replaced by x + N(0, sigma^2 I),
with the noise added in [0, 1] pixel space and not clipped, exactly as the smoothed classifier
sees it at certification time. One model per noise level:

- checkpoints/gaussian_0.25.pt: sigma = 0.25
- checkpoints/gaussian_0.50.pt: sigma = 0.5

Same architecture, optimiser, epochs and seed as train.py (its ``train`` function is reused);
prints the clean test accuracy and the test accuracy under the training noise of each model.
"""

from __future__ import annotations

import torch
from digits_model import CHECKPOINTS, digits_split
from train import train

SIGMAS = (0.25, 0.5)


class GaussianTrainingNoise:
    """x -> x + sigma * N(0, I), unclipped, drawn from the training loop's generator."""

    def __init__(self, sigma: float):
        self.sigma = sigma

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return x + self.sigma * torch.randn(x.shape, generator=generator)


def checkpoint_name(sigma: float) -> str:
    return f"gaussian_{sigma:.2f}"


def main() -> None:
    torch.set_num_threads(1)
    CHECKPOINTS.mkdir(exist_ok=True)
    _, (x, y) = digits_split()
    for sigma in SIGMAS:
        model = train(GaussianTrainingNoise(sigma))
        path = CHECKPOINTS / f"{checkpoint_name(sigma)}.pt"
        torch.save(model.state_dict(), path)
        noisy = GaussianTrainingNoise(sigma)(x, torch.Generator().manual_seed(1))
        with torch.no_grad():
            clean = (model(x).argmax(1) == y).float().mean().item()
            under_noise = (model(noisy).argmax(1) == y).float().mean().item()
        print(f"sigma={sigma}: clean test accuracy {clean:.4f}, under its noise {under_noise:.4f} -> {path}")


if __name__ == "__main__":
    main()
