"""normalize=(mean, std) and logits=: the model interface (pytest_robust/engine/interface.py).

The central promise: a check with normalize= gives exactly the numbers of the same check on an
explicit torch.nn.Sequential(torchvision Normalize, model), bit for bit, for all six checks, while
every size stays in pixel units.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torchvision.transforms import Compose, Normalize

from pytest_robust import (
    RobustDataError,
    RobustModelError,
    RobustWarning,
    SettingError,
    UniformLinf,
    adversarial_accuracy,
    certified_accuracy,
    corruption_accuracy,
    intermediate_q,
    model_interface,
    nppr,
    tsrm,
)
from pytest_robust.settings.interface_values import logits_selector, normalization

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def small_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 5)).eval()


def images(n: int = 16):
    gen = torch.Generator().manual_seed(1)
    return torch.rand(n, 3, 8, 8, generator=gen), torch.randint(0, 5, (n,), generator=gen)


#: Each of the six checks at a small budget; ``run(model, data, **interface)`` returns its Result.
SIX = {
    "tsrm": lambda m, d, **k: tsrm(m, d, perturbation=UniformLinf(eps=8 / 255), budget=512, **k),
    "corruption_accuracy": lambda m, d, **k: corruption_accuracy(
        m, d, corruptions=["gaussian_noise", "contrast"], severities=[1, 3], budget=300, **k),
    "q": lambda m, d, **k: intermediate_q(m, d, perturbation=UniformLinf(eps=8 / 255), q=10, inputs=4, chains=4,
                                          steps=4, warmup=2, leapfrog=2, pgd_steps=2, **k),
    "certified_accuracy": lambda m, d, **k: certified_accuracy(m, d, threshold=None, radius=0.1, sigma=0.25, alpha=0.01,
                                                               max_draws=64, budget=1024, **k),
    "nppr": lambda m, d, **k: nppr(m, d, eps=8 / 255, latent_dim=4, components=2, fit_steps=2, fit_batch_size=4,
                                   fit_draws=2, draws_per_input=4, budget=800, **k),
    "adversarial_accuracy": lambda m, d, **k: adversarial_accuracy(m, d, eps=8 / 255, steps=3, targets=1,
                                                                   square_queries=20, **k),
}
#: Details that differ between two runs of the same numbers: wall time, how the model was given,
#: the feature layer's name (the explicit wrapper prefixes it with "1.") and the normalization probe
#: run with normalize= (outside the budget: inspect.normalization).
NOT_NUMBERS = ("fit", "model_interface", "space", "warnings", "feature_layer", "normalization_probe")


def numbers(result) -> dict:
    out = {k: getattr(result, k) for k in ("estimate", "lower", "upper", "verdict", "draws", "forward_passes")}
    out["details"] = {k: v for k, v in result.details.items() if k not in NOT_NUMBERS}
    return out


@pytest.mark.parametrize("check", list(SIX))
def test_normalize_gives_the_numbers_of_an_explicit_sequential_bit_for_bit(check):
    net, data = small_net(), images()
    inside = SIX[check](net, data, normalize=(MEAN, STD))
    explicit = SIX[check](torch.nn.Sequential(Normalize(MEAN, STD), net).eval(), data)
    assert numbers(inside) == numbers(explicit)
    assert inside.details["space"].startswith("pixel units, normalized inside the model")
    assert "in pixel units, normalized inside the model (mean 0.485, 0.456, 0.406; std 0.229, 0.224, 0.225)" \
        in inside.message()
    assert explicit.details["space"] == "" and "normalized" not in explicit.message()


def test_the_context_manager_and_the_imagenet_preset_mean_the_same():
    net, data = small_net(), images()
    with model_interface(normalize="imagenet"):
        a = tsrm(net, data, perturbation=UniformLinf(eps=0.05), budget=256)
    b = tsrm(net, data, perturbation=UniformLinf(eps=0.05), budget=256, normalize=[list(MEAN), list(STD)])
    assert a.estimate == b.estimate and a.details["model_interface"] == b.details["model_interface"]


@pytest.mark.parametrize("raw, expected", [
    ("imagenet", (MEAN, STD)),
    ((0.5, 0.25), ((0.5,), (0.25,))),
    ("(0.5, 0.25)", ((0.5,), (0.25,))),
    ("[[0.1, 0.2, 0.3], [0.5, 0.5, 0.5]]", ((0.1, 0.2, 0.3), (0.5, 0.5, 0.5))),
    ({"mean": [0.5], "std": 0.2}, ((0.5,), (0.2,))),
    ((torch.tensor([0.5, 0.4]), torch.tensor([0.2, 0.3])), ((0.5, 0.4), (0.2, 0.3))),
    ("none", None),
    (False, None),
])
def test_normalize_accepts_pairs_text_presets_and_none(raw, expected):
    got = normalization("normalize", raw)
    assert got == (None if expected is None else tuple(tuple(pytest.approx(v) for v in p) for p in expected))


@pytest.mark.parametrize("raw", [(0.5, 0.0), (0.5,), "imagenette", ((0.1, 0.2), (0.1, 0.2, 0.3)), (0.5, "a"),
                                 {"mean": 0.5}])
def test_bad_normalize_names_the_key_and_the_accepted_forms(raw):
    with pytest.raises(SettingError, match=r"normalize=.* is invalid: expected \(mean, std\)"):
        normalization("normalize", raw)


def test_logits_selector_from_text_is_an_index_or_a_key():
    assert logits_selector("logits", "0") == 0 and logits_selector("logits", "-1") == -1
    assert logits_selector("logits", "scores") == "scores" and logits_selector("logits", None) is None
    with pytest.raises(SettingError, match="an index"):
        logits_selector("logits", 1.5)


def test_per_channel_normalize_must_match_the_channels():
    with pytest.raises(SettingError, match=r"one mean and one std per channel of the inputs \(3"):
        tsrm(small_net(), images(), perturbation=UniformLinf(eps=0.05), budget=256, normalize=((0.5, 0.5), (0.2, 0.2)))


# -- a Normalize in the data pipeline -------------------------------------------------------------


class Images(torch.utils.data.Dataset):
    """A dataset that applies ``transform`` to each image, as torchvision's datasets do."""

    def __init__(self, transform=None):
        self.x, self.y = images()
        self.transform = transform

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i]
        return (self.transform(x) if self.transform else x), self.y[i]


