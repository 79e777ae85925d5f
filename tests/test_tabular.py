"""Inputs that are not images: the box has one meaning everywhere (``bounds=None`` is no box, in
every check and door; either end may be infinite; per-feature bounds broadcast by numpy's rule),
and messages name the box whenever it is not (0, 1). On scikit-learn's bundled breast-cancer data
(30 features, standardized) with a small MLP trained in well under a second (seeded)."""

from __future__ import annotations

import json
import math
import re
import warnings

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


# -- sizes per feature ---------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda s: pr.UniformLinf(eps=s, bounds=None),
                                  lambda s: pr.GaussianNoise(sigma=s, bounds=None),
                                  lambda s: pr.CauchyNoise(scale=s, bounds=None)])
def test_a_size_per_feature_moves_each_feature_by_its_own_size_and_0_keeps_it_fixed(make):
    x = torch.zeros(4000, 3)
    size = torch.tensor([0.0, 0.1, 1.0])
    moved = make(size)(x, torch.Generator().manual_seed(1)) - x
    assert bool((moved[:, 0] == 0).all())  # an immutable feature
    spread = moved[:, 1:].abs().median(dim=0).values
    assert float(spread[1] / spread[0]) == pytest.approx(10.0, rel=0.1)  # a size's median move scales with it
    assert "per-feature (3,) in [0, 1]" in repr(make(size))


def test_a_per_feature_eps_bounds_every_attack_stage_in_its_own_feature(cancer):
    """L-inf per feature: every point the attack reports lies within eps_j of its input in each
    feature j (features with eps 0 never move), and the ball is stated as per-feature."""
    x, y, model = cancer
    eps = torch.full((30,), 0.3)
    eps[:10] = 0.0
    r = pr.adversarial_accuracy(model, (x, y), eps=eps, bounds=None, steps=10, square_queries=40)
    assert "eps=per-feature (30,) in [0, 0.3]" in r.message() and r.details["attack"]["eps"].startswith("per-feature")
    whole = pr.adversarial_accuracy(model, (x, y), eps=0.3, bounds=None, steps=10, square_queries=40)
    assert r.estimate >= whole.estimate  # a smaller ball (20 features of 30 may move) breaks no more inputs


def test_the_attack_points_stay_inside_a_per_feature_ball():
    from pytest_robust.attacks.norms import ball
    from pytest_robust.attacks.square import square  # noqa: F401  (the L-inf Square search uses the ball's sizes)
    from pytest_robust.perturbations.base import feasible_box

    x = torch.rand(8, 5)
    eps = torch.tensor([0.0, 0.1, 0.2, 0.0, 0.4])
    lo, hi = feasible_box(x, eps, None)
    inside = ball("linf", 0.4, eps).project(x + 10 * torch.randn(8, 5), x, lo, hi)
    assert bool(((inside - x).abs() <= eps + 1e-7).all())


def test_per_feature_radii_are_linf_only(cancer):
    x, y, model = cancer
    with pytest.raises(pr.SettingError, match="per-feature radii are for norm='linf'"):
        pr.adversarial_accuracy(model, (x, y), eps=torch.full((30,), 0.1), norm="l2", bounds=None)


# -- units that cannot be silently wrong --------------------------------------------------------


def test_the_image_default_eps_is_refused_on_features_with_the_fix(cancer):
    x, y, model = cancer
    with pytest.raises(pr.ArgumentError, match=r"needs eps=: the default, robust_eps = 0.0313725, is a radius in "
                                               r"\[0, 1\] pixel units for images.*scaler.scale_"):
        pr.adversarial_accuracy(model, (x, y), bounds=None)


