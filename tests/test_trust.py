"""Trust: stored state that cannot lie (fit-cache checksums, perturbation identities without memory
addresses), names a new user gets wrong, and bad input that gets a clear error naming the problem and
the fix: per-channel bounds, corruptions too large for small images, a single unbatched input, sizes
huge for the data's range, misspelt fixture names, mapping items read by ``data_keys``, and a low
result stated beside the clean accuracy."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from toy_models import ConstantLogits, SmallNet, ThresholdModel, image_data, small_net_conftest, threshold_data

from pytest_robust import (
    ArgumentError,
    Corruption,
    GaussianNoise,
    Result,
    RobustDataError,
    RobustWarning,
    SettingError,
    UniformLinf,
    adversarial_accuracy,
    certified_accuracy,
    corruption_accuracy,
    nppr,
    tsrm,
)
from pytest_robust.engine import cache
from pytest_robust.perturbations.corruptions import CorruptionGrid
from pytest_robust.settings.keys import Settings


def _entry():
    return {"state": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(2)}, "record": {"loss": [0.5, 0.25]}}


def test_an_entry_round_trips_with_its_checksum(tmp_path):
    path = cache.entry_path(tmp_path, "nppr", "k" * 64)
    cache.store(path, "k" * 64, _entry())
    entry, state = cache.load(path, "k" * 64)
    assert state == "hit" and torch.equal(entry["state"]["w"], _entry()["state"]["w"])


def _altered(tmp_path, change):
    path = cache.entry_path(tmp_path, "nppr", "k" * 64)
    cache.store(path, "k" * 64, _entry())
    raw = torch.load(path, weights_only=True)
    change(raw)
    torch.save(raw, path)  # still a loadable entry with the right key
    return cache.load(path, "k" * 64)


def test_an_altered_tensor_is_refused(tmp_path):
    entry, state = _altered(tmp_path, lambda raw: raw["state"]["w"].add_(1e-3))
    assert entry is None and state.startswith("invalid: its payload does not match the checksum")


def test_an_altered_plain_value_or_a_dropped_field_is_refused(tmp_path):
    assert _altered(tmp_path, lambda raw: raw["record"].update(loss=[0.1, 0.1]))[0] is None
    assert _altered(tmp_path, lambda raw: raw["state"].pop("b"))[0] is None
    assert _altered(tmp_path, lambda raw: raw.pop("checksum"))[0] is None


def test_the_checksum_ignores_dict_order():
    a = {"x": torch.ones(2), "y": {"p": 1, "q": [1, 2]}}
    b = {"y": {"q": [1, 2], "p": 1}, "x": torch.ones(2)}
    assert cache.payload_checksum(a) == cache.payload_checksum(b)
    assert cache.payload_checksum(a) != cache.payload_checksum({**a, "x": torch.ones(2, dtype=torch.float64)})


# -- perturbation identities never hold a memory address ---------------------------------------------


class _Shift(__import__("pytest_robust").Perturbation):
    """A user's perturbation class without a __repr__."""

    def __init__(self, amount, table=None):
        super().__init__()
        self.amount, self.table = amount, table

    def sample(self, x, generator):
        return x + self.amount


def test_a_user_perturbation_is_named_by_its_class_and_parameters():
    import torch

    p = _Shift(0.1, table=torch.arange(3.0))
    text = repr(p)
    assert " at 0x" not in text and text.startswith(
        "_Shift(amount=0.1, bounds=(0.0, 1.0), table=tensor(float32, (3,), ")
    assert repr(_Shift(0.1, table=torch.arange(3.0))) == text != repr(_Shift(0.2, table=torch.arange(3.0)))


def test_a_perturbation_that_cannot_be_named_warns_and_is_never_matched_with_a_baseline():
    import pytest

    from pytest_robust.perturbations import as_perturbation
    from pytest_robust.report.store import UNMATCHABLE, compare
    from pytest_robust.results import Result

    with pytest.warns(UserWarning, match="cannot be named the same way in every run"):
        p = as_perturbation(_Shift(0.1, table=object()))
    r = Result("tsrm", 0.9, 0.85, 0.95, 0.8, 0.95, "pass", 10, 100, 100, 1.0, "cpu", 0, repr(p), 100,
               test_id="t::x").to_dict()
    assert [row["status"] for row in compare([r], [r])] == [UNMATCHABLE]
    ok = dict(r, perturbation=repr(_Shift(0.1)), estimate=0.9, lower=0.899, upper=0.901)  # bounds that can tell
    assert [row["status"] for row in compare([ok], [ok])] == ["unchanged"]