def normalizing_loader():
    data = Images(Compose([Normalize(MEAN, STD)]))
    return torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(12)), batch_size=4)


def test_normalize_in_the_data_pipeline_is_named_with_the_fix():
    with pytest.raises(RobustDataError) as err:
        tsrm(small_net(), normalizing_loader(), perturbation=UniformLinf(eps=0.05), budget=256)
    text = str(err.value)
    assert "transform pipeline contains Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])" in text
    assert "drop it from the data" in text and "normalize=((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))" in text


def test_normalize_in_the_data_and_on_the_check_is_refused_as_twice():
    with pytest.raises(RobustDataError, match="normalized twice"):
        tsrm(small_net(), normalizing_loader(), perturbation=UniformLinf(eps=0.05), budget=256, normalize="imagenet")


def test_randomized_smoothing_on_normalizing_data_is_refused():
    with pytest.raises(RobustDataError, match="Normalize"):
        certified_accuracy(small_net(), Images(Normalize(MEAN, STD)), threshold=None, radius=0.1, sigma=0.25,
                           max_draws=64, budget=2048)


def test_normalize_in_the_data_with_a_box_of_its_own_warns():
    box = (-3.0, 3.0)  # the user chose normalized units
    with pytest.warns(RobustWarning, match="taken to be in normalized units"):
        tsrm(small_net(), Images(Normalize(MEAN, STD)), perturbation=UniformLinf(eps=0.05, bounds=box), budget=256)


def test_normalized_tensors_with_normalize_are_told_to_give_pixels():
    x, y = images()
    with pytest.raises(RobustDataError, match="normalize= is set, so the check normalizes inside the model call"):
        tsrm(small_net(), ((x - 0.45) / 0.225, y), perturbation=UniformLinf(eps=0.05), budget=256, normalize="imagenet")


def test_data_without_normalize_is_not_warned_about():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RobustWarning)
        tsrm(small_net(), Images(), perturbation=UniformLinf(eps=0.05), budget=256)


# -- model outputs --------------------------------------------------------------------------------


