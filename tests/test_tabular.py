"""Inputs that are not images: the box has one meaning everywhere (``bounds=None`` is no box, in
every check and door; either end may be infinite; per-feature bounds broadcast by numpy's rule),
and messages name the box whenever it is not (0, 1). On scikit-learn's bundled breast-cancer data
(30 features, standardized) with a small MLP trained in well under a second (seeded)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import pytest_robust as pr
from pytest_robust.engine.inspect.perturbation import box_for

pytestmark = pytest.mark.filterwarnings("ignore::pytest_robust.errors.RobustWarning")


def standardized_cancer(n: int = 200):
    """(x, y, model): the first ``n`` breast-cancer rows, standardized (mean 0, std 1 per feature,
    so they leave [0, 1]), and a 30-16-2 MLP trained on them (seeded, full batch, 150 Adam steps)."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    raw = torch.tensor(data.data[:n], dtype=torch.float32)
    x = (raw - raw.mean(0)) / raw.std(0)
    y = torch.tensor(data.target[:n])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return x, y, model.eval()


@pytest.fixture(scope="module")
def cancer():
    return standardized_cancer()


ADVERSARIAL = dict(eps=0.1, steps=5, targets=1, square_queries=10)
NPPR = dict(eps=0.1, latent_dim=4, components=2, fit_steps=3, fit_batch_size=16, draws_per_input=4, budget=20_000)


@pytest.mark.parametrize("check, keywords", [("adversarial_accuracy", ADVERSARIAL), ("nppr", NPPR)])
def test_bounds_none_is_no_box_in_the_checks_that_default_to_one(cancer, check, keywords):
    """Standardized features lie outside (0, 1): with bounds=None the check runs (it used to read
    None as the default (0, 1) and refuse the data), and its message says there is no box."""
    x, y, model = cancer
    r = getattr(pr, check)(model, (x, y), bounds=None, **keywords)
    assert "bounds=None" in r.message()
    with pytest.raises(pr.RobustDataError, match="outside the perturbation's box"):
        getattr(pr, check)(model, (x, y), **keywords)  # the default box (0, 1) still holds when bounds is not given


def test_bounds_none_reaches_the_check_through_a_marker_and_yaml(pytester):
    pytester.makeconftest(f"""
import pytest, sys
sys.path.insert(0, {str(pytester.path.parent)!r})
sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
from test_tabular import standardized_cancer

@pytest.fixture(scope="session")
def cancer():
    return standardized_cancer(80)

@pytest.fixture(scope="session")
def robust_model(cancer):
    return cancer[2]

@pytest.fixture(scope="session")
def robust_data(cancer):
    return cancer[:2]
""")
    pytester.makepyfile(test_box="""
import pytest

@pytest.mark.robust(adversarial_accuracy=0.01, eps=0.1, steps=3, targets=1, square_queries=5, bounds=None)
def test_marker():
    pass
""")
    pytester.makepyfile(factories="""
from test_tabular import standardized_cancer

def model():
    return standardized_cancer(80)[2]

def data():
    return standardized_cancer(80)[:2]
""")
    pytester.path.joinpath("robust_box.yaml").write_text(
        "model: factories:model\ndata: factories:data\nchecks:\n  - name: yaml-no-box\n    adversarial_accuracy: 0.01\n"
        "    eps: 0.1\n    steps: 3\n    targets: 1\n    square_queries: 5\n    bounds: null\n")
    run = pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out")
    run.assert_outcomes(passed=2)
    results = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    assert [("bounds=None" in r["perturbation"]) for r in results] == [True, True]


def test_one_sided_and_infinite_bounds_are_accepted_wherever_bounds_are(cancer):
    x, y, model = cancer
    counts = x - x.min()  # non-negative "count" features: a box open above
    box = (0.0, math.inf)
    assert pr.UniformLinf(eps=0.1, bounds=box).bounds == box
    r = pr.adversarial_accuracy(model, (counts + x.min(), y), **{**ADVERSARIAL, "bounds": (float(x.min()), math.inf)})
    assert f"bounds=({float(x.min()):g}, inf)" in r.message()
    moved = pr.UniformLinf(eps=0.5, bounds=box)(counts, torch.Generator().manual_seed(0))
    assert bool((moved >= 0).all()) and bool((moved - counts).abs().max() <= 0.5 + 1e-6)
    for bad in [(1.0, 0.0), (math.nan, 1.0), (0.0,), "01"]:
        with pytest.raises(pr.SettingError, match="bounds=.* is invalid"):
            pr.UniformLinf(eps=0.1, bounds=bad)


@pytest.mark.parametrize("length", [4, 6])
def test_a_per_feature_bound_on_sequences_applies_to_the_last_axis_also_when_l_equals_d(length):
    """(N, L, D) sequences with a (D,) bound: numpy's rule lays it along D, also when L == D (it used
    to be read per 'channel', along L, in that case)."""
    x = torch.zeros(2, length, 4)
    lo, hi = box_for((torch.tensor([-1.0, -2.0, -3.0, -4.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])), x)
    clipped = torch.maximum(torch.minimum(x + 10, hi), lo)
    assert clipped[0, :, :].tolist() == [[1.0, 2.0, 3.0, 4.0]] * length


def test_per_channel_bounds_on_images_stay_per_channel():
    x = torch.zeros(2, 3, 5, 5)
    lo, hi = box_for(([0.0, 0.1, 0.2], [1.0, 0.9, 0.8]), x)
    assert tuple(lo.shape) == (3, 1, 1) and float(hi[2, 0, 0]) == pytest.approx(0.8)
