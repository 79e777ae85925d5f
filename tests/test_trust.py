"""The fit cache trusts only entries that still hold what was written (issue: stored state that cannot lie)."""

from __future__ import annotations

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
