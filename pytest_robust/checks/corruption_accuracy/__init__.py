"""Common-corruption accuracy (Hendrycks & Dietterich, ICLR 2019) over a grid of corruptions x
severities, one Bernoulli stream. Declared here (torch-free); ``check`` evaluates it."""

from pytest_robust.checks.registry import Metric, Param
from pytest_robust.errors import SettingError
from pytest_robust.settings.validation import int_list, text, text_list


def _corruptions(key, value):
    """Names of common corruptions (did-you-mean for a misspelt one)."""
    from pytest_robust.perturbations.corruptions import CorruptionGrid

    names = text_list(key, value)
    try:
        CorruptionGrid(names, (1,))
    except ValueError as err:
        raise SettingError(key, value, str(err)) from None
    return names


def _severities(key, value):
    """Severities 1-5 (one is a list of one)."""
    accepted = "a list of severities (each severity must be an integer from 1 to 5), e.g. [1, 2, 3]"
    try:
        levels = int_list(key, value)
    except SettingError:
        raise SettingError(key, value, accepted) from None
    if not all(1 <= s <= 5 for s in levels):
        raise SettingError(key, value, accepted)
    return levels


DECLARATION = Metric(
    "pytest_robust.checks.corruption_accuracy.check:evaluate", title="corruption accuracy", budget=100_000,
    paired="bernoulli",
    # its draws are TSRM's (same inputs and noise streams for a seed), so the two compare draw by draw
    streams="tsrm", perturbation="pytest_robust.checks.corruption_accuracy.check:grid",
    params=(
        Param("corruptions", _corruptions, None, "the corruptions (default: the 15 of the benchmark)"),
        Param("severities", _severities, None, "the severities 1-5 (default: all five)"),
        Param("preset", text, None, "the corruptions' preset (as for Corruption)"),
    ),
    doc="mean accuracy over a grid of common corruptions x severities >= threshold",
)
