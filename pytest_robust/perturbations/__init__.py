"""Random input corruptions p(x' | x) for statistical robustness checks.

A perturbation maps a batch ``x`` of shape (n, ...) and a ``torch.Generator`` to a perturbed batch
of the same shape, drawing every random number from that generator (so results are reproducible
and do not depend on how samples are batched). All sizes (``eps``, ``sigma``, ``scale``) are in the
units of the tensors your data yields: for inputs in [0, 1] pixel space, eps=8/255 is 8 grey levels.
If your data is normalized (x - mean) / std, either move the normalization into the model
(recommended: then eps stays in pixel units) or pass ``bounds`` in normalized units and scale eps
by 1/std yourself.

``bounds=(lo, hi)`` is the input box (default [0, 1]); each of lo and hi a number, a per-channel
sequence of length C (one per channel of (N, C, ...) inputs, like mean/std lists), or a tensor that
broadcasts to one input (e.g. shape (C, 1, 1)); ``None`` switches the box off. Bounds of another
shape are an ArgumentError naming both shapes when they meet the inputs (``inspect.perturbation.box_for``).

Modules: ``base`` (the protocol, boxes, identities), ``noise`` (uniform, Gaussian, Cauchy noise),
``spatial`` (flip/rotate/scale/crop), ``spaces`` (the parameter spaces samplers move in),
``projected`` (Gaussian noise projected into a norm ball) and ``corruptions`` (the common
corruptions). The public classes are importable from this package.
"""

from pytest_robust.perturbations.base import CallablePerturbation, Perturbation, as_perturbation
from pytest_robust.perturbations.corruptions import Corruption
from pytest_robust.perturbations.noise import CauchyNoise, GaussianNoise, UniformL1, UniformL2, UniformLinf
from pytest_robust.perturbations.spatial import Spatial

#: The built-in perturbations by the name a YAML suite writes them (``{UniformLinf: {eps: 0.1}}``).
BY_NAME = {cls.__name__: cls for cls in (UniformLinf, UniformL2, UniformL1, GaussianNoise, CauchyNoise, Spatial,
                                         Corruption)}

__all__ = ["BY_NAME", "CallablePerturbation", "CauchyNoise", "Corruption", "GaussianNoise", "Perturbation", "Spatial",
           "UniformL1", "UniformL2", "UniformLinf", "as_perturbation"]
