"""Small models and data sets with known behaviour, shared by the unit tests.

Nothing here is a pytest fixture; everything is deterministic given its arguments.

The central construction is the "threshold" family: every input is the constant 0.5 in one
dimension, ``UniformLinf(eps=0.5)`` on the box [0, 1] turns it into x' ~ U[0, 1] (exactly
``torch.rand``'s value, since the interval is [0, 1]), and ``ThresholdModel(t)`` predicts the
label 1 iff x' < t.  Hence TSRM = P(U < t) = t; for a dyadic t such as 0.875 this holds exactly
even for float32 uniforms (which are multiples of 2**-24).
"""

from __future__ import annotations

import torch

from pytest_robust.perturbations import UniformLinf

#: x = 0.5 on [0, 1] with this radius gives x' ~ U[0, 1].
FULL_BOX = UniformLinf(eps=0.5)


def bare_run(metric: str, model, data, declaration=None, **kwargs):
    """A ``Run`` of ``metric`` built by hand, as ``library.evaluate`` builds one: with ``declaration``
    (default: a check with no parameters) and the default context."""
    from pytest_robust.checks.registry import Metric
    from pytest_robust.engine.context import RunContext
    from pytest_robust.engine.run import Run

    return Run(metric, model, data, declaration=declaration or Metric(lambda run: None), context=RunContext(),
               **kwargs)


