"""pytest-robust: robustness requirements for PyTorch classifiers as ordinary pytest tests.

Library use (no pytest needed)::

    from pytest_robust import tsrm, UniformLinf
    result = tsrm(model, (x, y), perturbation=UniformLinf(eps=0.1), threshold=0.9)
    print(result.message())

Names are imported lazily so that loading the pytest plugin does not import torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "tsrm": "pytest_robust.checks.tsrm.check",
    "intermediate_q": "pytest_robust.checks.q.check",
    "q_curve": "pytest_robust.checks.q.curve",
    "Spatial": "pytest_robust.perturbations",
    "nppr": "pytest_robust.checks.nppr.check",
    "certify": "pytest_robust.checks.smoothing.cohen",
    "predict": "pytest_robust.checks.smoothing.cohen",
    "certified_accuracy": "pytest_robust.checks.smoothing.check",
    "adversarial_accuracy": "pytest_robust.checks.adversarial.check",
    "Metric": "pytest_robust.checks.registry",
    "Param": "pytest_robust.checks.registry",
    "FromSetting": "pytest_robust.checks.registry",
    "REQUIRED": "pytest_robust.checks.registry",
    "pa_report": "pytest_robust.checks.smoothing.pa_report",
    "Certification": "pytest_robust.checks.smoothing.cohen",
    "Prediction": "pytest_robust.checks.smoothing.cohen",
    "Perturbation": "pytest_robust.perturbations",
    "UniformLinf": "pytest_robust.perturbations",
    "UniformL1": "pytest_robust.perturbations",
    "UniformL2": "pytest_robust.perturbations",
    "GaussianNoise": "pytest_robust.perturbations",
    "CauchyNoise": "pytest_robust.perturbations",
    "corruption_accuracy": "pytest_robust.checks.corruption_accuracy.check",
    "Corruption": "pytest_robust.perturbations.corruptions",
    "corruption_names": "pytest_robust.perturbations.corruptions",
    "Result": "pytest_robust.results",
    "execution": "pytest_robust.engine.context",
    "model_interface": "pytest_robust.engine.context",
    "progress_sink": "pytest_robust.engine.context",
    "count_host_syncs": "pytest_robust.engine.host_syncs",
    "RobustError": "pytest_robust.errors",
    "RobustDataError": "pytest_robust.errors",
    "RobustModelError": "pytest_robust.errors",
    "RobustWarning": "pytest_robust.errors",
    "SettingError": "pytest_robust.errors",
    "ArgumentError": "pytest_robust.errors",
    "MarkerError": "pytest_robust.errors",
    "BudgetError": "pytest_robust.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pytest_robust' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