class Outputs(torch.nn.Module):
    """The small net's logits wrapped as ``kind``: a tuple (logits, features), a dict, or a dict
    under another key."""

    def __init__(self, kind: str):
        super().__init__()
        self.net, self.kind = small_net(), kind

    def forward(self, x):
        z = self.net(x)
        return {"tuple": (z, x.flatten(1)), "dict": {"logits": z, "x": x}, "scores": {"scores": z}}[self.kind]


def test_a_tuple_is_refused_with_the_element_that_looks_like_logits():
    with pytest.raises(RobustModelError) as err:
        tsrm(Outputs("tuple"), images(), perturbation=UniformLinf(eps=0.05), budget=256)
    text = str(err.value)
    assert "it returned a tuple of 2 elements: element 0 (a tensor of shape (256, 5)) looks like the logits" in text
    assert "logits=0" in text and "callable" in text


@pytest.mark.parametrize("kind, selector", [("tuple", 0), ("tuple", lambda out: out[0]), ("dict", None),
                                            ("scores", "scores")])
def test_selected_or_found_logits_give_the_plain_models_numbers_with_gradients(kind, selector):
    plain = SIX["q"](small_net(), images())  # q runs HMC and PGD: gradients through the selection
    chosen = SIX["q"](Outputs(kind), images(), logits=selector)
    assert numbers(plain)["estimate"] == numbers(chosen)["estimate"]
    assert numbers(plain)["details"]["per_input"] == numbers(chosen)["details"]["per_input"]


def test_a_mapping_without_logits_names_its_keys_and_the_fix():
    with pytest.raises(RobustModelError, match=r"key 'scores' looks like the logits: choose it with logits='scores'"):
        tsrm(Outputs("scores"), images(), perturbation=UniformLinf(eps=0.05), budget=256)


def test_a_selector_that_selects_nothing_says_what_the_output_has():
    with pytest.raises(RobustModelError, match=r"logits=5 does not select anything .*a tuple of 2 elements"):
        tsrm(Outputs("tuple"), images(), perturbation=UniformLinf(eps=0.05), budget=256, logits=5)


# -- through pytest ---------------------------------------------------------------------------------

CONFTEST = """
import pytest, torch
from test_model_interface import Outputs, images, small_net

@pytest.fixture
def robust_model():
    return small_net()

@pytest.fixture
def tuple_model():
    return Outputs("tuple")

@pytest.fixture
def robust_data():
    return images()
"""

TESTS = """
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.01, perturbation=UniformLinf(eps=8/255), budget=256)
def test_session_normalize():
    pass

@pytest.mark.robust(tsrm=0.01, perturbation=UniformLinf(eps=8/255), budget=256, normalize="none", model="tuple_model")
def test_marker_overrides():
    pass
"""


def test_settings_reach_markers_and_messages(pytester, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_x=TESTS)
    result = pytester.runpytest("--robust-normalize", "imagenet", "--robust-logits", "0", "--robust-report", "rep")
    result.assert_outcomes(passed=2)
    import json

    results = json.loads((pytester.path / "rep" / "results.json").read_text())["results"]
    assert results[0]["details"]["model_interface"] == {"normalize": [list(MEAN), list(STD)], "logits": 0,
                                                         "embedding": None}
    assert results[1]["details"]["model_interface"] == {"normalize": None, "logits": 0, "embedding": None}
    assert "normalized inside the model" in (pytester.path / "rep" / "summary.md").read_text()


def test_normalize_from_yaml_and_ini(pytester, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_x=TESTS.split("@pytest.mark.robust(tsrm=0.01, perturbation=UniformLinf(eps=8/255), "
                                           "budget=256, normalize")[0])
    pytester.makefile(".yaml", robust="normalize: [[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]]\n")
    pytester.makeini("[pytest]\nrobust_normalize = imagenet\n")
    from_yaml = pytester.runpytest("--robust-config", "robust.yaml").stdout.str()
    assert "normalize=(mean [0.5, 0.5, 0.5], std [0.25, 0.25, 0.25]) inside the model" in from_yaml
    assert "normalize=(mean [0.485, 0.456, 0.406]" in pytester.runpytest().stdout.str()


def test_a_bad_normalize_on_the_command_line_is_a_usage_error(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--robust-normalize", "(0.5, -1)")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*normalize (command line --robust-normalize)=*is invalid: expected (mean, std)*"])