def threshold_data(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """n copies of the input 0.5 (shape (n, 1)), all labelled 1."""
    return torch.full((n, 1), 0.5), torch.ones(n, dtype=torch.long)


class ThresholdModel(torch.nn.Module):
    """Two classes on 1-D inputs: logits (x - t, t - x), so class 1 wins iff x < t.

    Has one (zero) parameter so that the engine can see which device the model lives on.
    """

    def __init__(self, t: float):
        super().__init__()
        self.t = float(t)
        self.bias = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        v = x[:, 0]
        return torch.stack([v - self.t, self.t - v], dim=1) + self.bias


def mixed_data(n_half: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """2-D inputs: column 0 is 0.5 everywhere, column 1 a flag (first half 1.0, second half 0.0).

    Under ``FULL_BOX`` the flag becomes U[0.5, 1] (flag 1) or U[0, 0.5] (flag 0), so the model
    can still tell the halves apart after perturbation. All labels are 1.
    """
    flag = torch.cat([torch.ones(n_half), torch.zeros(n_half)])
    x = torch.stack([torch.full((2 * n_half,), 0.5), flag], dim=1)
    return x, torch.ones(2 * n_half, dtype=torch.long)


class MixedModel(torch.nn.Module):
    """On ``mixed_data``: always right on flagged inputs, right w.p. q on the others.

    TSRM under ``FULL_BOX`` is therefore (1 + q) / 2.
    """

    def __init__(self, q: float):
        super().__init__()
        self.q = float(q)
        self.bias = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        v, flag = x[:, 0], x[:, 1]
        margin = torch.where(flag >= 0.5, torch.ones_like(v), self.q - v)
        return torch.stack([-margin, margin], dim=1) + self.bias


class ConstantLogits(torch.nn.Module):
    """Returns the same logit for every class: every prediction is a tie, hence wrong."""

    def __init__(self, n_classes: int = 3, value: float = 0.25):
        super().__init__()
        self.n_classes = n_classes
        self.value = torch.nn.Parameter(torch.tensor(float(value)))

    def forward(self, x):
        return self.value.expand(len(x), self.n_classes).clone()


def image_data(n: int = 40, channels: int = 3, size: int = 4, n_classes: int = 3, seed: int = 0):
    """Random images in [0, 1] of shape (n, C, size, size) and labels in [0, n_classes)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, channels, size, size, generator=g)
    y = torch.randint(n_classes, (n,), generator=g)
    return x, y


class SmallNet(torch.nn.Module):
    """A small seeded classifier with dropout and batch norm (so train/eval mode matters).

    Its weights are random, so on ``image_data`` its accuracy is somewhere strictly between 0 and 1.
    """

    def __init__(self, channels: int = 3, size: int = 4, n_classes: int = 3, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        d = channels * size * size
        self.flatten = torch.nn.Flatten()
        self.norm = torch.nn.BatchNorm1d(d)
        self.drop = torch.nn.Dropout(0.5)
        self.fc = torch.nn.Linear(d, n_classes)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(n_classes, d, generator=g) / d**0.5)
            self.fc.bias.zero_()
            self.norm.running_mean.fill_(0.5)
            self.norm.running_var.fill_(1.0 / 12.0)

    def forward(self, x):
        return self.fc(self.drop(self.norm(self.flatten(x))))


class GlobalRngModel(ThresholdModel):
    """A ThresholdModel that also consumes the global torch RNG on every forward pass."""

    def forward(self, x):
        noise = torch.rand(len(x), 2)  # global RNG on purpose
        return super().forward(x) + 0.0 * noise


class BufferMutatingModel(ThresholdModel):
    """Counts its forward passes in a buffer, in place: forbidden during a check."""

    def __init__(self, t: float = 0.5):
        super().__init__(t)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


class ParamMutatingModel(ThresholdModel):
    """Changes its parameter in place (under no_grad) during forward."""

    def forward(self, x):
        with torch.no_grad():
            self.bias.add_(1e-3)
        return super().forward(x)


class DataAttrMutatingModel(ThresholdModel):
    """Changes its parameter in place through ``.data`` (bypasses autograd's version counter)."""

    def forward(self, x):
        self.bias.data.add_(1e-3)
        return super().forward(x)


class RecordingModel(torch.nn.Module):
    """Wraps a model; records every row it evaluates successfully, and the batch sizes it saw.

    With ``oom_above=k`` a forward pass on more than k rows raises ``torch.OutOfMemoryError``
    (as CUDA does) before recording anything.
    """

    def __init__(self, inner: torch.nn.Module, oom_above: int | None = None):
        super().__init__()
        self.inner = inner
        self.oom_above = oom_above
        self.rows: list[torch.Tensor] = []
        self.batch_sizes: list[int] = []
        self.oom_raised = 0

    def forward(self, x):
        if self.oom_above is not None and len(x) > self.oom_above:
            self.oom_raised += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {len(x)} rows (simulated)"
            )
        out = self.inner(x)
        self.rows.append(x.detach().clone())
        self.batch_sizes.append(len(x))
        return out

    def seen(self, result=None) -> torch.Tensor:
        """Every row evaluated; given the check's ``result``, without the label probe's rows (the
        last ones: it runs at the end, outside the budget and the counts)."""
        rows = torch.cat(self.rows) if self.rows else torch.empty(0)
        return rows[:len(rows) - probe_evaluations(result)] if result is not None else rows


def probe_evaluations(result) -> int:
    """The model evaluations of the label probe (``engine.inspect.labels``) beside a check's counts."""
    return result.details.get("label_probe", {}).get("evaluations", 0)


class BadLogitsModel(torch.nn.Module):
    """Returns malformed output of a chosen ``kind`` (see ``forward``)."""

    def __init__(self, kind: str, n_classes: int = 2):
        super().__init__()
        self.kind = kind
        self.n_classes = n_classes
        self.bias = torch.nn.Parameter(torch.zeros(n_classes))

    def forward(self, x):
        n = len(x)
        good = torch.zeros(n, self.n_classes) + self.bias
        if self.kind == "nan":
            good[0, 0] = float("nan")
            return good
        if self.kind == "inf":
            good[-1, 1] = float("inf")
            return good
        if self.kind == "neg_inf":
            good[0, 0] = float("-inf")
            return good
        if self.kind == "1d":
            return good[:, 0]
        if self.kind == "wrong_batch":
            return torch.zeros(n + 1, self.n_classes)
        if self.kind == "one_class":
            return torch.zeros(n, 1)
        if self.kind == "3d":
            return torch.zeros(n, self.n_classes, 1)
        if self.kind == "tuple":
            return (good,)
        if self.kind == "numpy":
            return good.numpy()
        raise AssertionError(self.kind)


class ClassCountChangingModel(torch.nn.Module):
    """2 classes on batches of even length, 3 classes on odd-length batches."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.zeros(len(x), 2 + len(x) % 2) + self.bias


def small_net_conftest(n: int) -> str:
    """A conftest whose robust_model is the toy SmallNet and robust_data n toy images."""
    return f"""
import pytest
from toy_models import SmallNet, image_data

@pytest.fixture
def robust_model():
    return SmallNet().eval()

@pytest.fixture
def robust_data():
    return image_data(n={n})
"""
