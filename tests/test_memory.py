"""Memory bounded by the batch size: the Bernoulli stream perturbs large inputs in small blocks
(``bernoulli.block_size``), so no step holds more than a few MiB of perturbed inputs beyond its
batch, and an out-of-memory error while perturbing backs off like one in the model call."""

import numpy as np
import pytest
import torch
from toy_models import SmallNet, image_data

import pytest_robust as pr
from pytest_robust.procedures.bernoulli import BLOCK, BLOCK_BYTES, block_size

BOX = pr.UniformLinf(eps=0.05)
#: The tracemalloc domain numpy reports its arrays' data in (numpy's NPY_TRACE_DOMAIN).
NUMPY_DOMAIN = 389047


def pooled() -> torch.nn.Module:
    """A seeded 3-class classifier of images of any size (average-pooled to 2 x 2 first)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(12, 3)).eval()


class Counting:
    """UniformLinf(eps=0.05) as a callable perturbation that records the rows of every call, and
    raises an out-of-memory error on its ``fail_on``-th call (as CUDA or the host allocator does)."""

    def __init__(self, fail_on: int | None = None):
        self.rows, self.fail_on = [], fail_on

    def __call__(self, x, generator):
        self.rows.append(len(x))
        if len(self.rows) == self.fail_on:
            raise RuntimeError("CUDA out of memory. Tried to allocate 3.00 GiB")
        return BOX(x, generator)

    def __repr__(self):
        return "Counting(UniformLinf(eps=0.05))"


def test_block_size_keeps_a_block_of_perturbed_inputs_within_its_byte_budget():
    assert block_size(torch.zeros(2, 1, 8, 8)) == BLOCK  # small inputs: the usual blocks, numbers unchanged
    assert block_size(torch.zeros(2, 3, 32, 32)) == BLOCK
    assert block_size(torch.zeros(2, 3, 512, 512)) == 4  # 3 MiB each: 4 in 16 MiB
    assert block_size(torch.zeros(2, 3, 4096, 4096)) == 1
    for side in (64, 128, 224, 256, 384, 512):
        x = torch.zeros(1, 3, side, side)
        assert block_size(x) * x[0].numel() * 4 <= max(BLOCK_BYTES, x[0].numel() * 4)


def test_large_images_are_perturbed_a_few_rows_at_a_time_whatever_the_budget():
    """3 x 256 x 256 inputs (768 KiB): before, every call perturbed a block of 256 of them (192 MiB)."""
    x, y = image_data(n=4, size=256)
    counting = Counting()
    r = pr.tsrm(pooled(), (x, y), perturbation=counting, budget=96, batch_size=8)
    assert r.draws == 96 and max(counting.rows) <= 16


def test_numbers_do_not_depend_on_the_batch_size_with_small_blocks():
    x, y = image_data(n=4, size=256)
    a, b = (pr.tsrm(pooled(), (x, y), perturbation=BOX, budget=64, batch_size=n) for n in (4, 64))
    assert (a.estimate, a.lower, a.upper, a.draws) == (b.estimate, b.lower, b.upper, b.draws)


def test_out_of_memory_while_perturbing_halves_the_batch_and_changes_no_number():
    x, y = image_data(n=40)
    plain = pr.tsrm(SmallNet().eval(), (x, y), perturbation=Counting(), budget=3000, batch_size=1024)
    failing = Counting(fail_on=3)
    backed_off = pr.tsrm(SmallNet().eval(), (x, y), perturbation=failing, budget=3000, batch_size=1024)
    assert backed_off.details["oom_halvings"] == 1 and backed_off.details["batch_size"] == 512
    assert (plain.estimate, plain.lower, plain.upper, plain.draws) == pytest.approx(
        (backed_off.estimate, backed_off.lower, backed_off.upper, backed_off.draws), rel=1e-6)


def test_an_error_while_perturbing_that_is_not_out_of_memory_is_not_swallowed():
    class Broken(Counting):
        def __call__(self, x, generator):
            raise RuntimeError("shape mismatch in my perturbation")

    with pytest.raises(RuntimeError, match="shape mismatch in my perturbation"):
        pr.tsrm(SmallNet().eval(), image_data(n=8), perturbation=Broken(), budget=300)


def test_column_grows_by_doubling_and_keeps_what_was_appended():
    from pytest_robust.procedures.columns import INITIAL, Column

    column, rng, expected = Column(np.int64), np.random.default_rng(0), []
    buffers = set()
    for n in rng.integers(0, 700, size=40):
        part = rng.integers(0, 10**9, size=n)
        column.extend(part)
        expected.append(part)
        buffers.add(len(column._buffer))  # capacities only grow: one per buffer (an id could be reused)
    assert column.values.dtype == np.int64 and len(column) == sum(map(len, expected))
    np.testing.assert_array_equal(column.values, np.concatenate(expected))
    assert len(buffers) <= 1 + max(0, len(column) // INITIAL).bit_length()  # doubling: log2 of the growth


def test_a_stream_keeps_no_host_array_per_step():
    """A list of each step's outcome arrays makes one long-lived allocation per step, which glibc
    places in the chunk the step's perturbed inputs just freed, so the heap grew by a batch of
    inputs per step (0.7 to 9.8 GB over 2,048 steps on 3 x 32 x 32 inputs); the outcomes now
    live in one buffer grown by doubling (``procedures.columns``). Counted with tracemalloc, which
    numpy reports its arrays' memory to."""
    import tracemalloc

    from pytest_robust.procedures import bernoulli

    live, original = [], bernoulli._progress

    def counting(run, label, outcomes, drawn, draws):
        live.append(sum(1 for t in tracemalloc.take_snapshot().traces if t.domain == NUMPY_DOMAIN))
        original(run, label, outcomes, drawn, draws)

    x, y = image_data(n=8, size=8)
    tracemalloc.start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bernoulli, "_progress", counting)
            pr.tsrm(pooled(), (x, y), perturbation=BOX, budget=256 * 120, batch_size=256)
    finally:
        tracemalloc.stop()
    assert len(live) == 120
    assert live[-1] - live[10] <= 3  # a per-step list would hold 109 more
