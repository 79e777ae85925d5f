"""Shared test set-up.

torch is imported here, once, on purpose: pytester's in-process runs remove modules first
imported during the run, and re-importing torch's C extension in the same process crashes.
"""

import pytest
import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (imported lazily by torch.optim; same reason)

import pytest_robust.checks.tsrm.check  # noqa: F401  (same reason: keep the core imported once)

# The suite's tensors are small: one thread is faster than two fighting over a shared 2-core
# machine (MCMC loops ran up to 50x slower with two threads under load).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch):
    """Runs under pytester print the robustness table at the width of an 80-column terminal
    unless told otherwise; the table then drops columns (report/terminal.py). Most tests read
    every column, so they get a wide terminal; test_bad_input checks the narrow one."""
    monkeypatch.setenv("COLUMNS", "250")


@pytest.fixture
def pytester(pytester, monkeypatch):
    """pytest's own pytester, with the runs it starts pinned to the CPU on a machine with a GPU.

    The tests' inner runs build their models on the CPU and expect the CPU's numbers; there
    ``--robust-device auto`` would pick CUDA and rightly refuse those models. pytester clears
    PYTEST_ADDOPTS when it starts, so the pin is set after it; an explicit --robust-device in a
    test still wins. The GPU paths are exercised by benchmarks/gpu_smoke.py and the CUDA tests."""
    if torch.cuda.is_available():
        monkeypatch.setenv("PYTEST_ADDOPTS", "--robust-device cpu")
    return pytester
