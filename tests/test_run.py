"""Run, the context every check shares: the model is inspected once per check, the accounting is
gathered across ranks in one collective call, and a result is refused once the run has closed
(the model's state is restored by then)."""

from __future__ import annotations

import sys

import pytest
from toy_models import ThresholdModel, bare_run, threshold_data

import pytest_robust as pr
from pytest_robust.engine import collective
from pytest_robust.engine.inspect import model as model_inspection

COLLECTIVES = ("gather_objects", "sum_int", "interleave", "gather_rows", "gather_blocks")


def _count(monkeypatch, module, names) -> dict:
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


def test_the_model_is_inspected_once_per_check(monkeypatch):
    real, calls = model_inspection.check_model, []

    def counted(model):
        calls.append(model)
        return real(model)

    for module in list(sys.modules.values()):  # every module that imported the function by name
        if getattr(module, "check_model", None) is real and getattr(module, "__name__", "").startswith("pytest_robust"):
            monkeypatch.setattr(module, "check_model", counted)
    model = ThresholdModel(0.5)
    pr.tsrm(model, threshold_data(), perturbation=pr.UniformLinf(eps=0.05), threshold=0.5, budget=200)
    assert calls == [model]


@pytest.mark.filterwarnings("ignore:.*tied top logits")
def test_the_result_gathers_its_accounting_in_one_collective_call(monkeypatch):
    with bare_run("toy", ThresholdModel(0.5), threshold_data(), budget=100) as run:
        run.clean_accuracy()
        calls = _count(monkeypatch, collective, COLLECTIVES)
        result = run.result(estimate=1.0, lower=1.0, upper=1.0, draws=16, perturbation="none")
    assert sum(calls.values()) == 1, calls
    assert result.forward_passes == 16 and result.details["evaluations_per_rank"] == [16]


@pytest.mark.filterwarnings("ignore:.*tied top logits")
def test_a_result_after_the_run_closed_is_refused():
    with bare_run("toy", ThresholdModel(0.5), threshold_data(), budget=100) as run:
        run.clean_accuracy()
    with pytest.raises(RuntimeError, match="after the run closed"):
        run.result(estimate=1.0, lower=1.0, upper=1.0, draws=16, perturbation="none")
