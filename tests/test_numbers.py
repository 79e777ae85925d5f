"""No number changes: every check's verdict, estimate, bounds, draws and model evaluations on fixed
inputs equal the stored snapshot (tests/data/numbers.json, written by tests/numbers_snapshot.py
before the code was reorganised). A change here must come with a commit naming the defect fix."""

import json

import pytest

from numbers_snapshot import SNAPSHOT, numbers


@pytest.fixture(scope="module")
def now():
    return numbers()


@pytest.mark.parametrize("case", sorted(json.loads(SNAPSHOT.read_text())))
def test_every_number_equals_the_snapshot(now, case):
    assert now[case] == json.loads(SNAPSHOT.read_text())[case]