# -- names a new user gets wrong ------------------------------------------------------------------


@pytest.mark.parametrize("typed, meant", [("jpeg", "jpeg_compression"), ("Gaussian Noise", "gaussian_noise"),
                                          ("motion", "motion_blur"), ("fogg", "fog")])
def test_a_misspelt_corruption_gets_a_did_you_mean(typed, meant):
    from pytest_robust import Corruption

    with pytest.raises(ValueError, match=rf"unknown corruption '{typed}' \(did you mean '{meant}'\?\)"):
        Corruption(typed, 3)


# -- data in the shapes people hand over ------------------------------------------------------------


class _Mapped(torch.utils.data.Dataset):
    """Items as mappings, the Hugging Face datasets shape."""

    def __init__(self, keys=("pixel_values", "label")):
        from toy_models import image_data

        self.x, self.y = image_data(n=40)
        self.keys = keys

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {self.keys[0]: self.x[i], self.keys[1]: self.y[i], "id": i}


@pytest.mark.parametrize("keys", [("pixel_values", "label"), ("image", "labels"), ("x", "target")])
def test_a_dataset_of_mappings_gives_the_numbers_of_its_tensors(keys):
    from toy_models import SmallNet

    from pytest_robust import UniformLinf, tsrm

    data = _Mapped(keys)
    by_map = tsrm(SmallNet().eval(), data, perturbation=UniformLinf(eps=0.1), threshold=None, budget=512)
    by_pair = tsrm(SmallNet().eval(), (data.x, data.y), perturbation=UniformLinf(eps=0.1), threshold=None, budget=512)
    assert (by_map.estimate, by_map.lower, by_map.upper) == (by_pair.estimate, by_pair.lower, by_pair.upper)


def test_a_mapping_without_known_keys_names_what_it_found():
    from toy_models import SmallNet

    from pytest_robust import RobustDataError, UniformLinf, tsrm

    with pytest.raises(RobustDataError, match=r"a mapping with keys \['id', 'img', 'klass'\].*pixel_values.*label"):
        tsrm(SmallNet().eval(), _Mapped(("img", "klass")), perturbation=UniformLinf(eps=0.1), threshold=None,
             budget=512)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_loader_that_drops_its_last_batch_is_read_whole(shuffle):
    from pytest_robust.engine.data import load_data

    data = _Mapped()
    loader = torch.utils.data.DataLoader(data, batch_size=16, drop_last=True, shuffle=shuffle)
    loaded = load_data(loader)
    assert len(loaded) == 40 and torch.equal(loaded.x, data.x)


def test_inputs_that_carry_gradients_are_detached_for_every_check():
    from test_check_shape import CHECKS
    from toy_models import SmallNet, image_data

    x, y = image_data(n=40)
    leaf = x.clone().requires_grad_(True)
    scaled = leaf * 1.0  # a non-leaf in a graph, as a data pipeline with autograd on would give
    for name in ("nppr", "tsrm", "adversarial_accuracy"):
        out = CHECKS[name](SmallNet().eval(), (scaled, y))
        assert out.estimate == CHECKS[name](SmallNet().eval(), (x, y)).estimate, name


# -- stored baselines that cannot be read -----------------------------------------------------------


@pytest.mark.parametrize("content", ["{not json", '{"results": 3}', "[]"])
def test_an_unreadable_baseline_is_named_and_every_report_is_still_written(pytester, content):
    from test_plugin import CONFTEST, PASSING

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    assert pytester.runpytest("-p", "no:cacheprovider", "--robust-save", "base").ret == 0
    (saved,) = (pytester.path / ".robust_baselines").rglob("base.json")
    saved.write_text(content)
    result = pytester.runpytest("-p", "no:cacheprovider", "--robust-compare", "base", "--robust-report", "out",
                                "--robust-junitxml", "metric.xml")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*robust baseline comparison skipped: baseline *base.json*delete it or save a new one*"])
    assert (pytester.path / "out" / "results.json").is_file() and (pytester.path / "metric.xml").is_file()
    failing = pytester.runpytest("-p", "no:cacheprovider", "--robust-compare-fail", "--robust-compare", "base",
                                 "--robust-report", "out2")
    assert failing.ret == pytest.ExitCode.USAGE_ERROR and (pytester.path / "out2" / "results.json").is_file()


# =====================================================================================================
# bad input gets a clear error that names the problem and the fix
# =====================================================================================================

ONE_THREAD_NPPR = dict(components=2, latent_dim=4, fit_steps=2, fit_batch_size=8, fit_draws=2, draws_per_input=2,
                       budget=20_000)


