"""The CIFAR-10 example (examples/cifar10) without CIFAR-10: it skips cleanly when unconfigured, and
its loading code, model and training script work on a tiny fake dataset in the real file format.

The fake dataset is written exactly like the python version of CIFAR-10: pickled dicts with bytes
keys ``b"data"`` (uint8 rows of 3072 = 3 x 32 x 32 values, channel-major, then row-major) and
``b"labels"``. Its pixel values encode (image, channel, row, column), so a wrong reshape shows.
The weights are a randomly initialised network, so the suite's set-up check (clean accuracy) fails
on them, as it should: what is tested is that data and weights load and the model runs on them.
No robustness check runs here; the plugin's own tests cover those, and a ResNet-18 check on two
CPU cores would cost far more than the few seconds this file may take.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision  # noqa: F401  (imported once, before any pytester run: see tests/conftest.py)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cifar10"
VARIABLES = ("ROBUST_CIFAR10_DIR", "ROBUST_CIFAR10_WEIGHTS", "ROBUST_CIFAR10_SMOOTHING_WEIGHTS")
N_TEST = 20
N_TRAIN_PER_BATCH = 1


def pixel_values(n: int, offset: int) -> np.ndarray:
    """uint8 images (n, 3, 32, 32) whose value encodes image, channel, row and column."""
    i, c, r, w = np.meshgrid(np.arange(n) + offset, np.arange(3), np.arange(32), np.arange(32), indexing="ij")
    return ((37 * i + 101 * c + 7 * r + w) % 256).astype(np.uint8)


def write_batch(path: Path, n: int, offset: int) -> None:
    images = pixel_values(n, offset)
    batch = {
        b"batch_label": path.name.encode(),
        b"labels": [(offset + k) % 10 for k in range(n)],
        b"data": images.reshape(n, 3 * 32 * 32),
        b"filenames": [f"fake_{offset + k}.png".encode() for k in range(n)],
    }
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


@pytest.fixture(scope="module")
def example():
    """The example's modules (model and data; training script), imported from examples/cifar10."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        import cifar10_resnet
        import train_resnet18
    finally:
        sys.path.remove(str(EXAMPLE))
    return cifar10_resnet, train_resnet18


@pytest.fixture(scope="module")
def fake_cifar(tmp_path_factory) -> Path:
    """A folder holding cifar-10-batches-py: a 20-image test batch and five 1-image training batches."""
    root = tmp_path_factory.mktemp("cifar")
    batches = root / "cifar-10-batches-py"
    batches.mkdir()
    write_batch(batches / "test_batch", N_TEST, offset=0)
    for k in range(1, 6):
        write_batch(batches / f"data_batch_{k}", N_TRAIN_PER_BATCH, offset=100 * k)
    return root


@pytest.fixture(scope="module")
def random_weights(example, tmp_path_factory) -> Path:
    cifar10_resnet, _ = example
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "resnet18_random.pt"
    torch.save(cifar10_resnet.resnet18_cifar().state_dict(), path)
    return path


@pytest.fixture
def run_suite(pytester, monkeypatch):
    """Run pytest on examples/cifar10 (in process) with only the given variables of the example set."""

    def run(*args: str, **variables):
        for name in VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in variables.items():
            monkeypatch.setenv(name, str(value))
        return pytester.runpytest(str(EXAMPLE), "-p", "no:cacheprovider", "-rs", "--robust-device", "cpu", *args)

    return run


def test_suite_skips_with_the_reason_when_unconfigured(run_suite):
    """Every test skips, naming the variables; collection (and so every robust marker) is fine."""
    result = run_suite()
    result.assert_outcomes(skipped=8)
    result.stdout.fnmatch_lines(["*ROBUST_CIFAR10_DIR and ROBUST_CIFAR10_WEIGHTS are not set*README.md*"])


