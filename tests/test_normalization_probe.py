"""normalize= against the model's own normalization (issue 27): a normalization module first in the
model is refused as a double normalization; the probe warns when the model is clearly more
accurate without the given normalization, at any level of accuracy, and stays silent otherwise."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_model_interface import MEAN, STD, images, small_net
from torchvision.transforms import Normalize, v2

from pytest_robust import RobustModelError, RobustWarning, UniformLinf, tsrm
from pytest_robust.engine.inspect.normalization import PROBE_INPUTS


class KorniaLike(torch.nn.Module):
    """A normalization layer of another library: recognised by its name and its mean and std."""

    def __init__(self, mean, std):
        super().__init__()
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def forward(self, x):
        return (x - self.mean) / self.std


KorniaLike.__name__ = "Normalize"


class NormalizesInForward(torch.nn.Module):
    """The normalization registered last but called first: found in execution order."""

    def __init__(self):
        super().__init__()
        self.net = small_net()
        self.norm = Normalize(MEAN, STD)

    def forward(self, x):
        return self.net(self.norm(x))


@pytest.mark.parametrize("model", [
    lambda: torch.nn.Sequential(Normalize(MEAN, STD), small_net()),
    lambda: torch.nn.Sequential(v2.Normalize(MEAN, STD), small_net()),
    lambda: torch.nn.Sequential(KorniaLike(MEAN, STD), small_net()),
    NormalizesInForward,
], ids=["torchvision", "torchvision-v2", "named-normalize", "called-first"])
def test_a_normalization_first_in_the_model_and_normalize_is_a_double_normalization(model):
    with pytest.raises(RobustModelError, match=r"starts with Normalize\(mean=\[0.485, 0.456, 0.406\].*normalized "
                       r"twice. Keep one: drop normalize="):
        tsrm(model().eval(), images(), perturbation=UniformLinf(eps=0.01), budget=64, normalize=(MEAN, STD))
    tsrm(model().eval(), images(), perturbation=UniformLinf(eps=0.01), budget=64)  # one normalization: fine


class Brightness(torch.nn.Module):
    """Class k of 10 for raw inputs of mean brightness in [k/10, (k+1)/10): a model trained on
    raw pixels, which normalized inputs confuse."""

    def forward(self, x):
        b = x.flatten(1).mean(dim=1, keepdim=True)
        centres = (torch.arange(10, dtype=x.dtype) + 0.5) / 10
        return -(b - centres).abs() * 100


def brightness_data(n: int, right: float):
    """``n`` flat images of brightness uniform in [0, 1); the true class for a share ``right`` of
    them, a wrong one for the rest (so the raw-pixel model's accuracy is about ``right``)."""
    gen = torch.Generator().manual_seed(3)
    b = torch.rand(n, generator=gen)
    x = b.view(n, 1, 1, 1).expand(n, 3, 4, 4).contiguous()
    y = (b * 10).long().clamp(max=9)
    wrong = torch.rand(n, generator=gen) >= right
    return x, torch.where(wrong, (y + 1 + torch.randint(0, 9, (n,), generator=gen)) % 10, y)


@pytest.mark.parametrize("right", [1.0, 0.4])
def test_the_probe_warns_when_the_model_is_clearly_better_without_normalize_at_any_level(right):
    data = brightness_data(200, right)
    with pytest.warns(RobustWarning, match=r"without normalize= and on 0\.\d+ with it .*exact McNemar p = .*likely not "
                      r"the model's own normalization"):
        result = tsrm(Brightness(), data, perturbation=UniformLinf(eps=1e-4), budget=200, normalize=(0.5, 0.25))
    probe = result.details["normalization_probe"]
    assert probe["inputs"] == PROBE_INPUTS and probe["evaluations"] == 2 * PROBE_INPUTS
    assert probe["accuracy_without"] > probe["accuracy_with"] and probe["p_value"] <= 1e-3
    assert result.forward_passes == 200  # the probe is outside the budget and the counts


def test_the_probe_is_silent_when_normalize_is_right_or_the_data_cannot_tell():
    x, y = brightness_data(200, 1.0)

    class Normalized(torch.nn.Module):  # trained on (x - 0.5) / 0.25
        def forward(self, z):
            return Brightness()(z * 0.25 + 0.5)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RobustWarning)
        right = tsrm(Normalized(), (x, y), perturbation=UniformLinf(eps=1e-4), budget=100, normalize=(0.5, 0.25))
        assert right.details["normalization_probe"]["accuracy_with"] == 1.0
        # eight inputs: even all right without and all wrong with is only 8 discordant inputs (p = 1/256)
        tsrm(Brightness(), (x[:8], y[:8]), perturbation=UniformLinf(eps=1e-4), budget=16, normalize=(0.5, 0.25))