@pytest.mark.parametrize("size, warns", [(50.0, True), (4.0, False), (0.1, False)])
def test_a_size_several_times_the_spread_of_the_data_is_warned_about_naming_the_spread(cancer, size, warns):
    """Standardized features have spread 1: the rule warns from 5 times a feature's spread on."""
    import warnings

    x, y, model = cancer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=size, bounds=None), budget=300)
    said = [str(w.message) for w in caught if "times the standard deviation of feature" in str(w.message)]
    assert bool(said) == warns
    if warns:
        assert re.search(r"eps \(50\) is 50 times the standard deviation of feature \d+, 1, over the 200 "
                         r"inputs", said[0])


@pytest.mark.parametrize("call", ["tsrm", "adversarial_l2", "certified"])
def test_one_size_for_raw_features_on_scales_10_5_apart_is_warned_about_naming_the_feature(call):
    """Raw breast-cancer features: areas spread by hundreds, smoothness by thousandths. One number
    for all of them moves the least-varying ones by many of their standard deviations."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x, y = torch.tensor(data.data[:200], dtype=torch.float32), torch.tensor(data.target[:200])
    model = torch.nn.Linear(30, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if call == "tsrm":
            pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=8 / 255, bounds=None), budget=300)
        elif call == "adversarial_l2":
            pr.adversarial_accuracy(model, (x, y), eps=1.0, norm="l2", bounds=None, steps=2, inputs=4)
        else:
            pr.certified_accuracy(model, (x, y), sigma=0.25, radius=0.1, max_draws=200)
    said = [str(w.message) for w in caught if "times the standard deviation of feature" in str(w.message)]
    assert said, [str(w.message) for w in caught]
    fix = "give eps per feature" if call == "tsrm" else "is one number here, so give the model inputs on one scale"
    assert fix in said[0] and "grey levels" not in " ".join(str(w.message) for w in caught)


def test_a_per_feature_size_is_held_against_each_features_own_spread():
    import warnings

    x = torch.randn(500, 3) * torch.tensor([1.0, 100.0, 0.01])
    y = torch.randint(0, 2, (500,))
    model = torch.nn.Linear(3, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pr.tsrm(model, (x, y), perturbation=pr.GaussianNoise(sigma=torch.tensor([0.1, 10.0, 0.1]), bounds=None),
                budget=200)
    said = [str(w.message) for w in caught if "standard deviation of feature" in str(w.message)]
    assert len(said) == 1 and "of feature 2" in said[0]  # 0.1 is ten standard deviations of the third feature


# -- label sanity in every mode ------------------------------------------------------------------


def test_swapped_labels_are_warned_about_without_a_threshold(cancer):
    x, y, model = cancer
    with pytest.warns(pr.RobustWarning, match=r"near or below chance \(1/2\).*features are scaled as in training.*"
                                              r"labels \(swapped"):
        r = pr.tsrm(model, (x, 1 - y), perturbation=pr.UniformLinf(eps=0.01, bounds=None), budget=500)
    assert r.verdict == "estimate" and r.details["label_probe"]["evaluations"] == 64
    assert "label check: the model is near or below chance" in r.message()
    assert "ToTensor" not in r.details["clean_accuracy_advice"] and "RGB" not in r.details["clean_accuracy_advice"]


def test_a_constant_model_passing_on_imbalanced_data_is_warned_about():
    class AlwaysOne(torch.nn.Module):
        def forward(self, x):
            return torch.stack([torch.zeros(len(x)), torch.ones(len(x))], dim=1) + 0 * x.sum(dim=1, keepdim=True)

    x = torch.randn(400, 5)
    y = (torch.arange(400) % 20 != 0).long()  # 95% class 1
    with pytest.warns(pr.RobustWarning, match=r"predicts class 1 for every one of 64 inputs of several labels.*"
                                              r"\(0\.950 for class 1"):
        r = pr.tsrm(AlwaysOne(), (x, y), perturbation=pr.UniformLinf(eps=0.1, bounds=None), threshold=0.9, budget=2000)
    assert r.verdict == "pass" and "label check: it predicts class 1" in r.message()


def test_a_sound_model_gets_no_label_warning(cancer):
    import warnings

    x, y, model = cancer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=0.05, bounds=None), threshold=0.8, budget=500)
    assert "clean_accuracy_advice" not in r.details and not [w for w in caught if "chance" in str(w.message)]


def test_the_attack_line_of_a_two_class_model_shows_the_one_target_it_runs(cancer):
    x, y, model = cancer
    r = pr.adversarial_accuracy(model, (x, y), eps=0.1, bounds=None, steps=5, square_queries=10)  # targets=6 asked
    assert "APGD-T 5 steps x 1 target(s)" in r.message() and "x 6 target(s)" not in r.message()


# -- the containers people have --------------------------------------------------------------------------------

NOISE = dict(perturbation=pr.UniformLinf(eps=0.2, bounds=None), budget=400, seed=3)


def test_a_dataframe_and_series_give_the_numbers_of_the_tensors(cancer):
    pd = pytest.importorskip("pandas")
    x, y, model = cancer
    frame = pd.DataFrame(x.numpy(), columns=[f"f{i}" for i in range(30)])
    series = pd.Series(y.numpy(), name="label")
    assert pr.tsrm(model, (frame, series), **NOISE).estimate == pr.tsrm(model, (x, y), **NOISE).estimate


def test_integer_dataframe_columns_are_read_as_numbers_and_a_text_column_is_named():
    pd = pytest.importorskip("pandas")
    from pytest_robust.engine.data import load_data

    frame = pd.DataFrame({"visits": [1, 2, 3], "spend": [0.5, 1.5, 2.5]})
    ds = load_data((frame, pd.Series([0, 1, 0])))
    assert ds.x.dtype == torch.float64 and ds.x.tolist() == [[1, 0.5], [2, 1.5], [3, 2.5]]
    frame["country"] = ["fr", "de", "it"]
    with pytest.raises(pr.RobustDataError, match=r"column 'country' is not numeric .*pd.get_dummies"):
        load_data((frame, pd.Series([0, 1, 0])))


def test_numpy_object_arrays_of_numbers_are_read_as_the_numbers(cancer):
    import numpy as np

    x, y, model = cancer
    objects = np.empty(x.shape, dtype=object)
    objects[:] = x.double().numpy()
    labels = np.array(list(y.tolist()), dtype=object)
    assert pr.tsrm(model, (objects, labels), **NOISE).estimate == pr.tsrm(model, (x.double(), y), **NOISE).estimate


@pytest.mark.parametrize("labels", ["list", "numpy", "object"])
def test_string_labels_are_named_with_the_fix(labels):
    import numpy as np

    from pytest_robust.engine.data import load_data

    names = ["benign", "malignant", "benign"]
    labels = {"list": names, "numpy": np.array(names), "object": np.array(names, dtype=object)}[labels]
    with pytest.raises(pr.RobustDataError, match=r"found 2 distinct labels \('benign', 'malignant'\); map them "
                                                  r"to 0..K-1 in the order of the model's outputs"):
        load_data((torch.zeros(3, 2), labels))


def test_string_features_are_refused_naming_the_value():
    import numpy as np

    from pytest_robust.engine.data import load_data

    with pytest.raises(pr.RobustDataError, match=r"a value that is not a number \('red'.* token ids"):
        load_data((np.array([[1.0, "red"], [2.0, "blue"]], dtype=object), [0, 1]))


@pytest.mark.parametrize("kind", ["scipy", "torch_coo", "torch_csr"])
def test_sparse_features_are_densified_to_the_same_numbers(cancer, kind):
    x, y, model = cancer
    sparse_x = x * (x.abs() > 0.5)  # zeros, so that sparsity is real
    if kind == "scipy":
        scipy_sparse = pytest.importorskip("scipy.sparse")
        features = scipy_sparse.csr_matrix(sparse_x.numpy())
    else:
        features = sparse_x.to_sparse() if kind == "torch_coo" else sparse_x.to_sparse_csr()
    assert pr.tsrm(model, (features, y), **NOISE).estimate == pr.tsrm(model, (sparse_x, y), **NOISE).estimate


def test_a_dataset_of_feature_dicts_is_named_with_the_fix():
    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"age": float(i), "income": 2.0 * i, "label": i % 2}

    with pytest.raises(pr.RobustDataError, match=r"a mapping of 2 features \('age', 'income'\) and the label "
                                                  r"'label': .* stack the features"):
        pr.tsrm(torch.nn.Linear(2, 2), Rows(), **NOISE)


def test_a_dataset_whose_length_lies_is_named_with_the_index():
    class Short(torch.utils.data.Dataset):
        def __init__(self):
            self.x, self.y = torch.randn(600, 3), torch.zeros(600, dtype=torch.long)

        def __len__(self):
            return 700

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    with pytest.raises(pr.RobustDataError, match=r"__len__ is 700, but item 600 cannot be read \(IndexError"):
        pr.tsrm(torch.nn.Linear(3, 2), Short(), **NOISE)


# -- messages in the data's language -------------------------------------------------------------------------


@pytest.mark.parametrize("check", ["corruption_accuracy", "spatial"])
def test_image_only_perturbations_on_features_say_images_only_and_what_to_use(cancer, check):
    x, y, model = cancer
    with pytest.raises(pr.ArgumentError, match=r"is for images only .* inputs of shape \(200, 30\) are not images"
                                               r".*UniformLinf\(eps=\.\.\., bounds=None\)") as caught:
        if check == "spatial":
            pr.tsrm(model, (x, y), perturbation=pr.Spatial(), budget=100)
        else:
            pr.corruption_accuracy(model, (x, y), budget=100)
    assert "x[None]" not in str(caught.value) and "bounds=(0, 1)" not in str(caught.value)


@pytest.mark.parametrize("reference, error", [(torch.nn.Linear(5, 2), pr.RobustDataError),
                                              ("a path", pr.RobustModelError)])
def test_a_failing_reference_model_is_named_as_the_reference(cancer, reference, error):
    x, y, model = cancer
    with pytest.raises(error, match=r"^the reference model \(reference=\): "):
        pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=0.1, bounds=None), reference=reference,
                max_drop=0.05, budget=2000)


def test_a_per_feature_size_is_held_against_each_features_own_box_width():
    x = torch.rand(64, 3) * torch.tensor([1.0, 100.0, 1.0])
    lo, hi = torch.zeros(3), torch.tensor([1.0, math.inf, 1.0])
    model = torch.nn.Linear(3, 2)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # eps 30 has room in the unbounded feature
        pr.tsrm(model, (x, torch.zeros(64, dtype=torch.long)),
                perturbation=pr.UniformLinf(eps=torch.tensor([0.1, 30.0, 0.1]), bounds=(lo, hi)), budget=64)
    assert not [w for w in said if "width" in str(w.message)]
    with pytest.warns(pr.RobustWarning, match=r"eps=2 is at least the width 1 of the input box at element 2"):
        pr.tsrm(model, (x, torch.zeros(64, dtype=torch.long)),
                perturbation=pr.UniformLinf(eps=torch.tensor([0.1, 30.0, 2.0]), bounds=(lo, hi)), budget=64)


# -- NPPR with one radius per feature ------------------------------------------------------------------------


class Seen(torch.nn.Module):
    """Wraps a model and keeps every input row it evaluates."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.rows = inner, []

    def forward(self, x):
        self.rows.append(x.detach().clone())
        return self.inner(x)


