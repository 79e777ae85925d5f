"""Scale-out: a GPU per xdist worker, torch.distributed sharding with identical verdicts, progress."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from test_plugin import CONFTEST, PASSING
from toy_models import ThresholdModel, threshold_data

from pytest_robust import UniformLinf, tsrm
from pytest_robust.report import progress

SPEC = dict(threshold=0.84, seed=4, batch_size=300, budget=20_000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The paired form: a model with a lower threshold against the 0.875 one (a drop of about 0.075) at a
#: margin of 0.05, which the gate fails after 950 draws: several steps of 300 draws in 256-draw
#: blocks, split unevenly between the ranks.
PAIRED = dict(seed=4, batch_size=300, budget=20_000, max_drop=0.05)


def _check(paired: bool):
    if paired:
        return tsrm(ThresholdModel(0.8), threshold_data(), perturbation=UniformLinf(eps=0.5),
                    reference=ThresholdModel(0.875), **PAIRED)
    return tsrm(ThresholdModel(0.875), threshold_data(), perturbation=UniformLinf(eps=0.5), **SPEC)


def _rank(rank: int, world: int, port: int, out: str, paired: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(_check(paired).to_dict(), f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("paired", [False, True])
def test_two_gloo_ranks_reach_the_single_process_verdict(tmp_path, paired):
    """Two ranks, each evaluating its share of every step's blocks (uneven when a step's blocks do
    not divide evenly), give the single process's numbers; the paired form gathers both models'
    outcomes in the same table."""
    single = _check(paired)
    mp.spawn(_rank, args=(2, _free_port(), str(tmp_path), paired), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        for key in ("verdict", "draws", "estimate", "lower", "upper"):
            assert r[key] == getattr(single, key), key
        counts = "paired" if paired else "correct"
        assert r["details"][counts] == single.details[counts]
    assert ranks[0]["forward_passes"] == ranks[1]["forward_passes"] >= single.draws


EVERY_CHECK = PASSING + """
from toy_models import SmallNet, image_data

@pytest.fixture(scope="session")
def images():
    return image_data(n=64)

@pytest.fixture(scope="session")
def net():
    return SmallNet().eval()

@pytest.mark.robust(q=10, max_loss=50.0, perturbation=UniformLinf(eps=0.1), steps=6, warmup=2, pgd_steps=3,
                    model="net", data="images", budget=20_000, inconclusive="skip")
def test_q():
    pass

@pytest.mark.robust(certified_accuracy=0.05, radius=0.05, sigma=0.25, max_draws=3000, model="net", data="images",
                    budget=40_000, inconclusive="skip")
def test_certified():
    pass

@pytest.mark.robust(adversarial_accuracy=0.05, eps=0.1, steps=4, targets=1, square_queries=20, model="net",
                    data="images", inconclusive="skip")
def test_adversarial():
    pass

@pytest.mark.robust(nppr=0.05, eps=0.1, latent_dim=4, components=2, fit_steps=4, fit_batch_size=8, fit_draws=2,
                    draws_per_input=4, model="net", data="images", budget=30_000, inconclusive="skip")
def test_nppr():
    pass
