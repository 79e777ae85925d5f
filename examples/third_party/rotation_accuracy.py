"""Accuracy under random rotations: a perturbation plus a declaration, nothing else."""

import math

import torch
import torch.nn.functional as F

from pytest_robust import Metric, Param, Perturbation
from pytest_robust.procedures import bernoulli
from pytest_robust.settings.validation import positive_float


class RandomRotation(Perturbation):
    """Rotate each image about its centre by an angle uniform in [-max_degrees, max_degrees]."""

    def __init__(self, max_degrees: float):
        super().__init__(bounds=(0.0, 1.0))
        self.max_degrees = max_degrees

    def sample(self, x, generator):
        angle = (2 * torch.rand(len(x), generator=generator, device=x.device) - 1) * math.radians(self.max_degrees)
        cos, sin, zero = angle.cos(), angle.sin(), torch.zeros_like(angle)
        theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1).to(x.dtype)
        return F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False)


ROTATION_ACCURACY = Metric(
    lambda run, max_degrees: bernoulli.accuracy(run, run.perturbation), title="rotation accuracy",
    params=(Param("max_degrees", positive_float, 15.0, "largest rotation, in degrees"),),
    perturbation=RandomRotation, budget=20_000, doc="accuracy under a random rotation >= threshold")