def test_nppr_takes_one_radius_per_feature_and_keeps_features_of_radius_0_fixed(cancer):
    x, y, model = cancer
    options = {**NPPR, "cache_dir": None}
    scalar = pr.nppr(model, (x, y), bounds=None, **options)
    constant = pr.nppr(model, (x, y), bounds=None, **{**options, "eps": torch.full((30,), 0.1)})
    assert (constant.estimate, constant.lower, constant.upper) == (scalar.estimate, scalar.lower, scalar.upper)
    eps = torch.full((30,), 0.3)
    eps[:15] = 0.0
    seen = Seen(model)
    r = pr.nppr(seen, (x, y), bounds=None, **{**options, "eps": eps})
    assert "LearnedGMM(eps=per-feature (30,) in [0, 0.3]" in r.message()
    rows = torch.cat(seen.rows)
    fixed = {tuple(row) for row in x[:, :15].tolist()}
    assert all(tuple(row) in fixed for row in rows[:, :15].tolist())  # the learned noise, PGD and the context
    nearest = torch.cdist(rows[:, 15:].double(), x[:, 15:].double(), p=float("inf")).min(dim=1).values
    assert float(nearest.max()) <= 0.3 + 1e-6  # every other feature within its radius of some input


def test_nppr_per_feature_radii_are_l_inf_only(cancer):
    x, y, model = cancer
    with pytest.raises(pr.SettingError, match=r"one number with norm='l2'"):
        pr.nppr(model, (x, y), bounds=None, norm="l2", **{**NPPR, "eps": torch.full((30,), 0.1), "cache_dir": None})