def _warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, RobustWarning)]


# -- 1. per-channel bounds: the shape of mean/std lists works; a shape that cannot fit is named -----------


PER_CHANNEL = [
    ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]),
    (torch.zeros(3), torch.ones(3)),
    (torch.zeros(3), 1.0),
    ([0.0, 0.0, 0.0], torch.ones(3, 1, 1)),
]


@pytest.mark.parametrize("bounds", PER_CHANNEL, ids=["tuples", "lists", "tensors", "tensor-and-number", "mixed"])
@pytest.mark.parametrize("make", [lambda b: UniformLinf(eps=0.1, bounds=b),
                                  lambda b: GaussianNoise(sigma=0.1, bounds=b)],
                         ids=["linf", "gaussian"])
def test_per_channel_bounds_of_length_c_give_the_numbers_of_c_1_1(bounds, make):
    x, y = image_data(n=40)
    ref = tsrm(SmallNet().eval(), (x, y), perturbation=make((torch.zeros(3, 1, 1), torch.ones(3, 1, 1))),
               threshold=None, budget=300)
    got = tsrm(SmallNet().eval(), (x, y), perturbation=make(bounds), threshold=None, budget=300)
    assert (got.estimate, got.lower, got.upper) == (ref.estimate, ref.lower, ref.upper)


def test_per_channel_bounds_reach_every_place_bounds_meet_inputs():
    from pytest_robust.perturbations.base import feasible_box

    x, y = image_data(n=24)
    lo, hi = [0.0, 0.1, 0.2], [0.9, 0.95, 1.0]
    box_lo, box_hi = feasible_box(x, 0.5, (lo, hi))
    assert box_lo.shape == x.shape and torch.equal(box_lo[:, 1], (x[:, 1] - 0.5).clamp(min=0.1))
    assert torch.equal(box_hi[:, 0], (x[:, 0] + 0.5).clamp(max=0.9))
    clipped = Corruption("contrast", 2, bounds=(lo, hi))(x.clamp(0.2, 0.9), torch.Generator().manual_seed(0))
    assert clipped.shape == x.shape
    r = adversarial_accuracy(SmallNet().eval(), (x.clamp(0.2, 0.9), y), eps=0.05, steps=2, targets=0, square_queries=0,
                             bounds=(lo, hi))
    assert r.verdict == "estimate"


BAD_BOUNDS = [
    ((torch.zeros(4), torch.ones(4)), "(4,)"),  # a length that broadcasts along the width of 4 px images
    (([0.0, 0.0], [1.0, 1.0]), "(2,)"),
    ((torch.zeros(5, 1, 1), torch.ones(5, 1, 1)), "(5, 1, 1)"),
    ((torch.zeros(3, 4), torch.ones(3, 4)), "(3, 4)"),
    ((torch.zeros(2, 3, 1, 1), torch.ones(2, 3, 1, 1)), "(2, 3, 1, 1)"),
    ((0.0, torch.ones(4)), "(4,)"),
]


@pytest.mark.parametrize("bounds, shown", BAD_BOUNDS, ids=[s for _, s in BAD_BOUNDS[:5]] + ["hi-only"])
def test_bounds_that_cannot_fit_the_inputs_name_both_shapes_and_the_accepted_ones(bounds, shown):
    x, y = image_data(n=40)  # (40, 3, 4, 4)
    with pytest.raises(ArgumentError) as err:
        tsrm(SmallNet().eval(), (x, y), perturbation=UniformLinf(eps=0.1, bounds=bounds), threshold=None, budget=300)
    text = str(err.value)
    assert f"bounds of shape {shown} do not fit inputs of shape (3, 4, 4)" in text
    assert "a sequence of 3 numbers (one per channel" in text and "(3, 1, 1)" in text


@pytest.mark.parametrize("call", ["clip", "feasible_box", "corruption"])
def test_bounds_that_cannot_fit_are_named_wherever_they_meet_the_inputs(call):
    from pytest_robust.perturbations.base import feasible_box

    x = image_data(n=8)[0]
    bounds = (torch.zeros(4), torch.ones(4))
    run = {"clip": lambda: UniformLinf(eps=0.1, bounds=bounds).clip(x),
           "feasible_box": lambda: feasible_box(x, 0.1, bounds),
           "corruption": lambda: Corruption("contrast", 1, bounds=bounds)(x, torch.Generator())}[call]
    with pytest.raises(ArgumentError, match=r"bounds of shape \(4,\) do not fit inputs of shape \(3, 4, 4\).*one per "
                                            r"channel"):
        run()


