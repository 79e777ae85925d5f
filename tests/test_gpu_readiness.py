"""What a first GPU user needs, checked on the CPU: half precision, the collective layer with
uneven shares, device semantics, execution settings, host reads in hot loops, torchrun output."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_check_shape import CHECKS, numbers
from test_plugin import CONFTEST, FAILING, PASSING
from test_scale_out import _free_port
from toy_models import ConstantLogits, RecordingModel, SmallNet, image_data

from pytest_robust import (
    UniformLinf,
    adversarial_accuracy,
    certified_accuracy,
    corruption_accuracy,
    execution,
    intermediate_q,
    nppr,
    tsrm,
)
from pytest_robust.engine import collective
from pytest_robust.engine.device import check_model_device, resolve_device
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.host_syncs import count_host_syncs
from pytest_robust.errors import RobustError
from pytest_robust.launch import exit_code
from pytest_robust.results import Result

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_robust"


@pytest.fixture(scope="module")
def float32_runs():
    x, y = image_data(n=40)
    return {name: check(SmallNet().eval(), (x, y)) for name, check in CHECKS.items()}


# -- every check in float16 and bfloat16 ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_check_runs_a_half_precision_model_within_the_float32_bounds(name, dtype, float32_runs):
    """The model runs in its dtype; inputs, iterates and statistics stay float32, so the number
    lands inside the float32 run's bounds (CERTIFY/PREDICT: the same predictions, but for ties)."""
    x, y = image_data(n=40)
    half = CHECKS[name](SmallNet().eval().to(dtype), (x, y))
    full = float32_runs[name]
    if isinstance(half, Result):
        assert full.lower - 1e-9 <= half.estimate <= full.upper + 1e-9, (half.estimate, full.lower, full.upper)
        assert half.precision == str(dtype).removeprefix("torch.")
        assert half.details["dtype"] == "float32" and "dtype_note" not in half.details
        assert np.isfinite([half.lower, half.upper]).all()
    else:
        same = np.mean(np.array(numbers(half)["prediction"]) == np.array(numbers(full)["prediction"]))
        assert same >= 0.9, same


def test_a_bfloat16_pgd_attack_still_moves():
    """Iterates in float32: a step below half a bfloat16 ulp on [0.5, 1) still accumulates, so
    the attack breaks what the float32 attack breaks."""
    x, y = image_data(n=60)
    x = 0.5 + 0.5 * x  # inputs in [0.5, 1), where bfloat16's ulp is 2^-8
    kw = dict(eps=0.05, steps=20, restarts=1)
    full = adversarial_accuracy(SmallNet().eval(), (x, y), threshold=None, **kw)
    low = adversarial_accuracy(SmallNet().eval().bfloat16(), (x, y), threshold=None, **kw)
    clean = tsrm(SmallNet().eval().bfloat16(), (x, y), perturbation=UniformLinf(eps=1e-6), threshold=None, budget=256)
    assert low.estimate < clean.estimate - 0.1  # the attack moved
    assert full.lower - 0.05 <= low.estimate <= full.upper + 0.05


def test_tied_logits_are_errors_reported_with_their_rate_and_a_warning():
    x, y = image_data(n=40)
    with pytest.warns(UserWarning, match=r"100.00% of the model's outputs .* tied top logits"):
        r = tsrm(ConstantLogits(), (x, y), perturbation=UniformLinf(eps=0.1), threshold=None, budget=512)
    assert r.details["tie_rate"] == 1.0 and r.estimate == 0.0
    clean = tsrm(SmallNet().eval(), (x, y), perturbation=UniformLinf(eps=0.1), threshold=None, budget=512)
    assert clean.details["tie_rate"] == 0.0 and not any("tied" in w for w in clean.details.get("warnings", []))


# -- execution settings: precision, determinism, layout, compile --------------------------------------


