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
    "tsrm": "pytest_robust.metrics.tsrm",
    "intermediate_q": "pytest_robust.metrics.intermediate_q",
    "q_curve": "pytest_robust.analyses.q_curve",
    "Spatial": "pytest_robust.perturbations",
    "nppr": "pytest_robust.metrics.nppr",
    "certify": "pytest_robust.analyses.cohen",
    "predict": "pytest_robust.analyses.cohen",
    "certified_accuracy": "pytest_robust.metrics.certified_accuracy",
    "adversarial_accuracy": "pytest_robust.metrics.adversarial",
    "Metric": "pytest_robust.declarations",
    "Param": "pytest_robust.declarations",
    "FromSetting": "pytest_robust.declarations",
    "REQUIRED": "pytest_robust.declarations",
    "pa_report": "pytest_robust.analyses.pa_report",
    "Certification": "pytest_robust.analyses.cohen",
    "Prediction": "pytest_robust.analyses.cohen",
    "Perturbation": "pytest_robust.perturbations",
    "UniformLinf": "pytest_robust.perturbations",
    "UniformL2": "pytest_robust.perturbations",
    "GaussianNoise": "pytest_robust.perturbations",
    "CauchyNoise": "pytest_robust.perturbations",
    "corruption_accuracy": "pytest_robust.metrics.corruption_accuracy",
    "Corruption": "pytest_robust.corruptions",
    "corruption_names": "pytest_robust.corruptions",
    "Result": "pytest_robust.results",
    "execution": "pytest_robust.model_execution",
    "model_interface": "pytest_robust.model_io",
    "count_host_syncs": "pytest_robust.host_syncs",
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
