"""The checks, one folder per method family, each declaring its check beside its body.

A check's ``__init__.py`` holds its declaration (``DECLARATION``, a ``registry.Metric``: parameters,
validators, budget, title; torch-free, so that the pytest plugin can list the checks without
importing torch) and ``check.py`` its evaluation, which plugs into a procedure
(``pytest_robust.procedures``). The built-in checks register through the same
``pytest_robust_metrics`` hook as third-party ones (``BUILTIN``). The analyses (``ANALYSES``: the
q-curve, CERTIFY, PREDICT, the pA report) are declared the same way, without a threshold: they go
through the same door in the library and the ``robust`` fixture, but name no marker.
"""

from pytest_robust.checks import adversarial, corruption_accuracy, nppr, q, smoothing, tsrm

BUILTIN = {
    "tsrm": tsrm.DECLARATION,
    "q": q.DECLARATION,
    "certified_accuracy": smoothing.DECLARATION,
    "nppr": nppr.DECLARATION,
    "adversarial_accuracy": adversarial.DECLARATION,
    "corruption_accuracy": corruption_accuracy.DECLARATION,
}

ANALYSES = {
    "q_curve": q.CURVE,
    "certify": smoothing.CERTIFY,
    "predict": smoothing.PREDICT,
    "pa_report": smoothing.PA_REPORT,
}