def test_precision_bf16_runs_the_model_under_autocast_and_says_so():
    x, y = image_data(n=40)
    seen = []

    class Probe(SmallNet):
        def forward(self, x):
            seen.append(torch.is_autocast_enabled("cpu"))
            return super().forward(x)

    plain = tsrm(Probe().eval(), (x, y), perturbation=UniformLinf(eps=0.1), threshold=None, budget=1024)
    assert not any(seen) and plain.precision == "float32" and "model in" not in plain.message()
    seen.clear()
    with execution(precision="bf16"):
        r = tsrm(Probe().eval(), (x, y), perturbation=UniformLinf(eps=0.1), threshold=None, budget=1024)
    assert seen and all(seen)
    assert r.precision == "autocast bfloat16" and "model in autocast bfloat16" in r.message()
    assert r.details["execution"] == {"precision": "bf16", "channels_last": False, "compile": False,
                                      "deterministic": False, "precision_ran": "autocast bfloat16"}
    assert plain.lower - 1e-9 <= r.estimate <= plain.upper + 1e-9
    assert ("robust.precision", "autocast bfloat16") in r.properties()


def test_precision_auto_is_fp32_on_the_cpu_and_bad_values_name_the_key():
    from pytest_robust.engine.precision import autocast_dtype

    assert autocast_dtype("auto", torch.device("cpu")) is None
    with pytest.raises(ValueError, match=r"precision='fp8' is invalid: expected auto or fp32 or bf16 or fp16"):
        with execution(precision="fp8"):
            pass


def test_deterministic_and_channels_last_hold_inside_a_check_and_are_restored():
    x, y = torch.rand(16, 3, 8, 8), torch.randint(3, (16,))
    seen = []

    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 3, 3)

        def forward(self, x):
            seen.append((torch.are_deterministic_algorithms_enabled(),
                         x.is_contiguous(memory_format=torch.channels_last),
                         self.conv.weight.is_contiguous(memory_format=torch.channels_last)))
            return self.conv(x).mean(dim=(2, 3))

    model = Conv().eval()
    plain = tsrm(model, (x, y), perturbation=UniformLinf(eps=0.1), threshold=None, budget=256)
    with execution(deterministic=True, channels_last=True):
        r = tsrm(model, (x, y), perturbation=UniformLinf(eps=0.1), threshold=None, budget=256)
    assert seen[0] == (False, False, False) and seen[-1] == (True, True, True)
    assert not torch.are_deterministic_algorithms_enabled()
    assert model.conv.weight.is_contiguous() and not model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert r.estimate == pytest.approx(plain.estimate, abs=2 / 256)


