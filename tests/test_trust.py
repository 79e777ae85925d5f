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