# -- 2. corruptions that cannot apply to small images --------------------------------------------------


@pytest.mark.parametrize("size, channels", [(8, 3), (8, 1), (16, 3), (31, 1)])
def test_the_default_grid_runs_the_corruptions_that_apply_and_names_those_left_out(size, channels):
    x, y = image_data(n=40, size=size, channels=channels)
    model = SmallNet(size=size, channels=channels).eval()
    with pytest.warns(RobustWarning, match=rf"leaves out 4 corruption\(s\) that cannot apply to {size}x{size} "
                                           r".*glass_blur, motion_blur, snow, frost: "
                                           r"each needs images of at least 32x32 px.*"
                                           r"name corruptions=\[\.\.\.\] to choose them yourself"):
        r = corruption_accuracy(model, (x, y), budget=400)
    assert set(r.details["left_out"]) == {"glass_blur", "motion_blur", "snow", "frost"}
    assert "snow" not in r.perturbation and "fog" in r.perturbation and len(r.details["per_corruption"]) == 11
    assert any("leaves out" in w for w in r.details["warnings"])


def test_a_default_grid_given_as_a_perturbation_leaves_out_the_same_corruptions():
    x, y = image_data(n=40, size=8)
    with pytest.warns(RobustWarning, match="leaves out 4 corruption"):
        r = tsrm(SmallNet(size=8).eval(), (x, y), perturbation=CorruptionGrid(severities=[1]), threshold=None,
                 budget=300)
    assert "glass_blur" not in r.perturbation


@pytest.mark.parametrize("names, problem", [
    (["snow"], "snow cannot apply to 8x8 images"),
    (["fog", "frost"], "frost cannot apply to 8x8 images"),
    (["motion_blur"], "motion_blur cannot apply to 8x8 images"),
    (["glass_blur", "contrast"], "glass_blur cannot apply to 8x8 images"),
    (["spatter"], "spatter cannot apply to 8x8 images"),
])
def test_a_named_corruption_that_cannot_apply_is_a_one_line_error_with_the_fix(names, problem):
    x, y = image_data(n=40, size=8)
    with pytest.raises(ArgumentError) as err:
        corruption_accuracy(SmallNet(size=8).eval(), (x, y), corruptions=names, budget=400)
    text = str(err.value)
    assert problem in text and "needs at least 32x32 px" in text and "Leave it out for small images" in text
    assert "\n" not in text


def test_a_named_colour_corruption_on_grey_images_says_to_leave_it_out():
    x, y = image_data(n=40, size=8, channels=1)
    with pytest.raises(ArgumentError, match="saturate changes colour saturation and needs RGB images.*leave saturate "
                                            "out for grey images"):
        corruption_accuracy(SmallNet(size=8, channels=1).eval(), (x, y), corruptions=["saturate"], budget=400)


@pytest.mark.parametrize("size", [2, 3])
def test_a_default_grid_that_applies_to_nothing_is_an_error(size):
    x, y = image_data(n=40, size=size)
    with pytest.raises(ArgumentError, match=rf"no corruption of the default grid applies to {size}x{size} images.*use "
                                            r"images of at least 4x4 px"):
        corruption_accuracy(SmallNet(size=size).eval(), (x, y), budget=400)


def test_through_pytest_a_named_corruption_that_cannot_apply_fails_in_one_line(pytester):
    pytester.makeconftest("""
        import pytest, torch
        from toy_models import SmallNet, image_data

        @pytest.fixture
        def robust_model():
            return SmallNet(size=8).eval()

        @pytest.fixture
        def robust_data():
            return image_data(n=40, size=8)
    """)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.robust(corruption_accuracy=0.5, corruptions=["snow"], budget=400)
        def test_named():
            pass

        @pytest.mark.robust(corruption_accuracy=0.01, budget=400)
        def test_default():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*robust check could not run: snow cannot apply to 8x8 images*Leave it out*"])
    assert "Traceback" not in result.stdout.str() and "_ops.py" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*RobustWarning: the default corruption grid leaves out 4 corruption(s)*"])


# -- 3. a single unbatched input is never read as several inputs -------------------------------------------


def _item():
    return torch.utils.data.TensorDataset(*image_data(n=10, size=8))[0]


