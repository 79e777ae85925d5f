"""batch_size="auto" (``engine.batching``): the probe's choice on a simulated device (a clock that
advances by a modelled cost per pass, so the test is deterministic on any machine), out-of-memory
errors, the setting's values, and "auto" off CUDA (1024, no probe, the same numbers)."""

from __future__ import annotations

import pytest
import torch

import pytest_robust as pr
from pytest_robust.engine import batching
from pytest_robust.errors import SettingError


class Device:
    """A simulated device: a pass over n rows takes ``overhead + n / peak`` seconds on its clock,
    and a batch above ``memory`` rows runs out of memory."""

    def __init__(self, overhead: float, peak: float, memory: int = 10**9):
        self.now, self.overhead, self.peak, self.memory, self.calls = 0.0, overhead, peak, memory, []

    def call(self, batch: torch.Tensor) -> None:
        self.calls.append(len(batch))
        if len(batch) > self.memory:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.now += self.overhead + len(batch) / self.peak

    def probe(self) -> batching.Probe:
        return batching.probe(self.call, lambda n: torch.zeros(n, 3), clock=lambda: self.now)


def test_the_probe_doubles_while_throughput_rises_by_a_tenth_and_takes_the_fastest():
    """Throughput n / (1 + n / 1000) rises 66%, 49%, 33%, 19%, 11%, then 5.7% from 8192 to 16384
    rows: the probe stops there and takes the fastest size it timed."""
    device = Device(overhead=1.0, peak=1000.0)
    found = device.probe()
    sizes = [size for size, _ in found.tried]
    assert sizes == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert found.chosen == 16384
    rates = [rate for _, rate in found.tried]
    assert rates[0] == pytest.approx(256 / 1.256) and rates[-1] == pytest.approx(16384 / 17.384)
    assert found.evaluations == sum(3 * s for s in sizes) == sum(device.calls)


def test_the_probe_stops_when_a_doubling_gains_less_than_a_tenth():
    """A device saturated from 512 rows (overhead negligible): 1024 rows are no faster, so the
    probe stops at 1024 and keeps 512 unless 1024 was faster."""
    device = Device(overhead=1e-6, peak=1000.0)
    found = device.probe()
    assert [s for s, _ in found.tried] == [256, 512]  # 512 gains nothing on 256: stop
    assert found.chosen in (256, 512)


def test_the_probe_backs_off_at_the_first_out_of_memory_error():
    device = Device(overhead=1.0, peak=1000.0, memory=1500)
    found = device.probe()
    assert found.tried[-1] == (2048, 0.0) and found.chosen == 1024
    assert batching.Probe(found.chosen, found.tried, found.evaluations).to_dict()["tried"][-1] == [2048, 0.0]


def test_a_probe_that_fits_nothing_leaves_the_halving_to_the_check_and_other_errors_propagate():
    assert Device(overhead=1.0, peak=1000.0, memory=10).probe().chosen == batching.FIRST

    def broken(batch):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (256x3 and 4x2)")

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        batching.probe(broken, lambda n: torch.zeros(n, 3))


def test_auto_off_cuda_is_1024_without_a_probe_and_changes_no_number():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.rand(200, 4)
    with torch.no_grad():
        y = model(x).argmax(1)
    auto = pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=0.2), budget=3000, batch_size="auto")
    fixed = pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=0.2), budget=3000, batch_size=1024)
    small = pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=0.2), budget=3000, batch_size=100)
    assert auto.details["batch_size"] == 1024 and "batch_size_probe" not in auto.details
    assert (auto.estimate, auto.lower, auto.upper) == (fixed.estimate, fixed.lower, fixed.upper)
    assert small.estimate == pytest.approx(auto.estimate, abs=1e-12) and small.draws == auto.draws


@pytest.mark.parametrize("value, expected", [("auto", "auto"), (" AUTO ", "auto"), (512, 512), ("256", 256)])
def test_the_batch_size_setting_is_a_positive_integer_or_auto(value, expected):
    from pytest_robust.settings.validation import batch_size_value

    assert batch_size_value("batch_size", value) == expected


@pytest.mark.parametrize("value", [0, -3, "big", 1.5, True])
def test_a_wrong_batch_size_names_both_accepted_forms(value):
    model = torch.nn.Linear(4, 3)
    with pytest.raises(SettingError, match=r'batch_size=.* is invalid: expected an integer >= 1, or "auto"'):
        pr.tsrm(model, (torch.rand(8, 4), torch.zeros(8, dtype=torch.long)), perturbation=pr.UniformLinf(eps=0.1),
                budget=100, batch_size=value)


def test_auto_in_ini_and_a_wrong_value_is_a_usage_error(pytester):
    pytester.makeini("[pytest]\nrobust_batch_size = auto\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*batch_size=auto*"])
    pytester.makeini("[pytest]\nrobust_batch_size = lots\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(['*batch_size*lots*an integer >= 1, or "auto"*'])
