"""CIFAR-10 from the standard python-pickle batches, and a torchvision ResNet-18 adapted to 32x32.

Data. ``load_split(root, "test")`` reads ``cifar-10-batches-py/test_batch`` (the archive
``cifar-10-python.tar.gz`` unpacked; ``root`` may be the folder that holds
``cifar-10-batches-py`` or that folder itself) with pickle and numpy: nothing is downloaded, ever.
Images come back as float32 tensors of shape (n, 3, 32, 32) in [0, 1] pixel units, labels as int64.

Model. ``CifarResNet18`` = per-channel normalization followed by ``torchvision.models.resnet18
(num_classes=10)`` with the usual CIFAR adaptation: ``conv1`` is a 3x3 convolution with stride 1
(64 channels, no bias) and ``maxpool`` is removed (``nn.Identity``), so the 32x32 input is not
shrunk to 8x8 before the first residual stage. Because the normalization is the model's first layer,
the model takes [0, 1] pixels and every eps, sigma and radius of the suite is in pixel units
(eps = 8/255 is 8 grey levels). A weights file is the ``state_dict`` of the inner ResNet alone
(torchvision's key names: ``conv1.weight``, ``bn1.*``, ``layer1.0.conv1.weight``, ..., ``fc.bias``),
trained on inputs normalized with ``CIFAR10_MEAN`` and ``CIFAR10_STD``; ``train_resnet18.py``
writes exactly that.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchvision.models import resnet18

BATCHES_DIR = "cifar-10-batches-py"
SPLITS = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
#: Per-channel mean and standard deviation of the CIFAR-10 training images in [0, 1] pixel units.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def batches_dir(root: str | Path) -> Path:
    """The ``cifar-10-batches-py`` folder under ``root`` (or ``root`` itself if it is that folder)."""
    root = Path(root).expanduser()
    for candidate in (root / BATCHES_DIR, root):
        if (candidate / "test_batch").is_file():
            return candidate
    raise FileNotFoundError(
        f"no CIFAR-10 test batch under {root}: expected {root / BATCHES_DIR / 'test_batch'} (the python "
        f"version of CIFAR-10, cifar-10-python.tar.gz, unpacked) or {root / 'test_batch'}"
    )


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch: (images uint8 (n, 3, 32, 32), labels int64 (n,))."""
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if len(images) != len(labels):
        raise ValueError(f"{path}: {len(images)} images but {len(labels)} labels")
    return images, labels


def load_split(root: str | Path, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): x float32 (n, 3, 32, 32) in [0, 1], y int64 in 0..9, in the files' order."""
    folder = batches_dir(root)
    parts = [read_batch(folder / name) for name in SPLITS[split]]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return torch.from_numpy(images).float().div_(255), torch.from_numpy(labels)


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """torchvision's ResNet-18 with a 3x3 stride-1 first convolution and no max-pool (for 32x32)."""
    net = resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


class CifarResNet18(nn.Module):
    """Normalization, then ``resnet18_cifar``: takes [0, 1] pixels, returns 10 logits."""

    def __init__(self, net: nn.Module | None = None) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(CIFAR10_STD).view(1, 3, 1, 1))
        self.net = net if net is not None else resnet18_cifar()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std)


def load_model(weights: str | Path) -> CifarResNet18:
    """The model with the inner ResNet's ``state_dict`` read from ``weights``, in eval mode."""
    weights = Path(weights).expanduser()
    if not weights.is_file():
        raise FileNotFoundError(f"no weights file at {weights}")
    state = torch.load(weights, map_location="cpu", weights_only=True)
    net = resnet18_cifar()
    try:
        net.load_state_dict(state)
    except RuntimeError as err:
        raise RuntimeError(
            f"{weights} is not a state_dict of torchvision.models.resnet18(num_classes=10) with a 3x3 "
            f"stride-1 conv1 and no max-pool (see examples/cifar10/README.md): {err}"
        ) from None
    return CifarResNet18(net).eval()
