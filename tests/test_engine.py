"""pytest_robust.engine through tsrm(): determinism, state restoration, OOM back-off, clear errors."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from toy_models import (
    FULL_BOX,
    BadLogitsModel,
    BufferMutatingModel,
    ClassCountChangingModel,
    ConstantLogits,
    DataAttrMutatingModel,
    GlobalRngModel,
    ParamMutatingModel,
    RecordingModel,
    SmallNet,
    ThresholdModel,
    image_data,
    probe_evaluations,
    threshold_data,
)

from pytest_robust.checks.tsrm.check import tsrm
from pytest_robust.engine.data import TensorData, load_data
from pytest_robust.engine.device import resolve_device
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.guard import guarded
from pytest_robust.engine.ranking import correct_predictions
from pytest_robust.engine.streams import stream_generator
from pytest_robust.errors import RobustDataError, RobustModelError, RobustWarning, SettingError
from pytest_robust.perturbations import UniformLinf

NOISE = UniformLinf(eps=0.1)


def eval_net(seed: int = 0) -> SmallNet:
    return SmallNet(seed=seed).eval()


def summary(result):
    """Everything in a result that must not depend on how the work was batched."""
    d = result.details
    return (
        result.estimate,
        result.lower,
        result.upper,
        result.verdict,
        result.draws,
        result.n_inputs,
        d["correct"],
        d["cp_lower"],
        d["cp_upper"],
        d["inputs_seen"],
    )


# ---------------------------------------------------------------------------------------------
# determinism
# ---------------------------------------------------------------------------------------------


def test_estimate_mode_does_not_depend_on_batch_size():
    data = image_data()
    results, rows = [], []
    for batch_size in (1, 7, 256, 1000):
        model = RecordingModel(eval_net())
        r = tsrm(model, data, perturbation=NOISE, budget=1000, seed=3, batch_size=batch_size)
        results.append(r)
        rows.append(model.seen())
        assert r.verdict == "estimate"
        assert r.draws == r.forward_passes == 1000
        assert max(model.batch_sizes) == min(batch_size, 1000)
        assert r.details["batch_size"] == batch_size
    assert 0.05 < results[0].estimate < 0.95  # a non-trivial stream
    for r, x in zip(results[1:], rows[1:]):
        assert summary(r) == summary(results[0])
        assert torch.equal(x, rows[0])  # the very same perturbed inputs, in the same order


@pytest.mark.parametrize("threshold,verdict", [(0.2, "pass"), (0.7, "fail")])
def test_gate_mode_does_not_depend_on_batch_size(threshold, verdict):
    data = image_data()
    results, rows = [], []
    for batch_size in (1, 7, 256, 1000):
        model = RecordingModel(eval_net())
        r = tsrm(model, data, perturbation=NOISE, threshold=threshold, budget=20_000, seed=4, batch_size=batch_size)
        results.append(r)
        rows.append(model.seen()[: r.draws])
        assert r.verdict == verdict
        assert r.draws <= r.forward_passes <= r.draws + max(batch_size, 256) + 255
    for r, x in zip(results[1:], rows[1:]):
        assert summary(r) == summary(results[0])
        assert torch.equal(x, rows[0])


def test_same_seed_reproduces_and_other_seed_differs():
    data = image_data()
    runs = {}
    for seed in (5, 5, 6):
        model = RecordingModel(eval_net())
        r = tsrm(model, data, perturbation=NOISE, budget=2000, seed=seed)
        runs.setdefault(seed, []).append((summary(r), model.seen()))
    (s1, x1), (s2, x2) = runs[5]
    (s3, x3) = runs[6][0]
    assert s1 == s2 and torch.equal(x1, x2)
    assert not torch.equal(x1, x3)
    assert s1[:3] != s3[:3]  # estimate and bounds differ between these two seeds


def test_results_do_not_depend_on_global_rng_or_previous_checks():
    data = image_data()
    torch.manual_seed(0)
    first = tsrm(eval_net(), data, perturbation=NOISE, budget=1000, seed=1)
    torch.manual_seed(999)
    torch.rand(1234)
    tsrm(eval_net(), data, perturbation=NOISE, budget=500, seed=2)  # an unrelated check in between
    second = tsrm(eval_net(), data, perturbation=NOISE, budget=1000, seed=1)
    assert summary(first) == summary(second)


def test_stream_generator_is_stable_and_keyed():
    a = torch.rand(5, generator=stream_generator(7, "tsrm-noise", 3))
    b = torch.rand(5, generator=stream_generator(7, "tsrm-noise", 3))
    assert torch.equal(a, b)
    for other in (stream_generator(8, "tsrm-noise", 3), stream_generator(7, "tsrm-noise", 4),
                  stream_generator(7, "tsrm-index", 3)):
        assert not torch.equal(a, torch.rand(5, generator=other))


# ---------------------------------------------------------------------------------------------
# the model's state is restored
# ---------------------------------------------------------------------------------------------


class Spy(torch.nn.Module):
    """Records, during each forward pass, the mode, grad mode and requires_grad it runs under."""

    def __init__(self):
        super().__init__()
        self.net = SmallNet()
        self.seen = []

    def forward(self, x):
        self.seen.append(
            (
                [m.training for m in self.modules()],
                torch.is_grad_enabled(),
                [p.requires_grad for p in self.parameters()],
            )
        )
        return self.net(x)


def _snapshot(model):
    return (
        [m.training for m in model.modules()],
        [p.requires_grad for p in model.parameters()],
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        [id(p) for p in model.parameters()],
    )


def _assert_same_state(model, before):
    modes, flags, state, ids = before
    assert [m.training for m in model.modules()] == modes
    assert [p.requires_grad for p in model.parameters()] == flags
    after = model.state_dict()
    assert after.keys() == state.keys()
    for k in state:
        assert torch.equal(after[k], state[k]), k
    assert [id(p) for p in model.parameters()] == ids
    assert all(p.grad is None for p in model.parameters())


def test_training_mode_flags_parameters_and_rng_are_restored():
    model = Spy()
    model.train()
    model.net.drop.eval()  # a mixed state: the exact per-module flags must come back
    model.net.fc.bias.requires_grad_(False)
    before = _snapshot(model)
    torch.manual_seed(2024)
    rng = torch.get_rng_state()
    with pytest.warns(RobustWarning, match="training mode with BatchNorm1d layers"):
        r = tsrm(model, image_data(), perturbation=NOISE, budget=600, seed=0)
    assert r.details["model_was_training"] is True
    _assert_same_state(model, before)
    assert torch.equal(torch.get_rng_state(), rng)
    # during the check: eval mode everywhere, no autograd, no parameter requires grad
    assert model.seen and all(
        not any(modes) and not grad and not any(flags) for modes, grad, flags in model.seen
    )


def test_eval_mode_model_gives_no_warning():
    model = eval_net()
    before = _snapshot(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = tsrm(model, image_data(), perturbation=NOISE, budget=300)
    assert r.details["model_was_training"] is False
    _assert_same_state(model, before)


def test_global_rng_used_by_the_model_is_restored():
    model = GlobalRngModel(0.5)
    x, y = threshold_data()
    # the model does consume the global RNG ...
    state = torch.get_rng_state()
    model(x)
    assert not torch.equal(torch.get_rng_state(), state)
    # ... but a check leaves it where it was
    state = torch.get_rng_state()
    tsrm(model.eval(), (x, y), perturbation=FULL_BOX, budget=1000)
    assert torch.equal(torch.get_rng_state(), state)


class DropoutThenNaN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.1)
        self.bad = BadLogitsModel("nan")

    def forward(self, x):
        return self.bad(self.drop(x))


def test_state_is_restored_when_the_check_raises():
    model = DropoutThenNaN().train()
    model.bad.eval()  # mixed modes again
    before = _snapshot(model)
    state = torch.get_rng_state()
    with pytest.warns(RobustWarning, match="with Dropout layers"), pytest.raises(RobustModelError, match="NaN"):
        tsrm(model, threshold_data(), perturbation=FULL_BOX, budget=100)
    _assert_same_state(model, before)
    assert torch.equal(torch.get_rng_state(), state)


def test_guarded_yields_info_and_restores():
    model = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)).train()
    with pytest.warns(RobustWarning, match="with BatchNorm1d layers"):
        with guarded(model, torch.device("cpu")) as info:
            assert info == {"model_was_training": True}
            assert not any(m.training for m in model.modules())
            assert not any(p.requires_grad for p in model.parameters())
    assert all(m.training for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())


def test_training_mode_without_mode_dependent_layers_is_silent_but_restored():
    """Training mode only matters for dropout/normalization layers: no warning otherwise."""
    model = ThresholdModel(0.5).train()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        r = tsrm(model, threshold_data(), perturbation=FULL_BOX, budget=100)
    assert not [w for w in said if "training mode" in str(w.message)]
    assert r.details["model_was_training"] is False
    assert model.training and model.bias.requires_grad


@pytest.mark.parametrize(
    "model,name", [(BufferMutatingModel(), "calls"), (ParamMutatingModel(0.5), "bias")]
)
def test_in_place_modification_is_detected(model, name):
    model.eval()
    with pytest.raises(RobustModelError, match=rf"the model modified {name} in place during evaluation"):
        tsrm(model, threshold_data(), perturbation=FULL_BOX, budget=100)
    assert not model.training


def test_in_place_modification_through_data_is_detected():
    model = DataAttrMutatingModel(0.5).eval()
    with pytest.raises(RobustModelError, match="modified bias in place"):
        tsrm(model, threshold_data(), perturbation=FULL_BOX, budget=100)


# ---------------------------------------------------------------------------------------------
# out of memory: halve the batch, lose and repeat nothing
# ---------------------------------------------------------------------------------------------


def _oom_pair(k, batch_size, **kwargs):
    data = image_data()
    failing = RecordingModel(eval_net(), oom_above=k)
    plain = RecordingModel(eval_net())
    r_oom = tsrm(failing, data, perturbation=NOISE, batch_size=batch_size, seed=9, **kwargs)
    r_ref = tsrm(plain, data, perturbation=NOISE, batch_size=k, seed=9, **kwargs)
    return failing, r_oom, plain, r_ref


def test_oom_halves_batch_estimate_mode():
    failing, r_oom, plain, r_ref = _oom_pair(k=100, batch_size=1000, budget=3000)
    # 1000 -> 500 -> 250 -> 125 -> 62
    assert r_oom.details["oom_halvings"] == 4
    assert r_oom.details["batch_size"] == 62
    assert failing.oom_raised == 4
    assert max(failing.batch_sizes) <= 100
    assert r_ref.details["oom_halvings"] == 0
    assert summary(r_oom) == summary(r_ref)
    assert r_oom.forward_passes == r_ref.forward_passes == r_oom.draws == 3000
    # every draw evaluated exactly once, in order
    assert sum(failing.batch_sizes) == 3000 + probe_evaluations(r_oom)
    assert torch.equal(failing.seen(r_oom), plain.seen(r_ref))


def test_oom_halves_batch_gate_mode():
    failing, r_oom, plain, r_ref = _oom_pair(k=50, batch_size=256, threshold=0.2, budget=20_000)
    assert r_oom.details["oom_halvings"] == 3  # 256 -> 128 -> 64 -> 32
    assert r_oom.details["batch_size"] == 32
    assert r_oom.verdict == "pass"
    assert summary(r_oom) == summary(r_ref)
    assert r_oom.forward_passes == r_ref.forward_passes == sum(failing.batch_sizes) - probe_evaluations(r_oom)
    assert torch.equal(failing.seen(r_oom), plain.seen(r_ref))


def test_oom_as_runtime_error_message_is_also_handled():
    class OldStyleOOM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = ThresholdModel(0.5)

        def forward(self, x):
            if len(x) > 10:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return self.inner(x)

    r = tsrm(OldStyleOOM(), threshold_data(), perturbation=FULL_BOX, budget=500, batch_size=40)
    assert r.details["oom_halvings"] == 2 and r.details["batch_size"] == 10
    ref = tsrm(ThresholdModel(0.5), threshold_data(), perturbation=FULL_BOX, budget=500, batch_size=10)
    assert summary(r) == summary(ref)


def test_oom_at_batch_size_one_is_a_clear_error():
    model = RecordingModel(eval_net(), oom_above=0)
    with pytest.raises(RobustModelError, match="out of memory even with batch size 1") as info:
        tsrm(model, image_data(), perturbation=NOISE, budget=100, batch_size=8)
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)
    assert model.oom_raised == 4  # 8, 4, 2, 1


def test_other_runtime_errors_propagate_unchanged():
    class Boom(ThresholdModel):
        def forward(self, x):
            raise RuntimeError("boom: shape mismatch")

    with pytest.raises(RuntimeError, match="boom") as info:
        tsrm(Boom(0.5), threshold_data(), perturbation=FULL_BOX, budget=100)
    assert type(info.value) is RuntimeError


# ---------------------------------------------------------------------------------------------
# malformed model output
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,message",
    [
        ("nan", "returned NaN or infinite logits"),
        ("inf", "returned NaN or infinite logits"),
        ("neg_inf", "returned NaN or infinite logits"),
        ("wrong_batch", r"for a batch of 100 it returned shape \(101, 2\)"),
        ("3d", r"or one logit per input \(\(batch,\) or \(batch, 1\): a binary classifier, read as \[0, z\]\); "
               r"for a batch of 100 it returned shape \(100, 2, 1\)"),  # (batch,), (batch, 1): test_binary_models
        ("tuple", "must return logits .*it returned a tuple of"),
        ("numpy", "must return logits .*it returned a ndarray: it has no .logits attribute"),
    ],
)
def test_malformed_logits_raise_model_error(kind, message):
    with pytest.raises(RobustModelError, match=message):
        tsrm(BadLogitsModel(kind), threshold_data(), perturbation=FULL_BOX, budget=100, batch_size=100)


def test_changing_number_of_classes_is_an_error():
    forward = Forward(ClassCountChangingModel(), batch_size=4)
    with pytest.raises(RobustModelError, match="returned 3 classes, earlier 2"):
        forward.logits(torch.zeros(7, 1))  # chunks of 4 (2 classes) then 3 (3 classes)


def test_forward_counts_and_chunks():
    model = RecordingModel(ThresholdModel(0.5))
    forward = Forward(model, batch_size=3)
    x = torch.rand(10, 1, generator=torch.Generator().manual_seed(0))
    z = forward.logits(x)
    assert z.shape == (10, 2) and forward.passes == 10 and forward.n_classes == 2
    assert model.batch_sizes == [3, 3, 3, 1]
    assert torch.equal(z, ThresholdModel(0.5)(x).detach())


# ---------------------------------------------------------------------------------------------
# labels and ties
# ---------------------------------------------------------------------------------------------


def test_labels_out_of_range_raise_data_error():
    x, _ = threshold_data()
    y = torch.full((len(x),), 2)
    with pytest.raises(RobustDataError, match="label 2 is out of range for a model with 2 classes"):
        tsrm(ThresholdModel(0.5), (x, y), perturbation=FULL_BOX, budget=100)


def _undrawn_index(n, budget, seed):
    drawn = torch.randint(n, (256,), generator=stream_generator(seed, "tsrm-index", 0))[:budget]
    return next(i for i in range(n) if i not in set(drawn.tolist()))


def test_label_out_of_range_is_detected_even_if_never_drawn():
    x, y = threshold_data(200)
    y = y.clone()
    y[_undrawn_index(200, 10, seed=0)] = 5  # a 2-class model: label 5 is invalid
    with pytest.raises(RobustDataError, match="out of range"):
        tsrm(ThresholdModel(0.5), (x, y), perturbation=FULL_BOX, budget=10, seed=0)


def test_ties_count_as_errors():
    x, _ = threshold_data()
    for label in (0, 1, 2):
        y = torch.full((len(x),), label)
        r = tsrm(ConstantLogits(3), (x, y), perturbation=FULL_BOX, budget=500)
        assert r.estimate == 0.0 and r.details["correct"] == 0 and r.upper < 0.02
    r = tsrm(ConstantLogits(3), (x, torch.zeros(len(x), dtype=torch.long)), perturbation=FULL_BOX, threshold=0.5)
    assert r.verdict == "fail" and r.estimate == 0.0


def test_correct_predictions_strictly_largest():
    logits = torch.tensor([[2.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 3.0], [-1.0, -2.0, -1.0]])
    y = torch.tensor([0, 0, 1, 2, 2])
    assert correct_predictions(logits, y).tolist() == [True, False, False, True, False]


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def test_data_forms_are_equivalent():
    x, y = image_data(n=23)
    forms = {
        "tuple": (x, y),
        "list": [x, y],
        "numpy": (x.numpy(), y.numpy()),
        "dataset": TensorDataset(x, y),
        "loader": DataLoader(TensorDataset(x, y), batch_size=5, shuffle=False),
        "tensordata": TensorData(x, y),
    }
    loaded = {k: load_data(v) for k, v in forms.items()}
    for k, ds in loaded.items():
        assert torch.equal(ds.x, x), k
        assert torch.equal(ds.y, y), k
        assert ds.y.dtype == torch.long and len(ds) == 23
    results = {k: summary(tsrm(eval_net(), v, perturbation=NOISE, budget=700, seed=2)) for k, v in forms.items()}
    assert len(set(results.values())) == 1


def test_small_integer_labels_are_accepted():
    x, y = image_data(n=10)
    assert load_data((x, y.to(torch.uint8))).y.dtype == torch.long


@pytest.mark.parametrize(
    "data,message",
    [
        ((torch.rand(10, 2), torch.arange(10) - 1), "labels must be >= 0, got minimum -1"),
        ((torch.rand(10, 2), torch.zeros(10)), "labels must be integer class indices, got dtype torch.float32"),
        ((torch.rand(10, 2), torch.zeros(10, dtype=torch.bool)),
         "labels must be integer class indices, got dtype torch.bool"),
        ((torch.zeros(10, 2, dtype=torch.uint8), torch.zeros(10, dtype=torch.long)),
         r"inputs must be floating point for this check and perturbation \(got torch.uint8\)"),
        ((torch.zeros(10, 2, dtype=torch.long), torch.zeros(10, dtype=torch.long)),
         r"inputs must be floating point for this check and perturbation \(got torch.int64\)"),
        ((torch.rand(0, 2), torch.zeros(0, dtype=torch.long)), "the data is empty: x has no rows"),
        (TensorDataset(torch.rand(0, 2), torch.zeros(0, dtype=torch.long)),
         "the data is empty: the dataset or loader yielded no items"),
        ((torch.rand(10, 2), torch.zeros(9, dtype=torch.long)),
         r"labels must have shape \(n,\) with n = len\(x\) = 10, got \(9,\)"),
        ((torch.rand(10, 2), torch.zeros(10, 1, dtype=torch.long)), r"got \(10, 1\)"),
        (TensorDataset(torch.rand(5, 2)), "each data item must be an \\(input, label\\) pair or a mapping, got tuple"),
        ({"x": torch.rand(3, 1), "y": torch.zeros(3)}, "data must be an \\(x, y\\) pair.*got dict"),
        ("digits", "got str"),
        ((torch.rand(3, 1), torch.zeros(3, dtype=torch.long), torch.zeros(3)), "got tuple"),
        ([(torch.rand(1), 0), (torch.rand(1), 1), (torch.rand(1), 0)], "got list"),
        (None, "got NoneType"),
    ],
)
def test_bad_data_raises_data_error(data, message):
    with pytest.raises(RobustDataError, match=message):
        load_data(data)
    model = ThresholdModel(0.5).train()
    with pytest.raises(RobustDataError, match=message):
        tsrm(model, data, perturbation=FULL_BOX, budget=10)
    assert model.training  # raised before the model was touched


# ---------------------------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------------------------


def test_model_on_another_device_is_a_clear_error():
    model = ThresholdModel(0.5).to("meta")
    with pytest.raises(RobustModelError, match="the model's parameters are on meta but the check runs on cpu"):
        tsrm(model, threshold_data(), perturbation=FULL_BOX, budget=10, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_requested_without_cuda_raises(spec):
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device(spec)
    with pytest.raises(ValueError, match="no CUDA device"):
        tsrm(ThresholdModel(0.5), threshold_data(), perturbation=FULL_BOX, budget=10, device=spec)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="needs a machine without MPS")
def test_mps_requested_without_mps_raises():
    with pytest.raises(ValueError, match="MPS is not available"):
        resolve_device("mps")


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks CUDA there")
def test_resolve_device_auto_and_defaults():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device(None, ThresholdModel(0.5)) == torch.device("cpu")
    assert resolve_device(None, torch.nn.ReLU()) == torch.device("cpu")  # no parameters
    with pytest.raises(RobustModelError, match="meta device"):
        resolve_device(None, ThresholdModel(0.5).to("meta"))
    r = tsrm(ThresholdModel(0.5), threshold_data(), perturbation=FULL_BOX, budget=10, device="auto")
    assert r.device == "cpu"


@pytest.mark.parametrize("spec", ["gpu", "cuda0", "CPU", "tpu", ""])
def test_unknown_device_names_raise_setting_error(spec):
    with pytest.raises(SettingError, match="auto, cpu, cuda, cuda:N or mps") as info:
        resolve_device(spec)
    assert info.value.key == "device"


# ---------------------------------------------------------------------------------------------
# argument validation
# ---------------------------------------------------------------------------------------------

BAD_ARGS = [
    ("threshold", 0.0),
    ("threshold", 1.0),
    ("threshold", 1.5),
    ("threshold", -0.1),
    ("threshold", float("nan")),
    ("threshold", "high"),
    ("threshold", True),
    ("confidence", 0.0),
    ("confidence", 1.0),
    ("confidence", 95),
    ("confidence", float("inf")),
    ("confidence", None),
    ("budget", 0),
    ("budget", -5),
    ("budget", 10.5),
    ("budget", True),
    ("budget", "many"),
    ("seed", -1),
    ("seed", 0.5),
    ("seed", None),
    ("batch_size", 0),
    ("batch_size", -64),
    ("batch_size", 2.5),
    ("batch_size", False),
]


@pytest.mark.parametrize("key,value", BAD_ARGS)
def test_invalid_arguments_raise_setting_error_naming_the_key(key, value):
    model = ThresholdModel(0.5)
    with pytest.raises(SettingError) as info:
        tsrm(model, threshold_data(), perturbation=FULL_BOX, **{key: value})
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}={value!r} is invalid: expected ")
    assert isinstance(info.value, ValueError)


def test_invalid_perturbation_raises_type_error():
    with pytest.raises(TypeError, match="perturbation must be"):
        tsrm(ThresholdModel(0.5), threshold_data(), perturbation=0.1)


@pytest.mark.parametrize(
    "key,value,plain",
    [("budget", 2000.0, 2000), ("batch_size", 256.0, 256), ("threshold", "0.5", 0.5), ("budget", "2000", 2000)],
)
def test_values_accepted_by_validation_are_usable(key, value, plain):
    base = dict(threshold=0.3, budget=2000, batch_size=100)
    expected = summary(tsrm(ThresholdModel(0.5), threshold_data(), perturbation=FULL_BOX, **{**base, key: plain}))
    try:
        got = summary(tsrm(ThresholdModel(0.5), threshold_data(), perturbation=FULL_BOX, **{**base, key: value}))
    except SettingError:
        return  # rejecting it clearly would be fine too
    assert got == expected