# -- what a new user gets wrong with tables ---------------------------------------------------------------------


def test_a_per_feature_size_of_the_wrong_shape_is_named_as_a_size(cancer):
    x, y, model = cancer
    with pytest.raises(pr.ArgumentError, match=r"a per-feature size of shape \(13,\) does not fit inputs of shape "
                                               r"\(30,\)"):
        pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=torch.full((13,), 0.1), bounds=None), budget=100)


def test_a_dataset_that_stops_early_and_misaligned_pandas_labels_are_refused(cancer):
    pd = pytest.importorskip("pandas")
    x, y, model = cancer

    class Stops(torch.utils.data.Dataset):
        def __len__(self):
            return len(y) + 10

        def __getitem__(self, i):
            if i >= len(y):
                raise StopIteration
            return x[i], y[i]

    with pytest.raises(pr.RobustDataError, match=r"__len__ is 210, but reading it in order yielded 200 items "
                                                  r".*StopIteration at item 200"):
        pr.tsrm(model, Stops(), perturbation=NOISE["perturbation"], budget=100)
    frame, labels = pd.DataFrame(x.numpy()), pd.Series(y.numpy())
    with pytest.raises(pr.RobustDataError, match=r"the inputs' and the labels' index differ .* y.loc\[X.index\]"):
        pr.tsrm(model, (frame, labels.sample(frac=1.0, random_state=0)), **NOISE)


def test_lists_of_rows_are_read_and_ragged_rows_named(cancer):
    x, y, model = cancer
    assert pr.tsrm(model, (x.tolist(), y.tolist()), **NOISE).estimate == pr.tsrm(model, (x, y), **NOISE).estimate
    with pytest.raises(pr.RobustDataError, match=r"rows of different lengths"):
        pr.tsrm(model, ([[1.0, 2.0], [1.0]], [0, 1]), **NOISE)


def test_a_two_logit_model_of_probabilities_is_not_called_one_logit():
    class Confident(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(2))

        def forward(self, x):
            return torch.tensor([0.0, 1.0]).expand(len(x), 2) + 0 * self.bias

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pr.tsrm(Confident(), (torch.randn(40, 3), torch.ones(40, dtype=torch.long)), **NOISE)
    said = " ".join(str(w.message) for w in caught)
    assert "one-logit" not in said and "every row sums to 1" in said


def test_a_normalization_per_feature_is_stated_briefly(cancer):
    x, y, model = cancer
    r = pr.tsrm(model, (x, y), normalize=(x.mean(0).tolist(), x.std(0).tolist()), **NOISE)
    assert "normalized inside the model (mean 30 values from" in r.message()