def test_settings_reach_every_check_from_the_marker_and_the_command_line(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("""
        import pytest
        from pytest_robust import UniformLinf

        @pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5), precision="fp32")
        def test_marker_wins():
            pass

        @pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5))
        def test_command_line():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--robust-precision", "bf16", "--robust-report", "out")
    result.assert_outcomes(passed=2)
    by_test = {r["test_id"].rsplit("::", 1)[-1]: r for r in
               json.loads((pytester.path / "out" / "results.json").read_text())["results"]}
    assert by_test["test_marker_wins"]["precision"] == "float32"
    assert by_test["test_command_line"]["precision"] == "autocast bfloat16"
    bad = pytester.runpytest("-p", "no:cacheprovider", "--robust-precision", "half")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*precision*half*expected auto or fp32 or bf16 or fp16*"])


# -- device semantics ---------------------------------------------------------------------------------


class _OnGpu(torch.nn.Module):
    """A model that reports its parameters on cuda:1 (no GPU needed to ask where it lives)."""

    def parameters(self, recurse=True):
        yield type("P", (), {"device": torch.device("cuda", 1)})()


def test_cuda_means_the_model_s_gpu_or_an_error_naming_both(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("cuda", _OnGpu()) == torch.device("cuda", 1)
    assert resolve_device("cuda", SmallNet()) == torch.device("cuda", 0)
    with pytest.raises(Exception, match=r"parameters are on cuda:1 but the check runs on cuda:0"):
        check_model_device(_OnGpu(), torch.device("cuda", 0))


def test_a_lazy_cache_built_without_gradients_serves_a_later_gradient_pass():
    """Forward passes use no_grad, not inference_mode: a tensor the model caches on its first
    call is an ordinary tensor, usable when a gradient pass follows."""

    class Lazy(SmallNet):
        scale = None

        def forward(self, x):
            if self.scale is None:
                self.scale = torch.full(x.shape[1:], 2.0)
            return super().forward(x * self.scale / 2)

    forward = Forward(Lazy().eval(), batch_size=8)
    x, y = image_data(n=8)
    forward.logits(x)
    values, grad = forward.grad(x, y, lambda z, t: torch.nn.functional.cross_entropy(z, t, reduction="none"))
    assert grad.shape == x.shape and torch.isfinite(grad).all()


def test_a_check_reseeds_no_cuda_generator_and_restores_the_cpu_one(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda s: calls.append(s))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda s: calls.append(s))
    x, y = image_data(n=40)
    data = torch.utils.data.TensorDataset(x, y)  # read under a fixed host RNG
    model = SmallNet().eval()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    calls.clear()
    tsrm(model, data, perturbation=UniformLinf(eps=0.1), threshold=0.5, budget=1024)
    assert calls == [] and torch.equal(torch.get_rng_state(), before)


def test_the_perturbation_probe_sees_the_data_on_the_check_s_device(monkeypatch):
    import pytest_robust.engine.run as run_module

    placed, probed = [], []
    real_place = run_module.place

    def place(ds, device):
        out = real_place(ds, device)
        placed.append(out.x)
        return out

    def probe(perturbation, x, y=None):
        probed.append(x)

    monkeypatch.setattr(run_module, "place", place)
    monkeypatch.setattr("pytest_robust.engine.inspect.perturbation.check_uses_generator", probe)
    tsrm(SmallNet().eval(), image_data(n=40), perturbation=UniformLinf(eps=0.1), threshold=None, budget=256)
    assert probed and probed[0] is placed[0]


# -- the host out of the hot loop -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["tsrm", "corruption_accuracy", "certified_accuracy", "adversarial_accuracy",
                                  "q_hmc", "nppr"])
def test_hot_loops_read_the_host_at_most_twice_per_model_batch(name):
    """Marginal host reads per extra model call (the CPU stand-in of CUDA's sync debug mode):
    a second run with more work adds at most 2 per model call it adds."""
    x, y = image_data(n=40, size=8)
    model = SmallNet(size=8).eval()
    box = UniformLinf(eps=0.1)
    runs = {
        "tsrm": lambda k: tsrm(model, (x, y), perturbation=box, threshold=None, budget=1024 * k, batch_size=256),
        "corruption_accuracy": lambda k: corruption_accuracy(
            model, (x, y), threshold=None, corruptions=["gaussian_noise", "zoom_blur", "contrast", "jpeg_compression"],
            severities=[1, 5], budget=1024 * k, batch_size=256),
        "certified_accuracy": lambda k: certified_accuracy(
            model, (x[:8 * k], y[:8 * k]), threshold=None, radius=0.05, sigma=0.25, max_draws=1000, budget=40_000,
            batch_size=256),
        "adversarial_accuracy": lambda k: adversarial_accuracy(
            model, (x, y), threshold=None, eps=0.02, steps=5 * k, batch_size=256),
        "q_hmc": lambda k: intermediate_q(
            model, (x[:8], y[:8]), perturbation=box, q=10, chains=4, steps=6 * k, warmup=2, pgd_steps=2, budget=40_000,
            batch_size=256),
        "nppr": lambda k: nppr(model, (x, y), eps=0.1, latent_dim=4, components=2, fit_steps=4 * k, fit_batch_size=8,
                               fit_draws=2, draws_per_input=4, budget=8_000 * k, batch_size=256),
    }
    counts = []
    for k in (1, 2):
        with count_host_syncs(model) as count:
            runs[name](k)
        counts.append(count)
    added = counts[1].calls - counts[0].calls
    assert added > 0
    assert (counts[1].syncs - counts[0].syncs) / added <= 2, counts[1].where.most_common(5)


# -- the collective layer ---------------------------------------------------------------------------


def test_no_module_but_the_collective_layer_calls_torch_distributed():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "collective.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "distributed":
                offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any("torch.distributed" in n for n in names) and path.name != "launch.py":
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


@pytest.mark.parametrize("backend, expected", [
    ("gloo", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"), ("nccl", "cuda:1"), ("cuda:nccl", "cuda:1"),
])
def test_collectives_travel_on_the_device_the_group_carries(backend, expected, monkeypatch):
    """A pure NCCL group refuses CPU tensors ("No backend type associated with device type cpu"):
    there the layer sends them on this rank's GPU; any group that carries CPU tensors gets them
    on the CPU."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert collective.carrier(backend) == torch.device(expected)


def test_torchrun_sets_the_rank_s_gpu_before_the_group_starts(monkeypatch):
    events = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: events.append(("set_device", d)))
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(events and events[-1][0] == "init"))
    monkeypatch.setattr(dist, "init_process_group", lambda backend: events.append(("init", backend)))
    collective.join("cuda")
    assert events == [("set_device", 1), ("init", "cpu:gloo,cuda:nccl")]
    events.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    collective.join("cpu")
    assert events == [("init", "gloo")]


def test_more_torchrun_ranks_than_gpus_is_an_error_that_names_both_fixes(monkeypatch):
    """Two ranks on a one-GPU machine (seen on the first GPU run: CUDA's "invalid device ordinal"
    as an INTERNALERROR): NCCL needs a GPU per rank, so the tool says so before the group starts."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: pytest.fail("set_device on a GPU that does not exist"))
    for device in ("cuda", "auto"):
        with pytest.raises(RobustError, match=r"local rank 1 but this machine has 1 GPU.*--nproc-per-node.*"
                                              r"--robust-device cpu"):
            collective.join(device)


def test_launch_exits_with_rank_zero_s_code():
    failure = type("F", (), {})
    first, second = failure(), failure()
    first.exitcode, second.exitcode = 1, 1
    err = type("E", (), {"failures": {0: first, 1: second}})()
    assert exit_code(err) == 1
    second.exitcode = 4
    err.failures = {1: second}
    assert exit_code(err) == 4


def _strict_collectives() -> None:
    """A strict stand-in for NCCL's rules, on gloo: only the collective layer may call
    torch.distributed, and every tensor a collective carries must be on the device the layer
    routes it to (``collective.carrier``); anything else is refused as NCCL would refuse it."""
    for name in ("all_reduce", "all_gather", "all_gather_object", "broadcast", "barrier", "reduce", "gather"):
        original = getattr(dist, name)

        def strict(*args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if not caller.endswith("collective.py"):
                raise RuntimeError(f"{_name} called from {caller}, outside the collective layer")
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tensors += [t for a in args if isinstance(a, list) for t in a if isinstance(t, torch.Tensor)]
            for t in tensors:
                if t.device != collective.carrier():
                    raise RuntimeError(f"No backend type associated with device type {t.device.type}")
            return _original(*args, **kwargs)

        setattr(dist, name, strict)


#: Per-draw checks with budgets that leave some rank an empty share in the last step (blocks of
#: 256 draws; 612 = 2 * 256 + 100 leaves rank 1 nothing in a step of 2 x 2 blocks).
UNEVEN = {
    "tsrm": lambda m, d: tsrm(m, d, perturbation=UniformLinf(eps=0.1), threshold=None, budget=612, batch_size=512),
    "tsrm_gate": lambda m, d: tsrm(m, d, perturbation=UniformLinf(eps=0.1), threshold=0.3, budget=1300, batch_size=512),
    "tsrm_paired": lambda m, d: tsrm(m, d, perturbation=UniformLinf(eps=0.1), reference=SmallNet(seed=1).eval(),
                                     max_drop=0.05, budget=2600, batch_size=512),
    "corruption_accuracy": lambda m, d: corruption_accuracy(
        m, d, threshold=None, corruptions=["gaussian_noise", "brightness", "contrast"], severities=[1, 3, 5],
        budget=612, batch_size=512),
    "nppr": lambda m, d: nppr(m, d, eps=0.1, latent_dim=4, components=2, fit_steps=4, fit_batch_size=8, fit_draws=2,
                              draws_per_input=4, budget=9_300, batch_size=512),
}


def _uneven_rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _strict_collectives()
        torch.set_num_threads(1)
        x, y = image_data(n=64)
        found = {}
        for name, check in UNEVEN.items():
            # rank 1 runs out of memory above 64 rows: the ranks agree on the smaller batch
            model = RecordingModel(SmallNet().eval(), oom_above=64 if rank == 1 else None)
            r = check(model, (x, y))
            found[name] = {k: getattr(r, k) for k in ("estimate", "lower", "upper", "verdict", "draws")}
            found[name]["batch_size"] = r.details["batch_size"]
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(found, f)
    finally:
        dist.destroy_process_group()
    os._exit(0)  # see test_check_shape._sharded_rank


def test_per_draw_checks_with_uneven_tails_and_an_oom_on_one_rank_reach_single_process_numbers(tmp_path):
    x, y = image_data(n=64)
    single = {name: check(SmallNet().eval(), (x, y)) for name, check in UNEVEN.items()}
    mp.spawn(_uneven_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for name, r in single.items():
        expected = {k: getattr(r, k) for k in ("estimate", "lower", "upper", "verdict", "draws")}
        for got in ranks:
            batch = got[name].pop("batch_size")
            assert got[name] == expected, name
            assert batch <= 64, (name, batch)  # halved on both ranks, not only on rank 1


# -- torchrun output --------------------------------------------------------------------------------


def test_a_failing_sharded_run_exits_with_pytest_s_code_and_rank_zero_alone_prints(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_pass=PASSING, test_fail=FAILING)
    result = pytester.run(
        sys.executable, "-m", "pytest_robust.launch", "--standalone", "--nproc_per_node=2",
        "-m", "pytest", "-p", "no:cacheprovider", "--robust-report", "out", timeout=300,
    )
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, text
    assert "ChildFailedError" not in text and "Traceback" not in text
    assert text.count("robustness checks") == 1 and text.count("robust report: out/results.json") == 1
    assert json.loads((pytester.path / "out" / "results.json").read_text())["results"]


@pytest.mark.parametrize("name", ["certified_accuracy", "certify", "predict", "pa_report"])
def test_a_certificate_from_reduced_precision_carries_a_warning(name):
    x, y = image_data(n=40)
    with pytest.warns(UserWarning, match="certificate was computed from model outputs in bfloat16"):
        out = CHECKS[name](SmallNet().eval().bfloat16(), (x, y))
    if isinstance(out, Result):
        assert "floating-point effects" in out.details["certificate_warning"]
        assert any("floating-point effects" in w for w in out.details["warnings"])
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*certificate")
        CHECKS[name](SmallNet().eval(), (x, y))  # float32: no certificate warning (the random net is near chance)


def test_compile_runs_the_model_compiled_and_falls_back_with_a_warning_where_it_cannot(monkeypatch):
    """``compile=True`` calls the model through torch.compile (here with dynamo's eager backend, no
    C++ build) with the same numbers; where a compiled call fails, the model runs as it is with a
    RobustWarning naming the error, and the numbers stay the same."""
    from pytest_robust import execution
    from pytest_robust.errors import RobustWarning

    real = torch.compile
    calls = []

    def eager_backend(model, **kwargs):
        compiled = real(model, backend="eager", **kwargs)
        return lambda *a, **k: (calls.append(1), compiled(*a, **k))[1]

    model, data = SmallNet().eval(), image_data(n=40)
    plain = tsrm(model, data, perturbation=UniformLinf(eps=0.1), budget=512, batch_size=256)
    monkeypatch.setattr(torch, "compile", eager_backend)
    with execution(compile=True):
        fast = tsrm(model, data, perturbation=UniformLinf(eps=0.1), budget=512, batch_size=256)
    assert calls and (fast.estimate, fast.draws) == (plain.estimate, plain.draws)

    def failing(model, **kwargs):
        def call(*args, **k):
            raise RuntimeError("backend 'inductor' failed: no C++ compiler")
        return call

    monkeypatch.setattr(torch, "compile", failing)
    with execution(compile=True), pytest.warns(RobustWarning, match="torch.compile could not run the model"):
        fallen = tsrm(model, data, perturbation=UniformLinf(eps=0.1), budget=512, batch_size=256)
    assert (fallen.estimate, fallen.draws) == (plain.estimate, plain.draws)