@pytest.mark.parametrize("make, shape", [
    (lambda: (torch.rand(3, 8, 8), torch.tensor(1)), "(3, 8, 8)"),
    (lambda: (torch.rand(3, 8, 8), 1), "(3, 8, 8)"),
    (lambda: (torch.rand(3, 8, 8), torch.tensor([1])), "(3, 8, 8)"),
    (lambda: [torch.rand(3, 8, 8), [1]], "(3, 8, 8)"),
    (_item, "(3, 8, 8)"),
    (lambda: (torch.rand(5), torch.tensor(2)), "(5,)"),
], ids=["0-d label", "int label", "1-d label of one", "list pair", "dataset item", "feature vector"])
def test_a_single_input_with_one_label_says_to_add_the_batch_dimension(make, shape):
    with pytest.raises(RobustDataError) as err:
        tsrm(SmallNet(size=8).eval(), make(), perturbation=UniformLinf(eps=0.1), threshold=None, budget=300)
    text = str(err.value)
    assert f"a single {'image' if len(shape) > 5 else 'input'} of shape {shape} with one label" in text
    assert "x.unsqueeze(0), y.view(1)" in text


def test_a_batch_of_one_with_a_0d_label_says_to_view_it():
    with pytest.raises(RobustDataError,
                       match=r"labels must have shape \(n,\) .* got \(\) \(a 0-d label: y.view\(1\)\)"):
        tsrm(SmallNet(size=8).eval(), (torch.rand(1, 3, 8, 8), torch.tensor(1)), perturbation=UniformLinf(eps=0.1),
             threshold=None, budget=300)


# -- 4, 5. sizes huge relative to the data's range warn, for every size parameter --------------------------


@pytest.mark.parametrize("call, fragment", [
    (lambda m, d: certified_accuracy(m, d, radius=0.25, sigma=25, max_draws=2000, budget=20_000),
     r"certified accuracy: sigma=25 is at least the width 1 of the data's range"),
    (lambda m, d: certified_accuracy(m, d, radius=60, sigma=40, max_draws=2000, budget=20_000),
     r"certified accuracy: radius=60 is at least the L2 diameter"),
    (lambda m, d: adversarial_accuracy(m, d, eps=0.6, steps=2, targets=0, square_queries=0),
     r"adversarial accuracy: eps=0.6 is at least half the width 1 of the input box"),
    (lambda m, d: adversarial_accuracy(m, d, eps=8, steps=2, targets=0, square_queries=0),
     r"eps=8 is at least the width 1 of the input box"),
    (lambda m, d: tsrm(m, d, perturbation=GaussianNoise(sigma=25), threshold=None, budget=300),
     r"sigma=25 is at least the width 1 of the input box"),
    (lambda m, d: adversarial_accuracy(m, d, eps=3, steps=2, targets=0, square_queries=0,
                                       bounds=([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])),
     r"eps=3 is at least the width 1 of the input box"),
], ids=["smoothing-sigma", "smoothing-radius", "attack-half-box", "attack-whole-box", "noise-sigma", "per-channel-box"])
def test_a_size_huge_for_the_data_warns_naming_the_unit_mistake(call, fragment):
    x, y = image_data(n=40, size=4)
    x = x.clamp(1e-3, 1 - 1e-3)
    x[0, 0, 0, 0], x[1, 0, 0, 0] = 0.0, 1.0  # the data spans [0, 1]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = call(SmallNet().eval(), (x, y))
    told = [w for w in _warnings(record) if re.search(fragment, w)]
    assert len(told) == 1, _warnings(record)
    assert "8 grey levels in [0, 1] pixel space is 8/255, not 8" in told[0] and told[0] in r.details["warnings"]


@pytest.mark.parametrize("eps, norm, fragment", [
    (0.9, "linf", "NPPR: eps=0.9 is at least half the width 1 of the input box"),
    (0.5, "linf", "NPPR: eps=0.5 is at least half the width 1 of the input box"),
    (5.0, "l2", "NPPR: eps=5 is at least half the L2 diameter"),
])
def test_an_nppr_ball_that_covers_most_of_the_box_warns(eps, norm, fragment):
    x, y = image_data(n=40)
    with pytest.warns(RobustWarning, match=re.escape(fragment)):
        nppr(SmallNet().eval(), (x, y), eps=eps, norm=norm, **ONE_THREAD_NPPR)


