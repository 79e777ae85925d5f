"""Total statistical robustness metric (TSRM; Wang, Webb & Rainforth, eq. 5), in its accuracy form.

    TSRM(f) = P_{(X, Y) ~ data, X' ~ p(. | X)} ( argmax f(X') = Y )     (a tie counts as an error)

with the data distribution taken to be the uniform distribution over the given inputs. The check is
the Bernoulli-stream procedure (``procedures.bernoulli``) on ``perturbation``: each draw picks an
input uniformly at random (with replacement) and one fresh perturbation of it, and the gate
"TSRM >= threshold" is anytime-valid at level 1 - confidence. Without a threshold exactly
``budget`` draws are made. ``details`` adds fixed-sample Clopper-Pearson bounds and bookkeeping.
"""

from __future__ import annotations

from pytest_robust.checks.library import function
from pytest_robust.checks.tsrm import DECLARATION
from pytest_robust.engine.run import Run
from pytest_robust.perturbations.base import as_perturbation
from pytest_robust.procedures import bernoulli
from pytest_robust.results import Result


def evaluate(run: Run, perturbation) -> Result:
    return bernoulli.accuracy(run, as_perturbation(perturbation))


tsrm = function("tsrm", DECLARATION)