"""


def test_torchrun_runs_every_check_sharded_with_one_writer(pytester):
    """A real torch.distributed.run of pytest with 2 ranks: every check reaches the numbers of a
    single process, each rank evaluates about half of the work, and only rank 0 writes."""
    pytester.makeconftest(CONFTEST + "\nimport sys\nsys.path.insert(0, %r)\n" % str(Path(__file__).parent))
    pytester.makepyfile(EVERY_CHECK)
    result = pytester.run(
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "pytest", "-p", "no:cacheprovider", "--robust-report", "out", "--junitxml", "j.xml",
        timeout=300,
    )
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    sharded = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "single")
    alone = json.loads((pytester.path / "single" / "results.json").read_text())["results"]
    assert [r["metric"] for r in sharded] == [r["metric"] for r in alone] == [
        "tsrm", "q", "certified_accuracy", "adversarial_accuracy", "nppr"]
    for check, base in zip(sharded, alone):
        assert (check["verdict"], check["draws"], check["estimate"], check["upper"]) == \
            (base["verdict"], base["draws"], base["estimate"], base["upper"]), check["metric"]
        per_rank = check["details"]["evaluations_per_rank"]
        assert len(per_rank) == 2 and sum(per_rank) == check["forward_passes"] <= check["budget"]
        assert min(per_rank) >= 0.3 * sum(per_rank), (check["metric"], per_rank)
    assert (pytester.path / "j.xml").is_file()
    assert result.stdout.str().count("robust report: out/results.json") == 1


def test_each_xdist_worker_takes_its_own_gpu_from_the_visible_list(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    pytester.makepyfile("""
        import os

        def test_where(tmp_path_factory):
            worker = os.environ["PYTEST_XDIST_WORKER"]
            path = tmp_path_factory.getbasetemp().parent.parent / f"{worker}.txt"
            path.write_text(os.environ["CUDA_VISIBLE_DEVICES"])
    """)
    pytester.runpytest_subprocess("-n", "2", "--dist", "each", "--robust-device", "auto").assert_outcomes(passed=2)
    seen = {p.stem: p.read_text() for p in pytester.path.parent.rglob("gw*.txt")}
    assert seen == {"gw0": "3", "gw1": "5"}


def test_cpu_device_leaves_cuda_visible_devices_alone(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    pytester.makepyfile("""
        import os

        def test_where():
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"
    """)
    pytester.runpytest_subprocess("-n", "2", "--dist", "each", "--robust-device", "cpu").assert_outcomes(passed=2)


@pytest.fixture
def fast_progress(monkeypatch):
    monkeypatch.setattr(progress, "FIRST_AFTER", 0.0)
    monkeypatch.setattr(progress, "INTERVAL_PLAIN", 0.0)


def test_progress_lines_when_output_is_not_captured(pytester, fast_progress):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    result = pytester.runpytest("-s", "--robust-batch-size", "256")
    result.stdout.fnmatch_lines(["robust progress test_progress_lines_when_output_is_not_captured.py::test_passes: "
                                 "TSRM 256/100000 draws, ~* s left if it spends the budget, 256 forward passes, "
                                 "bounds [[]0.*, *]*"])


def test_progress_lines_without_s_through_the_terminal_reporter(pytester, fast_progress):
    """Output captured (no -s): the lines still reach the terminal, with the time left."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    result = pytester.runpytest("--robust-batch-size", "256")
    result.stdout.fnmatch_lines(["robust progress *::test_passes: TSRM 256/100000 draws, "
                                 "~* s left if it spends the budget, 256 forward passes, bounds [[]0.*, *]*"])


def test_two_launchers_on_one_machine_act_as_two_nodes_with_one_writer(pytester):
    """``pytest_robust.launch --nnodes 2 --node-rank 0/1`` started twice (as on two machines, here on
    one): the ranks meet at the rendezvous, reach the single process's numbers, and only global
    rank 0 (node 0) writes the reports."""
    pytester.makeconftest(CONFTEST + "\nimport sys\nsys.path.insert(0, %r)\n" % str(Path(__file__).parent))
    pytester.makepyfile(PASSING)
    port = _free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "pytest_robust.launch", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
         "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "pytest", "-p", "no:cacheprovider",
         "--robust-report", f"node{node}"], cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True) for node in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    sharded = json.loads((pytester.path / "node0" / "results.json").read_text())["results"]
    assert not (pytester.path / "node1" / "results.json").exists()
    pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "single")
    alone = json.loads((pytester.path / "single" / "results.json").read_text())["results"]
    for check, base in zip(sharded, alone, strict=True):
        assert (check["verdict"], check["draws"], check["estimate"], check["upper"]) == \
            (base["verdict"], base["draws"], base["estimate"], base["upper"]), check["metric"]
        assert len(check["details"]["evaluations_per_rank"]) == 2