def test_the_q_checks_default_ball_warns_when_robust_eps_is_in_grey_levels(pytester):
    pytester.makeconftest(small_net_conftest(8))
    pytester.makepyfile("""
        import pytest

        @pytest.mark.robust(q=1, max_loss=50, eps=8, steps=4, warmup=0, chains=4, inputs=4, estimator="mc",
                            budget=20000)
        def test_q():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*RobustWarning: UniformLinf(eps=8): eps=8 is at least the width 1 of the input box*"
                                 "8/255, not 8*"])


@pytest.mark.parametrize("call", [
    lambda m, d: certified_accuracy(m, d, radius=0.25, sigma=0.25, max_draws=2000, budget=20_000),
    lambda m, d: adversarial_accuracy(m, d, eps=8 / 255, steps=2, targets=0, square_queries=0),
    lambda m, d: tsrm(m, d, perturbation=GaussianNoise(sigma=0.25), threshold=None, budget=300),
], ids=["smoothing", "attack", "noise"])
def test_ordinary_sizes_do_not_warn(call):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        call(SmallNet().eval(), image_data(n=40))
    assert not [w for w in _warnings(record) if "is at least" in w]


# -- 6. a misspelt fixture name gets a did-you-mean ----------------------------------------------------------


@pytest.mark.parametrize("marker, ini, wrong, meant", [
    ('model="robust_modell"', "", "robust_modell", "robust_model"),
    ('data="robust_dta"', "", "robust_dta", "robust_data"),
    ('model="weak_modle"', "", "weak_modle", "weak_model"),
    ("", "robust_model = robust_mdoel", "robust_mdoel", "robust_model"),
], ids=["model-marker", "data-marker", "other-model", "model-ini"])
def test_a_misspelt_fixture_name_suggests_the_closest_fixture(pytester, marker, ini, wrong, meant):
    from test_plugin import CONFTEST

    pytester.makeconftest(CONFTEST)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(f"""
        import pytest
        from pytest_robust import UniformLinf

        @pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5){', ' + marker if marker else ''})
        def test_named():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*define a fixture named '{wrong}'*or name another one with*; this test sees no "
                                 f"fixture '{wrong}' (did you mean {meant}?)*"])


def test_a_misspelt_fixture_valued_parameter_suggests_the_closest_fixture(pytester):
    pytester.makeconftest(small_net_conftest(40) + """

@pytest.fixture
def fit_images():
    return image_data(n=40, seed=1)
""")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.robust(nppr=0.5, eps=0.1, fit_data="fit_imgaes")
        def test_nppr():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*needs the fit_data: define a fixture named 'fit_imgaes'*this test sees no fixture "
                                 "'fit_imgaes' (did you mean fit_images?)*"])


# -- 7. mapping items read by the keys named with data_keys --------------------------------------------------


@pytest.mark.parametrize("keys", [("img", "klass"), ("pixels", "answer")])
def test_data_keys_name_the_input_and_label_of_mapping_items(keys):
    data = _Mapped(keys)
    by_map = tsrm(SmallNet().eval(), data, perturbation=UniformLinf(eps=0.1), threshold=None, budget=512,
                  data_keys=keys)
    by_pair = tsrm(SmallNet().eval(), (data.x, data.y), perturbation=UniformLinf(eps=0.1), threshold=None, budget=512)
    assert (by_map.estimate, by_map.lower, by_map.upper) == (by_pair.estimate, by_pair.lower, by_pair.upper)


@pytest.mark.parametrize("keys, missing", [(("img", "label"), "'label'"), (("image", "klass"), "'image'"),
                                           (("a", "b"), "'a', 'b'")])
def test_data_keys_that_an_item_lacks_are_named_with_the_fix(keys, missing):
    with pytest.raises(RobustDataError) as err:
        tsrm(SmallNet().eval(), _Mapped(("img", "klass")), perturbation=UniformLinf(eps=0.1), threshold=None,
             budget=512, data_keys=keys)
    text = str(err.value)
    assert f"a mapping with keys ['id', 'img', 'klass'], without {missing} named by data_keys=" in text
    assert "data_keys=(input_key, label_key)" in text and "--robust-data-keys" in text


def test_a_mapping_without_known_keys_points_at_data_keys():
    with pytest.raises(RobustDataError,
                       match=r"name yours with data_keys=\(input_key, label_key\).*--robust-data-keys"):
        tsrm(SmallNet().eval(), _Mapped(("img", "klass")), perturbation=UniformLinf(eps=0.1), threshold=None,
             budget=512)


@pytest.mark.parametrize("value", ["img", "img,klass,id", ("img",), ("img", "img"), ("", "y"), (" ", "y"), 3,
                                   ("img", 2)])
def test_data_keys_that_are_not_a_pair_of_names_are_a_setting_error(value):
    with pytest.raises(SettingError, match=r"data_keys \(on the robust marker\)=.* is invalid: expected a pair of two "
                                           r"different non-empty names \(input_key, label_key\).*'img,klass'"):
        Settings().replace({"data_keys": value}, "on the robust marker")