def test_suite_loads_the_data_and_weights(run_suite, fake_cifar, random_weights):
    """The set-up check runs the model on the 20 fake images (and fails: the weights are random);
    the smoothing test skips, naming its own variable."""
    result = run_suite(
        "-k", "clean_accuracy or certified_accuracy",
        ROBUST_CIFAR10_DIR=fake_cifar, ROBUST_CIFAR10_WEIGHTS=random_weights,
    )
    result.assert_outcomes(failed=1, skipped=1, deselected=6)
    result.stdout.fnmatch_lines([
        "*clean test accuracy 0.* on 20 images < 0.9*",
        "*ROBUST_CIFAR10_SMOOTHING_WEIGHTS is not set*",
    ])


def test_suite_fails_when_a_variable_points_nowhere(run_suite, tmp_path, random_weights):
    """A runner configured to gate must not pass by skipping: a wrong path is an error."""
    result = run_suite(
        "-k", "clean_accuracy", ROBUST_CIFAR10_DIR=tmp_path / "missing", ROBUST_CIFAR10_WEIGHTS=random_weights
    )
    result.assert_outcomes(errors=1, deselected=7)
    result.stdout.fnmatch_lines(["*no CIFAR-10 test batch under*missing*"])


def test_loader_reads_the_pickle_batches(example, fake_cifar):
    cifar10_resnet, _ = example
    x, y = cifar10_resnet.load_split(fake_cifar, "test")
    assert x.shape == (N_TEST, 3, 32, 32) and x.dtype == torch.float32
    assert y.tolist() == [k % 10 for k in range(N_TEST)] and y.dtype == torch.int64
    assert torch.equal(x, torch.from_numpy(pixel_values(N_TEST, 0)).float() / 255)
    # the cifar-10-batches-py folder itself is accepted as well as the folder holding it
    x_inner, _ = cifar10_resnet.load_split(fake_cifar / "cifar-10-batches-py", "test")
    assert torch.equal(x, x_inner)
    x_train, y_train = cifar10_resnet.load_split(fake_cifar, "train")
    assert x_train.shape == (5 * N_TRAIN_PER_BATCH, 3, 32, 32) and len(y_train) == 5 * N_TRAIN_PER_BATCH


def test_loader_names_the_expected_file_when_data_is_missing(example, tmp_path):
    cifar10_resnet, _ = example
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py/test_batch"):
        cifar10_resnet.load_split(tmp_path, "test")


def test_model_is_the_cifar_resnet18_with_normalization_inside(example, random_weights):
    cifar10_resnet, _ = example
    model = cifar10_resnet.load_model(random_weights)
    assert not model.training
    assert model.net.conv1.kernel_size == (3, 3) and model.net.conv1.stride == (1, 1)
    assert isinstance(model.net.maxpool, torch.nn.Identity)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits = model(x)
        expected = model.net((x - model.mean) / model.std)
    assert logits.shape == (2, 10)
    torch.testing.assert_close(logits, expected)


def test_model_rejects_a_stock_resnet18_state_dict(example, tmp_path):
    cifar10_resnet, _ = example
    from torchvision.models import resnet18

    path = tmp_path / "imagenet_style.pt"
    torch.save(resnet18(num_classes=10).state_dict(), path)  # 7x7 conv1: not the CIFAR variant
    with pytest.raises(RuntimeError, match="3x3 stride-1 conv1"):
        cifar10_resnet.load_model(path)


def test_training_script_writes_weights_the_suite_loads(example, fake_cifar, tmp_path, capsys):
    cifar10_resnet, train_resnet18 = example
    out = tmp_path / "trained.pt"
    train_resnet18.main([
        "--data", str(fake_cifar), "--out", str(out), "--epochs", "1", "--batch-size", "5",
        "--noise-sigma", "0.25", "--device", "cpu",
    ])
    assert "epoch 1/1" in capsys.readouterr().out
    model = cifar10_resnet.load_model(out)
    with torch.no_grad():
        assert model(torch.rand(1, 3, 32, 32)).shape == (1, 10)
