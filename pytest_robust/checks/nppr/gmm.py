"""The perturbation model of NPPR: a Gaussian mixture over a latent space, decoded into the budget ball.

For an input x with label y (Wang et al., *Non-Parametric Probabilistic Robustness*, section 4):

    mixture   pi(x, y) in the simplex of R^K,  mu_k(x, y) in R^d,  Sigma_k(x, y) = L_k L_k^T
    latent    k ~ Categorical(pi),  z = mu_k + L_k e,  e ~ N(0, I_d)
    decoder   u = Up(W z + b)          (W z + b: a C x s x s grid, Up: bicubic interpolation to H x W)
    budget    delta = eps * tanh(u)                (L-inf: every coordinate in [-eps, eps])
              delta = eps * u / ||u||_2            (L2: on the sphere of radius eps)
    input     x' = clip(x + delta) to the box [lo, hi]

d is ``latent_dim`` (default 128), K ``components`` (default 7). ``covariance="full"`` makes L_k a
lower-triangular Cholesky factor whose diagonal is softplus(.) + 1e-4 (so Sigma_k is positive
definite); ``"diagonal"`` keeps only that diagonal. eps is in the units of the inputs (pixel units
for inputs in [0, 1]). Since x lies in the box and clipping moves x + delta towards x coordinate by
coordinate, x' stays in the ball of radius eps around x.

Where the parameters come from is the *dependency structure*:

| dependency  | mixture weights pi          | means and Cholesky factors      |
|-------------|-----------------------------|---------------------------------|
| independent | free parameters             | free parameters                 |
| label       | label embedding (64-d) -> K | free parameters                 |
| input       | classifier features -> MLP  | classifier features -> MLP      |
| joint       | label embedding (64-d) -> K | classifier features -> MLP      |

The features are those of the frozen classifier on the clean input (the MLP trunk is
Linear(features, 256), BatchNorm, ReLU). The decoder (W, b) is learned in every structure.

Fitting uses reparameterised, relaxed draws (``relaxed_latent``): one draw z_k per component and
Gumbel-softmax weights w = softmax((log pi + g) / temperature), z = sum_k w_k z_k, which tends to a
hard component choice as the temperature goes to 0. Evaluation uses exact draws (``hard_latent``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from pytest_robust.perturbations.base import feasible_box

#: Added to softplus of the Cholesky diagonal: keeps every covariance positive definite.
MIN_SCALE = 1e-4
#: Width of the label embedding and of the feature trunk (as in the reference implementation).
LABEL_EMBEDDING = 64
TRUNK_WIDTH = 256
#: Raw value whose softplus is 1: the initial scale of every latent coordinate.
_UNIT_SCALE = math.log(math.e - 1.0)

#: Where mixture weights and components come from, per dependency structure.
SOURCES = {
    "independent": ("free", "free"),
    "label": ("label", "free"),
    "input": ("input", "input"),
    "joint": ("label", "input"),
}


@dataclass(frozen=True)
class GMMConfig:
    """Everything that fixes the perturbation model's architecture and budget.

    ``input_shape`` is one input's shape without the batch dimension; inputs of shape (C, H, W)
    are decoded from a C x grid x grid latent image by bicubic interpolation, any other shape by a
    linear map straight to all coordinates. ``feature_dim`` is the width of the classifier
    features (needed by the "input" and "joint" structures, else None).
    """

    eps: float
    norm: str
    components: int
    latent_dim: int
    covariance: str
    dependency: str
    input_shape: tuple[int, ...]
    n_classes: int
    feature_dim: int | None
    grid_size: int
    radius: tuple[float, ...] | None = None  # L-inf: one radius per coordinate of one input (eps their largest)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def is_image(self) -> bool:
        return len(self.input_shape) == 3

    @property
    def scale_size(self) -> int:
        """Numbers per component that parameterise its scale: d(d+1)/2 (full) or d (diagonal)."""
        d = self.latent_dim
        return d * (d + 1) // 2 if self.covariance == "full" else d


def default_grid_size(input_shape: tuple[int, ...]) -> int:
    """Side s of the latent image: one cell per 8 x 8 pixels, at least 4 (s = 4 up to 32 pixels)."""
    return max(4, round(max(input_shape[1:]) / 8)) if len(input_shape) == 3 else 0


class Mixture(NamedTuple):
    """Mixture parameters of a batch of B inputs.

    ``logits`` (B, K) are per input. ``means`` (K, d) and ``scale`` are *shared* by every input
    when the components are free parameters (independent and label structures), else per input:
    means (B, K, d). ``scale`` holds Cholesky factors L_k, (K, d, d) or (B, K, d, d), for full
    covariance, or per-coordinate standard deviations, (K, d) or (B, K, d), for diagonal covariance.
    """

    logits: torch.Tensor
    means: torch.Tensor
    scale: torch.Tensor

    @property
    def shared(self) -> bool:
        return self.means.ndim == 2

    @property
    def full(self) -> bool:
        return self.scale.ndim == self.means.ndim + 1

    def covariance(self) -> torch.Tensor:
        """Sigma_k = L_k L_k^T, shape (K, d, d) or (B, K, d, d)."""
        if self.full:
            return self.scale @ self.scale.transpose(-1, -2)
        return torch.diag_embed(self.scale**2)

    def component_draws(self, e: torch.Tensor) -> torch.Tensor:
        """mu_k + L_k e_k for standard normal e of shape (B, S, K, d); same shape."""
        if self.full:
            le = torch.einsum("kij,bskj->bski" if self.shared else "bkij,bskj->bski", self.scale, e)
        else:
            le = (self.scale if self.shared else self.scale[:, None]) * e
        return (self.means if self.shared else self.means[:, None]) + le

    def chosen_draws(self, e: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """mu_k + L_k e of the one component k = ``chosen`` (B, S) of each draw, for standard normal
        e of shape (B, S, d): ``component_draws``' number for that component. With diagonal
        covariance only that component is computed; with full covariance every component is (a
        factor L_k gathered per draw would hold d x d numbers per draw) and the chosen one kept."""
        index = chosen[..., None].expand(*chosen.shape, e.shape[-1])
        if self.full:
            every = self.component_draws(e[:, :, None].expand(-1, -1, self.logits.shape[-1], -1))
            return every.gather(2, index[:, :, None]).squeeze(2)
        if self.shared:
            return self.means[chosen] + self.scale[chosen] * e
        return self.means.gather(1, index) + self.scale.gather(1, index) * e


class _Free(nn.Module):
    """Parameters shared by every input: one learned vector, without a batch dimension."""

    def __init__(self, init: torch.Tensor):
        super().__init__()
        self.value = nn.Parameter(init.clone())

    def forward(self, features, labels):
        return self.value


class _LabelHead(nn.Module):
    """label -> 64-d embedding -> Linear -> output."""

    def __init__(self, n_classes: int, init: torch.Tensor):
        super().__init__()
        self.embed = nn.Embedding(n_classes, LABEL_EMBEDDING)
        self.out = _output_layer(LABEL_EMBEDDING, init)

    def forward(self, features, labels):
        return self.out(self.embed(labels))


class _InputHead(nn.Module):
    """classifier features -> Linear(features, 256) -> BatchNorm -> ReLU -> Linear -> output."""

    def __init__(self, feature_dim: int, init: torch.Tensor):
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(feature_dim, TRUNK_WIDTH), nn.BatchNorm1d(TRUNK_WIDTH), nn.ReLU()
        )
        self.out = _output_layer(TRUNK_WIDTH, init)

    def forward(self, features, labels):
        return self.out(self.trunk(features))


def _output_layer(width: int, init: torch.Tensor) -> nn.Linear:
    """A Linear layer that starts near the constant ``init`` (small weights, bias = init)."""
    layer = nn.Linear(width, len(init))
    with torch.no_grad():
        layer.weight.mul_(0.01)
        layer.bias.copy_(init)
    return layer


def _head(kind: str, cfg: GMMConfig, init: torch.Tensor) -> nn.Module:
    if kind == "free":
        return _Free(init)
    if kind == "label":
        return _LabelHead(cfg.n_classes, init)
    return _InputHead(cfg.feature_dim, init)


class GMMPerturbation(nn.Module):
    """The learnable perturbation distribution p(x' | x, y) described in the module docstring.

    Parameters are initialised from the global RNG (call under ``torch.random.fork_rng`` with a
    seed for reproducibility); every draw takes an explicit ``torch.Generator``.
    """

    def __init__(self, cfg: GMMConfig):
        super().__init__()
        if cfg.dependency in ("input", "joint") and not cfg.feature_dim:
            raise ValueError(f"dependency={cfg.dependency!r} needs the classifier's feature width")
        self.cfg = cfg
        k, d = cfg.components, cfg.latent_dim
        weights_from, components_from = SOURCES[cfg.dependency]
        self.weights = _head(weights_from, cfg, torch.zeros(k))
        scale_init = torch.zeros(k, cfg.scale_size)
        diagonal = _diagonal_positions(d) if cfg.covariance == "full" else torch.arange(d)
        scale_init[:, diagonal] = _UNIT_SCALE
        self.components = _head(components_from, cfg, torch.cat([torch.randn(k * d), scale_init.flatten()]))
        radius = None if cfg.radius is None else torch.tensor(cfg.radius).reshape(cfg.input_shape)
        self.register_buffer("radius", radius)  # per coordinate, or None: cfg.eps everywhere
        if cfg.is_image:
            channels, height, width = cfg.input_shape
            self.grid = (min(cfg.grid_size, height), min(cfg.grid_size, width))
            self.decoder = nn.Linear(d, channels * self.grid[0] * self.grid[1])
        else:
            self.grid = None
            self.decoder = nn.Linear(d, math.prod(cfg.input_shape))

    # -- the mixture ------------------------------------------------------------------------------

    def mixture(self, features: torch.Tensor | None, labels: torch.Tensor) -> Mixture:
        """Mixture parameters for a batch of inputs, from their features (B, F) and labels (B,)."""
        k, d = self.cfg.components, self.cfg.latent_dim
        logits = self.weights(features, labels).expand(len(labels), -1)
        comp = self.components(features, labels)  # (P,) when shared, else (B, P)
        means = comp[..., : k * d].unflatten(-1, (k, d))
        raw = comp[..., k * d :].unflatten(-1, (k, self.cfg.scale_size))
        if self.cfg.covariance == "diagonal":
            return Mixture(logits, means, F.softplus(raw) + MIN_SCALE)
        rows, cols = torch.tril_indices(d, d, device=raw.device)
        packed = torch.where(rows == cols, F.softplus(raw) + MIN_SCALE, raw)
        factor = raw.new_zeros(*raw.shape[:-1], d, d)
        factor[..., rows, cols] = packed
        return Mixture(logits, means, factor)

    # -- latent draws ------------------------------------------------------------------------------

    def relaxed_latent(
        self, mix: Mixture, draws: int, temperature: float, generator: torch.Generator
    ) -> torch.Tensor:
        """Reparameterised draws for fitting, shape (B, draws, d).

        z = sum_k w_k (mu_k + L_k e_k), e_k ~ N(0, I), w = softmax((logits + g) / temperature),
        g ~ Gumbel(0, 1) i.i.d.; differentiable in every mixture parameter.
        """
        b, k = mix.logits.shape
        like = mix.means
        z = mix.component_draws(_randn((b, draws, k, self.cfg.latent_dim), like, generator))
        u = _rand((b, draws, k), like, generator).clamp(min=torch.finfo(like.dtype).tiny)
        w = torch.softmax((mix.logits[:, None] - torch.log(-torch.log(u))) / temperature, dim=-1)
        return (w[..., None] * z).sum(dim=2)

    def hard_latent(self, mix: Mixture, draws: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact draws from the mixture: (z of shape (B, draws, d), component indices (B, draws)).

        k ~ Categorical(softmax(logits)), then z = mu_k + L_k e with e ~ N(0, I).
        """
        return self.hard_latent_blocks(mix, draws, [generator])

    def hard_latent_blocks(self, mix: Mixture, draws: int, generators: list) -> tuple[torch.Tensor, torch.Tensor]:
        """``hard_latent`` of consecutive equal blocks of the rows, block j with ``generators[j]``:
        the numbers of drawing each block alone, with the mixture's arithmetic done once.

        The component is the exponential race k = argmax_i p_i / q_i with q_i ~ Exp(1), an exact
        draw from the categorical p (P(k = i) = p_i / sum p): for one draw it is what
        ``torch.multinomial`` computes, number for number, without its validation (two host reads
        per call on a GPU; softmax probabilities need none). Each block's generator draws its race,
        then its latent noise e."""
        b, k = mix.logits.shape
        d, size = self.cfg.latent_dim, b // len(generators)
        if size * len(generators) != b:
            raise ValueError(f"{b} rows do not split into {len(generators)} equal blocks")
        race = torch.empty((b, draws, k), device=mix.means.device, dtype=mix.logits.dtype)
        noise = torch.empty((b, draws, d), device=mix.means.device, dtype=mix.means.dtype)
        for j, generator in enumerate(generators):
            race[j * size:(j + 1) * size].exponential_(generator=generator)
            noise[j * size:(j + 1) * size].normal_(generator=generator)
        chosen = torch.softmax(mix.logits, dim=-1)[:, None].div(race).argmax(-1)
        return mix.chosen_draws(noise, chosen), chosen

    # -- from latent to input space ---------------------------------------------------------------

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Unbounded perturbations u of shape (*z.shape[:-1], *input_shape)."""
        lead = z.shape[:-1]
        u = self.decoder(z.reshape(-1, z.shape[-1]))
        if self.grid is not None:
            channels, height, width = self.cfg.input_shape
            u = u.reshape(-1, channels, *self.grid)
            if self.grid != (height, width):
                u = F.interpolate(u, size=(height, width), mode="bicubic", align_corners=False)
        return u.reshape(*lead, *self.cfg.input_shape)

    @property
    def size(self):
        """The L-inf radius: per coordinate (a tensor of one input's shape) or one number."""
        return self.cfg.eps if self.radius is None else self.radius

    def budget(self, u: torch.Tensor) -> torch.Tensor:
        """delta = eps tanh(u) (L-inf, eps per coordinate where given) or eps u / ||u||_2 over each
        input's coordinates (L2)."""
        if self.cfg.norm == "linf":
            return self.size * torch.tanh(u)
        dims = tuple(range(u.ndim - len(self.cfg.input_shape), u.ndim))
        norm = u.flatten(start_dim=dims[0]).norm(dim=-1).clamp(min=1e-12)
        return self.cfg.eps * u / norm.reshape(*norm.shape, *([1] * len(dims)))

    def apply(self, x: torch.Tensor, z: torch.Tensor, bounds) -> torch.Tensor:
        """Perturbed inputs x' of shape (B, draws, *input_shape) for inputs x (B, ...) and latents z.

        x' = clip(x + budget(decode(z))) to the box, clamped to [max(x - eps, lo), min(x + eps, hi)]
        (for L2 the clamp only enforces the box; the L2 ball lies inside that L-inf box).
        """
        delta = self.budget(self.decode(z))
        lo, hi = feasible_box(x, self.size, bounds)  # of the batch, so per-channel bounds meet its channels
        return torch.minimum(torch.maximum(x[:, None] + delta, lo[:, None]), hi[:, None])


def _diagonal_positions(d: int) -> torch.Tensor:
    """Positions of the diagonal entries in the row-major packed lower triangle of a d x d matrix."""
    rows, cols = torch.tril_indices(d, d)
    return torch.nonzero(rows == cols).flatten()


def _randn(shape, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)


def _rand(shape, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype)