@pytest.mark.parametrize("value, expected", [("img,klass", ("img", "klass")), (" img , klass ", ("img", "klass")),
                                             (["img", "klass"], ("img", "klass")), ("none", None)])
def test_data_keys_read_as_text_or_a_pair(value, expected):
    assert Settings().replace({"data_keys": value}, "ini option robust_<key>").data_keys == expected


DATA_KEYS_CONFTEST = """
import pytest, torch
from toy_models import SmallNet, image_data

class Mapped(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = image_data(n=40)
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return {"img": self.x[i], "klass": self.y[i]}

@pytest.fixture
def robust_model():
    return SmallNet().eval()

@pytest.fixture
def robust_data():
    return Mapped()
"""

DATA_KEYS_TEST = """
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.01, perturbation=UniformLinf(eps=0.01), budget=512{marker})
def test_mapped():
    pass
"""


@pytest.mark.parametrize("where", ["marker", "ini", "cli", "yaml", "none"])
def test_data_keys_work_on_the_marker_in_ini_on_the_command_line_and_in_yaml(pytester, where):
    pytester.makeconftest(DATA_KEYS_CONFTEST)
    pytester.makepyfile(DATA_KEYS_TEST.format(marker=', data_keys=("img", "klass")' if where == "marker" else ""))
    args = ["-p", "no:cacheprovider"]
    if where == "ini":
        pytester.makeini("[pytest]\nrobust_data_keys = img,klass\n")
    if where == "cli":
        args += ["--robust-data-keys", "img,klass"]
    if where == "yaml":
        pytester.path.joinpath("robust.yaml").write_text("data_keys: [img, klass]\n")
        args += ["--robust-config", "robust.yaml"]
    result = pytester.runpytest(*args)
    if where == "none":
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*a mapping with keys ?'img', 'klass'?*name yours with data_keys=*"])
    else:
        result.assert_outcomes(passed=1)


