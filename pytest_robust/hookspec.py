"""Hooks that other plugins and conftest.py files can implement to extend pytest-robust."""

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_robust_perturbations() -> dict:
    """Return ``{name: factory}`` for perturbations that YAML suites may name.

    ``factory(**params)`` must return a ``pytest_robust.Perturbation`` or a callable
    ``(x, generator) -> x'``. The built-in names (UniformLinf, GaussianNoise, CauchyNoise, ...)
    are always available; a hook may add names but not replace built-ins.
    """


@hookspec
def pytest_robust_environment(env: dict) -> None:
    """Amend, in place, the environment facts recorded with results (versions, device names...)."""


@hookspec
def pytest_robust_metrics() -> dict:
    """Return ``{name: pytest_robust.Metric(...)}``: metrics usable as marker keywords
    (``@pytest.mark.robust(name=threshold, ...)``), fixture methods (``robust.name(model, data,
    threshold, ...)``) and YAML-suite checks. The built-in metrics register through this hook
    too; a name may be registered only once. See docs/extending.md, 'A declaration'.
    """
