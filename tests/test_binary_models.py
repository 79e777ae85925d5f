"""Models as people have them (issue 27): one-logit binary classifiers read as two classes, a
forward that needs keywords, data_keys= in the library functions, multi-hot labels refused."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from test_model_interface import SIX, images, numbers, small_net

from pytest_robust import RobustDataError, RobustModelError, RobustWarning, UniformLinf, tsrm


class OneLogit(torch.nn.Module):
    """A BCEWithLogits-shaped binary classifier: one logit per input, (batch,) or (batch, 1);
    ``explicit`` returns the two-logit [0, z] model instead; ``sigmoid`` returns probabilities."""

    def __init__(self, shape: str = "flat", sigmoid: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                       torch.nn.Linear(4 * 6 * 6, 1))
        self.shape, self.sigmoid = shape, sigmoid

    def forward(self, x):
        z = self.net(x)  # (batch, 1)
        if self.sigmoid:
            z = torch.sigmoid(z)
        if self.shape == "explicit":
            return torch.cat([torch.zeros_like(z), z], dim=1)
        return z.squeeze(1) if self.shape == "flat" else z


def binary_images(n: int = 16):
    x, _ = images(n)
    return x, torch.arange(n) % 2


@pytest.mark.parametrize("shape", ["flat", "column"])
@pytest.mark.parametrize("check", list(SIX))
def test_one_logit_gives_the_numbers_of_the_explicit_two_logit_model(check, shape):
    data = binary_images()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RobustWarning)  # the untrained model is constant: the label check says so
        warnings.filterwarnings("error", message=".*(sigmoid|probabilit)", category=RobustWarning)  # logits: none
        one = SIX[check](OneLogit(shape).eval(), data)
    two = SIX[check](OneLogit("explicit").eval(), data)
    assert numbers(one) == numbers(two)


def test_one_logit_predicts_class_one_iff_the_logit_is_positive():
    model = OneLogit("flat").eval()
    x, _ = binary_images(32)
    y = (model(x) > 0).long()
    assert tsrm(model, (x, y), perturbation=UniformLinf(eps=1e-6), budget=300).estimate == 1.0
    assert tsrm(model, (x, 1 - y), perturbation=UniformLinf(eps=1e-6), budget=300).estimate == 0.0


def test_sigmoid_probabilities_warn_like_softmax_outputs():
    with pytest.warns(RobustWarning, match="look like sigmoid probabilities"):
        tsrm(OneLogit("flat", sigmoid=True).eval(), binary_images(), perturbation=UniformLinf(eps=0.01), budget=100)


@pytest.mark.parametrize("labels, fix", [
    (torch.tensor([[1, 0, 1], [0, 1, 1]] * 8), "multi-label classification is not supported"),
    (torch.eye(3, dtype=torch.long)[torch.arange(16) % 3], r"y.argmax\(dim=1\)"),
    (torch.ones(16, 1).long(), r"y.view\(-1\)"),
    ((torch.arange(16) % 2).float(), r"y.long\(\)"),
])
def test_label_shapes_of_other_losses_are_named_with_their_fix(labels, fix):
    x, _ = images(16)
    with pytest.raises(RobustDataError, match=fix):
        tsrm(OneLogit().eval(), (x, labels), perturbation=UniformLinf(eps=0.01), budget=100)


class NeedsMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3 * 8 * 8, 5)

    def forward(self, x, attention_mask, *, scale):
        return self.fc(x.flatten(1)) * scale


def test_a_forward_that_needs_keywords_names_them_and_the_one_line_fix():
    with pytest.raises(RobustModelError, match=r"needs 'attention_mask', 'scale' besides the input.*"
                       r"functools.partial\(model.forward, attention_mask=..., scale=...\)"):
        tsrm(NeedsMask(), images(), perturbation=UniformLinf(eps=0.01), budget=100)
    model = NeedsMask()
    model.forward = functools.partial(model.forward, attention_mask=None, scale=1.0)  # the fix, as shown
    assert tsrm(model, images(), perturbation=UniformLinf(eps=0.01), budget=100).forward_passes == 100


class Mapped(torch.utils.data.Dataset):
    def __init__(self, keys):
        self.x, self.y = images(16)
        self.keys = keys

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {self.keys[0]: self.x[i], self.keys[1]: self.y[i]}


def test_library_functions_take_data_keys_like_the_marker():
    plain = tsrm(small_net(), images(), perturbation=UniformLinf(eps=0.01), budget=64)
    keyed = tsrm(small_net(), Mapped(("img", "klass")), perturbation=UniformLinf(eps=0.01), budget=64,
                 data_keys=("img", "klass"))
    assert (keyed.estimate, keyed.lower) == (plain.estimate, plain.lower)
    text = tsrm(small_net(), Mapped(("img", "klass")), perturbation=UniformLinf(eps=0.01), budget=64,
                data_keys="img,klass")  # the text form of ini and the command line
    assert text.estimate == plain.estimate
    with pytest.raises(RobustDataError, match=r"without 'img', 'klass' named by data_keys=\('img', 'klass'\)"):
        tsrm(small_net(), Mapped(("a", "b")), perturbation=UniformLinf(eps=0.01), budget=64, data_keys="img,klass")
