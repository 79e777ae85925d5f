"""Trust: stored state that cannot lie (fit-cache checksums, perturbation identities without memory
addresses) and names a new user gets wrong."""

from __future__ import annotations

import pytest
import torch

from pytest_robust import cache


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
    assert " at 0x" not in text and text.startswith("_Shift(amount=0.1, bounds=(0.0, 1.0), table=tensor(float32, (3,), ")
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
    ok = dict(r, perturbation=repr(_Shift(0.1)))
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
        tsrm(SmallNet().eval(), _Mapped(("img", "klass")), perturbation=UniformLinf(eps=0.1), threshold=None, budget=512)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_loader_that_drops_its_last_batch_is_read_whole(shuffle):
    from pytest_robust.engine import load_data

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
    result.stdout.fnmatch_lines(["*robust baseline comparison skipped: baseline *base.json*delete it or save a new one*"])
    assert (pytester.path / "out" / "results.json").is_file() and (pytester.path / "metric.xml").is_file()
    failing = pytester.runpytest("-p", "no:cacheprovider", "--robust-compare-fail", "--robust-compare", "base",
                                 "--robust-report", "out2")
    assert failing.ret == pytest.ExitCode.USAGE_ERROR and (pytester.path / "out2" / "results.json").is_file()
