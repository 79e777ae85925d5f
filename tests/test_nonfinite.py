"""NaN and inf logits name the inputs: how many, which (the first few), and whether the clean
inputs already produce them; then the model or the data is blamed, not the perturbation."""

import pytest
import torch

import pytest_robust as pr
from pytest_robust.errors import RobustModelError

N = 48
POISONED = (3, 17, 30, 41)


class NanWhere(torch.nn.Module):
    """Two logits (s, -s), s = mean of x - 1/2; NaN on rows whose first coordinate exceeds ``above``."""

    def __init__(self, above: float):
        super().__init__()
        self.above = above
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        s = self.w * (x.flatten(1).mean(dim=1) - 0.5)
        z = torch.stack([s, -s], dim=1)
        return torch.where((x.flatten(1)[:, 0] > self.above)[:, None], torch.full_like(z, float("nan")), z)


def data(poisoned=POISONED, value=0.95):
    """Inputs in [0.2, 0.8] except the first coordinate of the ``poisoned`` rows, which is ``value``."""
    g = torch.Generator().manual_seed(0)
    x = 0.2 + 0.6 * torch.rand(N, 8, generator=g)
    x[list(poisoned), 0] = value
    return x, (x.mean(dim=1) < 0.5).long()


CHECKS = {
    "tsrm": lambda m, d: pr.tsrm(m, d, perturbation=pr.UniformLinf(eps=0.1), threshold=0.5, budget=2000),
    "q": lambda m, d: pr.intermediate_q(m, d, perturbation=pr.UniformLinf(eps=0.1), q=1, estimator="mc",
                                        max_loss=2.0, chains=4, steps=4, inputs=48, budget=5000),
    "certified_accuracy": lambda m, d: pr.certified_accuracy(m, d, threshold=0.5, radius=0.05, sigma=0.1,
                                                             max_draws=300, budget=20_000),
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_nan_on_clean_inputs_names_count_and_indices_and_blames_the_model_or_data(name):
    with pytest.raises(RobustModelError) as info:
        CHECKS[name](NanWhere(above=0.9), data())
    text = str(info.value)
    assert f"on 4 of {N} clean inputs (indices 3, 17, 30, 41)" in text
    assert "the model or the data is at fault, not the perturbation" in text


def test_the_first_few_indices_are_listed_when_many_clean_inputs_fail():
    with pytest.raises(RobustModelError, match=rf"on 10 of {N} clean inputs \(indices 0, 4, 8, 12, 16, \.\.\.\)"):
        CHECKS["tsrm"](NanWhere(above=0.9), data(poisoned=range(0, 40, 4)))


def test_nan_on_perturbed_inputs_only_says_the_clean_ones_are_finite():
    """Clean rows never exceed 0.85; eps=0.1 around 0.84 crosses it on most draws."""
    with pytest.raises(RobustModelError) as info:
        CHECKS["tsrm"](NanWhere(above=0.85), data(value=0.84))
    text = str(info.value)
    assert "NaN or infinite logits on perturbed inputs; its logits on every clean input are finite" in text
    assert "clean inputs (indices" not in text


def test_a_batch_with_nan_logits_names_how_many_rows_and_which():
    """Outside a stream (the gradient path of the q check) the failing batch itself is named."""
    with pytest.raises(RobustModelError, match=r"NaN or infinite logits on \d+ of \d+ inputs of a batch \(rows \d+"):
        pr.intermediate_q(NanWhere(above=0.85), data(value=0.84), perturbation=pr.UniformLinf(eps=0.1), q=10,
                          max_loss=2.0, chains=4, steps=6, warmup=2, inputs=48, budget=20_000)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_deferred_flag_tells_huge_finite_logits_from_non_finite_ones(dtype):
    """``Forward.deferring``'s flag (read by the streams, APGD and the smoothing counts): logits at
    the largest finite values of their dtype are finite (a float64 sum of float64 logits could
    overflow, so float64 logits are tested one by one); a single NaN or infinity is not."""
    from pytest_robust.engine.forward import Forward

    big = torch.finfo(dtype).max
    for logits, finite in ((torch.tensor([[big, big * 0.9]] * 4, dtype=dtype), True),
                           (torch.tensor([[1.0, 2.0], [float("nan"), 0.0]], dtype=dtype), False),
                           (torch.tensor([[1.0, float("-inf")], [2.0, 0.0]], dtype=dtype), False)):
        forward = Forward(lambda x, z=logits: z, batch_size=8)
        with forward.deferring():
            forward.logits(torch.zeros(len(logits), 3))
        assert bool(forward.finite) is finite, (dtype, logits)


def test_a_replayed_run_names_the_failing_batch_and_is_not_charged():
    """``Forward.replayable``: a run whose deferred flag says non-finite is made again with the
    check at every call, so the error names the batch's rows; the replay is counted but not held
    to the budget (it would exceed it here); a model that does not fail again still gets the error,
    without rows."""
    from pytest_robust.engine.forward import Forward

    def model(x):  # NaN logits on rows whose first feature is above 0.5
        z = torch.stack([x[:, 0], -x[:, 0]], dim=1)
        return torch.where(x[:, :1] > 0.5, float("nan"), z)

    x = torch.tensor([[0.1, 0.0], [0.2, 0.0], [0.9, 0.0], [0.3, 0.0]])
    forward = Forward(model, batch_size=2, budget=4)
    with pytest.raises(RobustModelError, match=r"on 1 of 2 inputs of a batch \(rows 0 of the batch\)"):
        forward.replayable(lambda: forward.logits(x))
    assert forward.passes == 4 + 2 and forward.budget == 4  # the replay stopped at its second batch
    calls = []

    def once(x):  # non-finite on its first call only
        calls.append(1)
        return torch.full((len(x), 2), float("nan") if len(calls) == 1 else 0.0)

    forward = Forward(once, batch_size=4)
    with pytest.raises(RobustModelError, match="NaN or infinite logits on perturbed inputs"):
        forward.replayable(lambda: forward.logits(x))
    assert forward.replayable(lambda: forward.logits(x)[:, 0].sum()) == 0.0  # a finite run returns its result


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_nan_logits_in_the_paired_stream_name_the_model_that_gave_them(side):
    """The paired stream scores both models' logits in one pass (``ranking.score``) and keeps one
    finiteness flag per model, so NaN logits on perturbed inputs name the model that gave them:
    the reference, or the model under test."""
    broken, sound = NanWhere(above=0.85), NanWhere(above=2.0)
    candidate, reference = (sound, broken) if side == "reference" else (broken, sound)
    with pytest.raises(RobustModelError) as info:
        pr.tsrm(candidate, data(value=0.84), perturbation=pr.UniformLinf(eps=0.1), reference=reference, max_drop=0.1,
                budget=4000)
    text = str(info.value)
    assert "NaN or infinite logits on perturbed inputs" in text
    assert ("the reference model" in text) is (side == "reference")
