"""Render one photograph under every corruption at severity 3 into docs/corruptions.png.

    python docs/render_corruptions.py [--severity 3] [--out docs/corruptions.png]

The photograph is scikit-learn's ``china.jpg`` (shipped with scikit-learn; nothing is
downloaded), a square crop resized to 224 x 224 px, so the ImageNet-C tables apply. Each tile is
``Corruption(name, severity)`` with a generator seeded 0. Needs matplotlib.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pytest_robust import Corruption, corruption_names


def photograph(side: int = 224) -> torch.Tensor:
    from sklearn.datasets import load_sample_images

    image = torch.from_numpy(np.array(load_sample_images().images[0])).permute(2, 0, 1).float() / 255
    h, w = image.shape[1:]
    crop = image[:, :, (w - h) // 2:(w - h) // 2 + h]
    return F.interpolate(crop[None], size=(side, side), mode="area").clamp(0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--severity", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("corruptions.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = photograph()
    tiles = [("original", x)] + [
        (name, Corruption(name, args.severity)(x, torch.Generator().manual_seed(0))) for name in corruption_names()
    ]
    columns = 5
    rows = -(-len(tiles) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.2 * columns, 2.35 * rows), dpi=80)
    for ax, (name, image) in zip(axes.flat, tiles):
        ax.imshow(image[0].permute(1, 2, 0).numpy())
        ax.set_title(name, fontsize=9)
    for ax in axes.flat:
        ax.axis("off")
    fig.suptitle(f"pytest_robust.Corruption(name, severity={args.severity}), ImageNet-C tables, 224 px", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
