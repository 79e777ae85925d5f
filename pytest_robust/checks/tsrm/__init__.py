"""TSRM (Wang, Webb & Rainforth): accuracy under a random perturbation, decided by the Bernoulli
procedure. This module declares the check (torch-free); ``check.py`` evaluates it."""

from pytest_robust.checks.registry import REQUIRED, Metric, Param, perturbation

DECLARATION = Metric(
    "pytest_robust.checks.tsrm.check:evaluate", title="TSRM", budget=100_000, paired="bernoulli",
    params=(Param("perturbation", perturbation, REQUIRED, "the random perturbation, e.g. UniformLinf(eps=0.1)"),),
    doc="accuracy under a random perturbation (TSRM) >= threshold", discrete=True,
)
