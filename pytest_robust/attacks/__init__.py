"""Adversarial attacks, all calling the model through the forward wrapper ``engine.forward.Forward``
(counted, capped at the budget, OOM-safe), with iterates in float32 or wider.

- ``losses``: the objectives (cross-entropy, the targeted DLR loss, the margin); the feasible box
  [max(x - eps, lo), min(x + eps, hi)] is ``perturbations.feasible_box``, shared with the perturbations;
- ``pgd``: projected gradient descent with a fixed step (Madry et al. 2018), for adversarial
  training and the context figures of the q and NPPR checks;
- ``norms``: the L-inf, L2 and L1 balls (steepest-ascent steps, projections, starts, first-order gains);
- ``apgd``: APGD, PGD with an adaptive step size and momentum (Croce & Hein 2020), in either ball;
- ``square``: the Square attack, a gradient-free random search (Andriushchenko et al. 2020), in every ball
  (Square-L1 after Croce et al. 2021);
- ``fab``: FAB-T in L1, a walk along the linearised decision boundary (Croce & Hein 2020);
- ``ensemble``: the stages of the adversarial-accuracy check (APGD-CE, APGD-T with targets ranked by
  the first-order model, FAB-T in L1, Square), each on the inputs the earlier stages left unbroken;

The inputs of a data set are attacked in fixed blocks by the per-input procedure
(``procedures.per_input.over_blocks``), chunk by chunk in a seeded random order
(``checks.adversarial.check``).
"""

from pytest_robust.attacks.losses import cross_entropy
from pytest_robust.attacks.pgd import Attack, pgd
from pytest_robust.perturbations.base import feasible_box

__all__ = ["Attack", "cross_entropy", "feasible_box", "pgd"]