@pytest.mark.parametrize("how", ["ini", "marker"])
def test_a_bad_data_keys_setting_is_a_usage_error_naming_the_key(pytester, how):
    pytester.makeconftest(DATA_KEYS_CONFTEST)
    pytester.makepyfile(DATA_KEYS_TEST.format(marker=', data_keys="img"' if how == "marker" else ""))
    if how == "ini":
        pytester.makeini("[pytest]\nrobust_data_keys = img\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    where = "ini option robust_data_keys" if how == "ini" else "on the robust marker"
    assert (f"data_keys ({where})='img' is invalid: expected a pair of two different non-empty names (input_key, "
            "label_key)") in result.stdout.str() + result.stderr.str()


# -- 8. a low result states the clean accuracy beside it ------------------------------------------------------


class _ExpectsNormalized(torch.nn.Module):
    """Right on inputs normalized by (x - 0.5) / 0.25: class 1 iff the input's mean is above 0.5.
    Fed pixel data it always says class 1 (every pixel mean is above 0), so it is at chance."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        m = x.flatten(1).mean(1, keepdim=True) * self.w
        return torch.cat([-m, m], dim=1)


def _halves(n=40):
    x = torch.cat([torch.full((n // 2, 1, 4, 4), 0.3), torch.full((n // 2, 1, 4, 4), 0.7)])
    return x, (x.flatten(1).mean(1) > 0.5).long()


def test_a_model_fed_pixels_while_it_expects_normalized_inputs_is_told_so():
    with pytest.warns(RobustWarning, match=r"TSRM: clean accuracy 0.500: the model is near or below chance \(1/2\)"):
        r = tsrm(_ExpectsNormalized(), _halves(), perturbation=UniformLinf(eps=0.01), threshold=0.9)
    assert r.verdict == "fail" and r.details["clean_accuracy"] == 0.5
    assert r.details["evaluations"]["clean"] == 40
    message = r.message()
    assert "; clean accuracy 0.500 on the same inputs: the model is near or below chance (1/2)" in message
    assert "normalize=(mean, std)" in message
    fixed = tsrm(_ExpectsNormalized(), _halves(), perturbation=UniformLinf(eps=0.01), threshold=0.9,
                 normalize=(0.5, 0.25))
    assert (fixed.verdict == "pass" and "clean_accuracy" not in fixed.details
            and "clean" not in fixed.details["evaluations"])


def test_a_failed_accuracy_states_its_clean_accuracy_without_advice_when_the_model_is_fine():
    r = tsrm(ThresholdModel(0.6), threshold_data(32), perturbation=UniformLinf(eps=0.5), threshold=0.9)
    assert r.verdict == "fail" and r.details["clean_accuracy"] == 1.0 and "clean_accuracy_advice" not in r.details
    assert "; clean accuracy 1.000 on the same inputs" in r.message() and r.forward_passes <= r.budget


def test_a_low_estimate_states_its_clean_accuracy():
    r = certified_accuracy(ThresholdModel(0.4), threshold_data(32), radius=0.1, sigma=0.25, max_draws=2000,
                           budget=50_000)
    assert r.verdict == "estimate" and r.upper < 0.5 and r.details["clean_accuracy"] == 0.0
    assert r.details["evaluations"]["clean"] == 32
    assert "; clean accuracy 0.000 on the same inputs: the model is near or below chance (1/2)" in r.message()


def test_a_pass_at_a_low_threshold_spends_nothing_more():
    r = tsrm(ThresholdModel(0.25), threshold_data(32), perturbation=UniformLinf(eps=0.5), threshold=0.2)
    assert r.verdict == "pass" and r.upper < 0.5 and r.details["evaluations"] == {"gate": r.forward_passes}
    assert "clean accuracy" not in r.message()


def test_a_clean_pass_that_does_not_fit_the_budget_is_left_out_and_says_why():
    r = tsrm(ThresholdModel(0.3), threshold_data(32), perturbation=UniformLinf(eps=0.5), threshold=None, budget=512)
    assert r.forward_passes == 512 and "clean_accuracy" not in r.details
    assert "needs 32 model evaluations and the budget has 0 left" in r.details["clean_accuracy_note"]


def test_a_failed_check_through_pytest_shows_the_clean_accuracy(pytester):
    from test_plugin import CONFTEST, FAILING

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(FAILING)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*TSRM 0.* < required 0.9 *; clean accuracy 1.000 on the same inputs*"])


def test_the_clean_accuracy_of_a_constant_model_points_at_the_inputs():
    x, y = image_data(n=30)
    with pytest.warns(RobustWarning, match="near or below chance"):
        r = certified_accuracy(ConstantLogits(), (x, y), radius=0.1, sigma=0.25, max_draws=2000, budget=20_000)
    assert r.details["clean_accuracy"] == 0.0 and "normalize=" in r.details["clean_accuracy_advice"]


# -- warnings point at the user's test, not inside pytest-robust ------------------------------------


def test_a_library_call_s_warnings_point_at_the_calling_line():
    from toy_models import ThresholdModel, threshold_data

    from pytest_robust import GaussianNoise, RobustWarning, tsrm

    with pytest.warns(RobustWarning) as caught:
        tsrm(ThresholdModel(0.5), threshold_data(), perturbation=GaussianNoise(sigma=25), budget=300)
    assert caught and all(w.filename == __file__ for w in caught), [(w.filename, w.lineno) for w in caught]


def test_a_marker_s_warnings_point_at_the_declaring_test(pytester):
    pytester.makeconftest("""
        import pytest, torch

        class Net(torch.nn.Module):
            def forward(self, x):
                return torch.stack([x.flatten(1).sum(1), -x.flatten(1).sum(1)], 1)

        @pytest.fixture
        def robust_model():
            return Net()

        @pytest.fixture
        def robust_data():
            return torch.rand(16, 1, 4, 4), torch.zeros(16, dtype=torch.long)
    """)
    pytester.makepyfile(test_site="""
        import pytest
        from pytest_robust import GaussianNoise


        @pytest.mark.robust(tsrm=0.5, perturbation=GaussianNoise(sigma=25), budget=300, inconclusive="skip")
        def test_huge_noise():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "always::UserWarning")
    out = result.stdout.str()
    assert re.search(r"test_site.py:[5-7]: RobustWarning", out), out  # the marker or the test's def
    assert "pytest_robust" not in out.split("warnings summary")[-1].split("-- Docs")[0], out


# -- an inconclusive check says what would narrow it -------------------------------------------------------------


@pytest.mark.parametrize("spent, advice", [(120, "more inputs, not more budget, would narrow them"),
                                           (5000, "raise it (--robust-budget")])
def test_an_inconclusive_check_without_its_own_reason_names_inputs_or_budget_by_what_ran_out(spent, advice):
    """A custom check that evaluated its 40 inputs with budget left is told that only more inputs
    would narrow it; one whose budget ran out is told to raise the budget."""
    r = Result("mine", 0.5, 0.4, 0.6, 0.5, 0.95, "inconclusive", 40, spent, spent, 1.0, "cpu", 0, "noise", 5000)
    message = r.message()
    assert advice in message
    assert ("every one of its 40 inputs" in message) == (spent < 5000)
