"""nppr() and its Gaussian-mixture perturbation model: budget, sampling, fitting, caching, errors.

Fits here are tiny (a few latent dimensions, tens of Adam steps) so that the file runs in seconds.
The central synthetic case is ``WeakLinear``: a linear classifier whose margin on every input is
3, while an L-inf perturbation of radius eps = 0.3 along -sign(w) lowers it by eps ||w||_1 = 4.8.
Random noise of the same size barely moves the margin (its standard deviation is eps ||w||_2 = 1.2
for Gaussian noise), so PR under Gaussian or uniform noise is near 1 while the worst distribution
in the ball has PR near 0.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from toy_models import SmallNet, bare_run, image_data

from pytest_robust.checks.nppr import DECLARATION as NPPR
from pytest_robust.checks.nppr.check import nppr
from pytest_robust.checks.nppr.data import split_data
from pytest_robust.checks.nppr.fit import FrozenGMM
from pytest_robust.checks.nppr.gmm import GMMConfig, GMMPerturbation, Mixture
from pytest_robust.engine import cache
from pytest_robust.errors import RobustDataError, RobustWarning, SettingError

D = 16  # input width of the weak linear model
TINY = dict(latent_dim=4, components=2, fit_steps=40, fit_batch_size=16, fit_draws=4, fit_lr=0.05,
            draws_per_input=8, budget=20_000)


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: intra-op threads only add contention, which on a busy machine slows
    the fits several-fold. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class WeakLinear(torch.nn.Module):
    """Two classes on R^16: logit difference z_1 - z_0 = w . (x - 1/2) with w = 1 (all ones)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D, 2)
        with torch.no_grad():
            self.fc.weight.copy_(torch.stack([-torch.ones(D), torch.ones(D)]) / 2)
            self.fc.bias.copy_(torch.tensor([D / 4, -D / 4]))

    def forward(self, x):
        return self.fc(x)


def weak_data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs with margin exactly 3 (half of each class), coordinates well inside [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    jitter = 0.04 * (torch.rand(n, D, generator=g) - 0.5)
    jitter -= jitter.mean(dim=1, keepdim=True)  # keeps w . x unchanged
    sign = (2 * y - 1).float()[:, None]
    return 0.5 + sign * 3 / D + jitter, y


def config(**overrides) -> GMMConfig:
    base = dict(eps=0.1, norm="linf", components=3, latent_dim=3, covariance="full",
                dependency="independent", input_shape=(D,), n_classes=2, feature_dim=None, grid_size=0)
    return GMMConfig(**{**base, **overrides})


def seeded_gmm(cfg: GMMConfig, seed: int = 0) -> GMMPerturbation:
    torch.manual_seed(seed)
    gmm = GMMPerturbation(cfg)
    with torch.no_grad():  # random, well-separated parameters instead of the near-identity init
        for p in gmm.parameters():
            p.normal_(0.0, 1.0)
    return gmm.eval()


# -- the budget map ---------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["linf", "l2"])
@pytest.mark.parametrize("shape, grid", [((D,), 0), ((3, 8, 8), 4), ((1, 4, 4), 4)])
def test_budget_map_never_leaves_the_ball_or_the_box(norm, shape, grid):
    eps = 0.2
    gmm = seeded_gmm(config(eps=eps, norm=norm, input_shape=shape, grid_size=grid))
    g = torch.Generator().manual_seed(1)
    x = torch.rand(64, *shape, generator=g)
    x[:8] = 0.0  # inputs on the faces of the box
    x[8:16] = 1.0
    z = 50 * torch.randn(64, 5, 3, generator=g)  # huge latents: tanh saturates, norms explode
    x_prime = gmm.apply(x, z, (0.0, 1.0))
    assert x_prime.shape == (64, 5, *shape)
    delta = (x_prime - x[:, None]).flatten(start_dim=2)
    assert x_prime.min() >= 0.0 and x_prime.max() <= 1.0
    if norm == "linf":
        assert delta.abs().max() <= eps
        assert delta.abs().max() > 0.99 * eps  # saturated: the whole radius is used
    else:
        norms = delta.norm(dim=-1)
        assert norms.max() <= eps * (1 + 1e-5)
        unclipped = ((x_prime > 0) & (x_prime < 1)).flatten(start_dim=2).all(dim=-1)
        assert unclipped.any()
        assert torch.allclose(norms[unclipped], torch.full_like(norms[unclipped], eps), rtol=1e-4)


def test_image_decoder_upsamples_a_coarse_grid_bicubically():
    gmm = seeded_gmm(config(input_shape=(3, 8, 8), grid_size=4, latent_dim=5))
    assert gmm.decoder.out_features == 3 * 4 * 4
    u = gmm.decode(torch.randn(2, 7, 5))
    assert u.shape == (2, 7, 3, 8, 8)
    coarse = gmm.decoder(torch.zeros(1, 5)).reshape(1, 3, 4, 4)
    expected = torch.nn.functional.interpolate(coarse, size=(8, 8), mode="bicubic", align_corners=False)
    assert torch.allclose(gmm.decode(torch.zeros(1, 1, 5))[0], expected)


# -- sampling from the frozen mixture --------------------------------------------------------------


def empirical_moments(z: torch.Tensor, chosen: torch.Tensor, k: int):
    zs = [z[chosen == j].double() for j in range(k)]
    return [s.mean(0) for s in zs], [torch.cov(s.T) for s in zs], [len(s) for s in zs]


@pytest.mark.parametrize("covariance", ["full", "diagonal"])
def test_hard_draws_match_the_mixture_parameters(covariance):
    k, d, n = 3, 3, 60_000
    gmm = seeded_gmm(config(components=k, latent_dim=d, covariance=covariance))
    with torch.no_grad():
        mix = gmm.mixture(None, torch.zeros(4, dtype=torch.long))
        weights = torch.softmax(mix.logits[0], dim=0).double()
        sigma = mix.covariance().double()
    assert mix.shared and mix.means.shape == (k, d)
    z, chosen = gmm.hard_latent(mix, n // 4, torch.Generator().manual_seed(2))
    z, chosen = z.reshape(-1, d), chosen.reshape(-1)
    means, covs, counts = empirical_moments(z, chosen, k)
    for j in range(k):
        p = float(weights[j])
        assert abs(counts[j] / n - p) <= 4 * math.sqrt(p * (1 - p) / n)
        se = (torch.diagonal(sigma[j]) / counts[j]).sqrt()
        assert ((means[j] - mix.means[j].double()).abs() <= 4.5 * se).all()
        # sample covariance entries: sd of s_ab is about sqrt((S_aa S_bb + S_ab^2) / n)
        sd = ((torch.diagonal(sigma[j])[:, None] * torch.diagonal(sigma[j])[None] + sigma[j] ** 2) / counts[j]).sqrt()
        assert ((covs[j] - sigma[j]).abs() <= 4.5 * sd).all()
    if covariance == "full":
        assert (sigma - torch.diag_embed(torch.diagonal(sigma, dim1=-2, dim2=-1))).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("covariance, dependency", [("full", "independent"), ("diagonal", "label"),
                                                    ("diagonal", "input"), ("full", "input")])
def test_one_hard_draw_per_block_is_torch_multinomials_draw(dtype, covariance, dependency):
    # the exponential race draws, number for number, what torch.multinomial draws for one sample,
    # then each block's generator draws the latent noise, and the chosen component's draw is
    # component_draws' (the learned gate's numbers)
    cfg = config(components=7, latent_dim=4, covariance=covariance, dependency=dependency, n_classes=3,
                 feature_dim=5 if dependency == "input" else None)
    gmm = seeded_gmm(cfg).to(dtype)
    with torch.no_grad():
        features = torch.randn(96, 5, generator=torch.Generator().manual_seed(3), dtype=dtype)
        mix = gmm.mixture(features if dependency == "input" else None, torch.arange(96) % 3)
        z, chosen = gmm.hard_latent_blocks(mix, 1, [torch.Generator().manual_seed(20 + j) for j in range(3)])
        probs = torch.softmax(mix.logits, dim=-1)
        for j in range(3):
            g, rows = torch.Generator().manual_seed(20 + j), slice(32 * j, 32 * (j + 1))
            expected = torch.multinomial(probs[rows], 1, replacement=True, generator=g)
            e = torch.randn((32, 1, 1, 4), generator=g, dtype=dtype).expand(-1, -1, 7, -1)
            block = Mixture(mix.logits[rows], *(t if mix.shared else t[rows] for t in (mix.means, mix.scale)))
            assert torch.equal(chosen[rows], expected) and len(set(expected.flatten().tolist())) > 2
            reference = block.component_draws(e)[torch.arange(32), 0, expected[:, 0]]
            if covariance == "diagonal":  # the same elementwise arithmetic
                assert torch.equal(z[rows, 0], reference)
            else:  # a matrix product over 96 rows or over 32 may sum in another order
                assert torch.allclose(z[rows, 0], reference, rtol=1e-5, atol=1e-6)


def test_input_dependent_mixture_differs_per_input_and_draws_match_each_row():
    k, d = 2, 2
    torch.manual_seed(0)
    gmm = GMMPerturbation(config(components=k, latent_dim=d, dependency="input", feature_dim=5)).eval()
    with torch.no_grad():  # heads that depend on the features clearly, weights away from 0 and 1
        gmm.components.out.weight.normal_(0.0, 0.3)
        gmm.weights.out.weight.normal_(0.0, 0.1)
    features = torch.randn(2, 5, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        mix = gmm.mixture(features, torch.zeros(2, dtype=torch.long))
    assert not mix.shared and mix.means.shape == (2, k, d) and mix.scale.shape == (2, k, d, d)
    assert not torch.allclose(mix.means[0], mix.means[1])
    z, chosen = gmm.hard_latent(mix, 40_000, torch.Generator().manual_seed(4))
    for row in range(2):
        means, _, counts = empirical_moments(z[row], chosen[row], k)
        weights = torch.softmax(mix.logits[row], dim=0)
        for j in range(k):
            assert abs(counts[j] / 40_000 - float(weights[j])) < 0.015
            se = (torch.diagonal(mix.covariance()[row, j]) / counts[j]).sqrt().double()
            assert ((means[j] - mix.means[row, j].double()).abs() <= 4.5 * se).all()


def test_relaxed_draws_are_differentiable_and_approach_hard_draws_at_low_temperature():
    gmm = seeded_gmm(config(components=3, latent_dim=3))
    mix = gmm.mixture(None, torch.zeros(8, dtype=torch.long))
    z = gmm.relaxed_latent(mix, 4, 0.5, torch.Generator().manual_seed(5))
    z.sum().backward()
    assert all(p.grad is not None for p in gmm.components.parameters())
    assert gmm.weights.value.grad is not None and gmm.weights.value.grad.abs().sum() > 0
    # at temperature -> 0 each relaxed draw is one component's draw: its distance to the nearest
    # mu_k + L_k e_k (same noise) vanishes
    g = torch.Generator().manual_seed(6)
    cold = gmm.relaxed_latent(mix, 4, 1e-4, g).detach()
    g = torch.Generator().manual_seed(6)
    per_component = mix.component_draws(torch.randn((8, 4, 3, 3), generator=g)).detach()
    nearest = (per_component - cold[:, :, None]).norm(dim=-1).min(dim=-1).values
    assert nearest.max() < 1e-3


# -- the estimator ---------------------------------------------------------------------------------


def test_known_weak_direction_gives_nppr_far_below_gaussian_pr():
    r = nppr(WeakLinear(), weak_data(), eps=0.3, dependency="label", pgd=True, **TINY)
    ctx = r.details["context"]
    assert r.metric == "nppr" and r.verdict == "estimate"
    assert ctx["gaussian_pr"] > 0.95 and ctx["uniform_pr"] > 0.99
    assert r.upper < 0.3, r.message()
    assert ctx["pgd_accuracy"] == 0.0
    assert ctx["pgd_accuracy"] <= r.estimate <= min(ctx["gaussian_pr"], ctx["uniform_pr"])
    loss = r.details["curves"]["fit_loss"]["series"]["loss"]
    assert loss[-1] < loss[0] / 3


def test_gate_fails_a_model_that_only_random_noise_cannot_break():
    r = nppr(WeakLinear(), weak_data(), threshold=0.9, eps=0.3, dependency="label", **TINY)
    assert r.verdict == "fail" and r.draws < 2000
    message = r.message()
    assert message.startswith("NPPR ") and "< required 0.9" in message
    assert "upper estimate of the true NPPR infimum" in message
    assert "a pass certifies PR under this learned distribution" in message
    assert "LearnedGMM(eps=0.3, norm=linf, K=2, latent=4, covariance=diagonal, dependency=label)" in message


def test_gate_passes_when_the_ball_is_too_small_to_matter():
    r = nppr(WeakLinear(), weak_data(), threshold=0.9, eps=0.02, **TINY)  # max margin change 0.32 < 3
    assert r.verdict == "pass" and r.estimate == 1.0
    assert r.details["per_input_pr"]["fraction_pr_at_least_0.99"] == 1.0


def test_result_reports_split_context_curve_and_per_input_fractions():
    x, y = weak_data(n=50)
    r = nppr(WeakLinear(), (x, y), eps=0.15, fit_fraction=0.3, **TINY)
    d = r.details
    assert d["split"]["fit_inputs"] == 15 and d["split"]["eval_inputs"] == 35 == r.n_inputs
    assert "fit_fraction=0.3" in d["split"]["source"]
    assert d["semantics"] in r.note
    fractions = [d["per_input_pr"][f"fraction_pr_at_least_{level}"] for level in ("0.9", "0.95", "0.99")]
    assert all(0 <= f <= 1 for f in fractions) and fractions[0] >= fractions[1] >= fractions[2]
    curve = d["curves"]["fit_loss"]
    assert set(curve) == {"title", "xlabel", "ylabel", "x", "series", "logx"}
    assert curve["logx"] is False and len(curve["x"]) == len(curve["series"]["loss"]) == TINY["fit_steps"]
    assert d["context"]["gaussian_perturbation"] == "ProjectedGaussian(sigma=0.15, linf ball eps=0.15)"
    assert d["context"]["uniform_perturbation"] == "UniformLinf(eps=0.15)"
    assert d["context"]["pgd_accuracy"] is None
    assert r.forward_passes > r.draws
    assert d["fit"]["forward_passes"] == 40 * 16 * 4
    json.dumps(r.to_dict())  # travels on pytest reports


def test_fit_split_and_evaluation_split_are_disjoint_and_seeded():
    x, y = weak_data(n=40)
    x[:, 0] = torch.arange(40) / 100 + 0.3  # make every row identifiable

    def split(seed):
        return split_data(bare_run("nppr", WeakLinear(), (x, y), NPPR, seed=seed), None, 0.5, (0.0, 1.0))

    fit, ev, _, index = split(3)
    assert len(fit) == len(ev) == 20
    assert not set(fit.x[:, 0].tolist()) & set(ev.x[:, 0].tolist())
    assert torch.equal(ev.x, x[index])  # the evaluation inputs' indices in the data
    again, _, _, _ = split(3)
    other, _, _, _ = split(4)
    assert torch.equal(fit.x, again.x) and not torch.equal(fit.x, other.x)


def test_fit_data_is_used_as_given_and_overlap_warns():
    train, test = weak_data(n=40, seed=1), weak_data(n=30, seed=2)
    r = nppr(WeakLinear(), test, eps=0.1, fit_data=train, **TINY)
    assert r.details["split"] == {"source": "fit_data", "fit_inputs": 40, "eval_inputs": 30}
    with pytest.warns(RobustWarning, match="10 of the 30 evaluation inputs also occur in fit_data"):
        nppr(WeakLinear(), test, eps=0.1, fit_data=(test[0][:10], test[1][:10]), **TINY)


@pytest.mark.parametrize("dependency", ["independent", "label", "input", "joint"])
@pytest.mark.parametrize("covariance", ["full", "diagonal"])
def test_every_dependency_and_covariance_runs_on_images(dependency, covariance):
    x, y = image_data(n=48, channels=3, size=8)
    model = SmallNet(channels=3, size=8).eval()
    r = nppr(model, (x, y), eps=0.1, dependency=dependency, covariance=covariance,
             **{**TINY, "fit_steps": 5})
    assert 0.0 <= r.lower <= r.estimate <= r.upper <= 1.0
    assert r.details["mixture"]["dependency"] == dependency
    assert r.details["mixture"]["grid_size"] == 4
    if dependency in ("input", "joint"):
        assert r.details["feature_layer"] == "input of fc (the last Linear layer)"
        assert r.details["mixture"]["feature_dim"] == 3 * 8 * 8


def test_named_feature_layer_uses_that_layers_output():
    x, y = image_data(n=32, channels=3, size=4)
    r = nppr(SmallNet().eval(), (x, y), eps=0.1, dependency="input", feature_layer="fc", **{**TINY, "fit_steps": 3})
    assert r.details["feature_layer"] == "output of fc" and r.details["mixture"]["feature_dim"] == 3


def test_l2_ball_runs_with_l2_context():
    r = nppr(WeakLinear(), weak_data(), eps=1.5, norm="l2", dependency="label", **TINY)
    ctx = r.details["context"]
    assert ctx["uniform_perturbation"] == "UniformL2(eps=1.5)"
    assert ctx["gaussian_perturbation"] == "ProjectedGaussian(sigma=0.375, l2 ball eps=1.5)"  # eps / sqrt(16)
    # the worst L2 direction lowers the margin by eps ||w||_2 = 6 > 3; random directions by ~1.5
    assert r.estimate < 0.5 < min(ctx["gaussian_pr"], ctx["uniform_pr"])


def test_results_do_not_depend_on_batch_size():
    a = nppr(WeakLinear(), weak_data(), eps=0.2, batch_size=1024, **TINY)
    b = nppr(WeakLinear(), weak_data(), eps=0.2, batch_size=48, **TINY)
    assert (a.estimate, a.draws, a.details["per_input"]) == (b.estimate, b.draws, b.details["per_input"])


# -- the classifier is left as it was ---------------------------------------------------------------


def test_classifier_weights_mode_and_requires_grad_are_unchanged():
    x, y = image_data(n=40)
    model = SmallNet()
    model.train()
    model.drop.eval()  # a mix of modes
    model.norm.weight.requires_grad_(False)  # a mix of flags
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = {name: m.training for name, m in model.named_modules()}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    global_rng = torch.get_rng_state()
    with pytest.warns(RobustWarning, match="training mode"):
        nppr(model, (x, y), eps=0.1, dependency="joint", pgd=True, **{**TINY, "fit_steps": 10})
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), global_rng)


# -- caching ------------------------------------------------------------------------------------------


def same_numbers(a, b) -> bool:
    """The same verdict, bounds, draws, context and fitted mixture (the fit's loss curve)."""
    keys = ("estimate", "lower", "upper", "draws", "verdict", "n_inputs")
    return all(getattr(a, k) == getattr(b, k) for k in keys) and all(
        a.details[k] == b.details[k] for k in ("per_input", "context", "curves")
    )


def test_cache_miss_then_hit_skips_the_fit_with_identical_results(tmp_path, monkeypatch):
    from pytest_robust.checks.nppr import fit as gmm_fit

    first = nppr(WeakLinear(), weak_data(), threshold=0.5, eps=0.3, cache_dir=str(tmp_path), **TINY)
    assert first.details["cache"] == "miss"
    (entry,) = tmp_path.glob("nppr-*.pt")
    assert first.details["cache_file"] == str(entry)

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted although the cache holds this model and settings")

    monkeypatch.setattr(gmm_fit, "fit_mixture", no_fit)
    second = nppr(WeakLinear(), weak_data(), threshold=0.5, eps=0.3, cache_dir=str(tmp_path), **TINY)
    assert second.details["cache"] == "hit" and "cache: hit" in second.message()
    assert same_numbers(first, second)
    assert second.forward_passes == first.forward_passes  # the cached fit is charged as a fresh one
    assert second.details["evaluations"] == first.details["evaluations"]


def test_a_cached_fit_buys_no_extra_draws(tmp_path):
    """Without a threshold the stream spends what the budget leaves: a cached fit that were not
    charged would leave more, and the hit would report other numbers than the miss."""
    miss = nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path), **TINY)
    hit = nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path), **TINY)
    off = nppr(WeakLinear(), weak_data(), eps=0.3, **TINY)
    assert (miss.details["cache"], hit.details["cache"], off.details["cache"]) == ("miss", "hit", "off")
    for other in (hit, off):
        assert same_numbers(miss, other) and other.forward_passes == miss.forward_passes


def test_cache_key_covers_weights_and_settings(tmp_path):
    nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path), **TINY)
    changed = WeakLinear()
    with torch.no_grad():
        changed.fc.bias[0] += 1e-3
    assert nppr(changed, weak_data(), eps=0.3, cache_dir=str(tmp_path), **TINY).details["cache"] == "miss"
    for setting in (dict(eps=0.25), dict(eps=0.3, seed=1), dict(eps=0.3, kappa=2.0), dict(eps=0.3, fit_fraction=0.25)):
        r = nppr(WeakLinear(), weak_data(), cache_dir=str(tmp_path), **{**TINY, **setting})
        assert r.details["cache"] == "miss", setting
    assert len(list(tmp_path.glob("nppr-*.pt"))) == 6
    # settings that only affect the evaluation reuse the fit
    r = nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path),
             **{**TINY, "draws_per_input": 4, "budget": 9999})
    assert r.details["cache"] == "hit"


def test_refit_forces_a_new_fit(tmp_path):
    first = nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path), **TINY)
    again = nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path), refit=True, **TINY)
    assert again.details["cache"] == "refit" and same_numbers(first, again)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_key", "wrong_shapes", "not_a_dict"])
def test_corrupt_or_mismatched_entries_are_refitted_with_a_warning(tmp_path, damage):
    first = nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path), **TINY)
    (path,) = tmp_path.glob("nppr-*.pt")
    entry = torch.load(path, weights_only=True)
    if damage == "garbage":
        path.write_bytes(b"not a torch file")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "wrong_key":
        torch.save({**entry, "key": "0" * 64}, path)
    elif damage == "wrong_shapes":
        torch.save({**entry, "state": {k: v.reshape(-1)[:1] for k, v in entry["state"].items()}}, path)
    else:
        torch.save([1, 2, 3], path)
    with pytest.warns(RobustWarning, match="refitting the perturbation model"):
        again = nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path), **TINY)
    assert again.details["cache"] == "invalid (refitted)" and same_numbers(first, again)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refitted entry was stored and is now trusted
        assert nppr(WeakLinear(), weak_data(), eps=0.3, cache_dir=str(tmp_path), **TINY).details["cache"] == "hit"


def test_cache_entries_load_without_running_code(tmp_path):
    """Entries are read with weights_only=True: a pickle that would run code is rejected."""
    path = tmp_path / "entry.pt"

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"format": cache.FORMAT, "key": "k", "state": Evil()}, path)
    entry, state = cache.load(path, "k")
    assert entry is None and state.startswith("invalid: unreadable")


# -- determinism --------------------------------------------------------------------------------------


def test_same_seed_same_numbers_other_seed_other_fit():
    a = nppr(WeakLinear(), weak_data(), eps=0.2, seed=5, **TINY)
    b = nppr(WeakLinear(), weak_data(), eps=0.2, seed=5, **TINY)
    c = nppr(WeakLinear(), weak_data(), eps=0.2, seed=6, **TINY)
    assert same_numbers(a, b)
    assert a.details["curves"]["fit_loss"]["series"] != c.details["curves"]["fit_loss"]["series"]


# -- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(eps=0.0), "eps=0.0 is invalid: expected a finite number > 0"),
        (dict(eps=-0.1), "eps=-0.1 is invalid"),
        (dict(eps=0.1, components=0), "components=0 is invalid: expected an integer >= 1"),
        (dict(eps=0.1, latent_dim=2.5), "latent_dim=2.5 is invalid"),
        (dict(eps=0.1, dependency="pixel"),
         "dependency='pixel' is invalid: expected independent or label or input or joint"),
        (dict(eps=0.1, covariance="sparse"), "covariance='sparse' is invalid: expected full or diagonal"),
        (dict(eps=0.1, norm="l1"), "norm='l1' is invalid: expected linf or l2"),
        (dict(eps=0.1, feature_layer="backbone"),
         "feature_layer='backbone' is invalid: expected the name of a layer of the model, one of: fc"),
        (dict(eps=0.1, fit_fraction=1.0), "fit_fraction=1.0 is invalid"),
        (dict(eps=0.1, fit_fraction=0.001), "fit_fraction=0.001 is invalid: expected a fraction that leaves"),
        (dict(eps=0.1, fit_data="train_data"), "fit_data='train_data' is invalid: expected a data object"),
        (dict(eps=0.1, norm="l2", pgd=True), "pgd=True is invalid"),
        (dict(eps=0.1, fit_temperature=(1.0, 0.0)),
         "fit_temperature=(1.0, 0.0) is invalid: expected a pair (start, end) of numbers > 0"),
        (dict(eps=0.1, fit_steps=0), "fit_steps=0 is invalid"),
    ],
)
def test_bad_settings_name_the_key_and_accepted_values(kwargs, expected):
    with pytest.raises(SettingError) as info:
        nppr(WeakLinear(), weak_data(), **kwargs)
    assert expected in str(info.value)


def test_input_dependency_without_a_linear_layer_reads_the_logits():
    class NoLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            return torch.stack([-x.sum(1), x.sum(1)], dim=1) * self.w

    r = nppr(NoLinear(), weak_data(), eps=0.1, dependency="input", **TINY)
    assert r.details["feature_layer"].startswith("the model's logits (it has no nn.Linear layer")


def test_inputs_outside_the_box_are_rejected():
    x, y = weak_data()
    with pytest.raises(RobustDataError, match="outside the perturbation's box bounds"):
        nppr(WeakLinear(), (x * 4, y), eps=0.1, **TINY)


def test_frozen_mixture_is_a_conditional_perturbation_of_rows_and_labels():
    """The engine hands the learned distribution each row's index and label (no keyed rows): draws
    stay in the eps-ball, depend on the labels, and come from the generator alone."""
    x = torch.rand(300, D)
    y = torch.arange(300) % 2
    gmm = seeded_gmm(config(dependency="label"))
    frozen = FrozenGMM(gmm, None, (0.0, 1.0))
    assert frozen.conditional
    index = torch.arange(300)
    out = frozen.draw(x, torch.Generator().manual_seed(0), index, y)
    assert out.shape == x.shape and (out - x).abs().max() <= 0.1 + 1e-6
    assert torch.equal(out, frozen.draw(x, torch.Generator().manual_seed(0), index, y))
    assert not torch.equal(out, frozen.draw(x, torch.Generator().manual_seed(0), index, 1 - y))


def test_the_headline_uses_every_draw_of_the_learned_distribution_it_paid_for():
    """One stream carries the gate and per-input PR: even when the gate decides after a handful of
    draws, the estimate and bounds rest on all n x draws_per_input draws, and per-input PR is read
    from the same draws (their count-weighted mean is the estimate)."""
    x, y = weak_data()
    r = nppr(WeakLinear(), (x, y), threshold=0.2, eps=0.3, dependency="label", **{**TINY, "draws_per_input": 8})
    n_eval = r.n_inputs
    assert r.verdict in ("pass", "fail") and r.draws >= 8 * n_eval
    assert r.details["per_input_pr"]["draws"] == pytest.approx(r.draws / n_eval)
    table = r.details["per_input"]
    drawn = [e for e in table["estimate"] if e is not None]
    assert len(drawn) == r.details["per_input_pr"]["inputs_drawn"] and len(table["estimate"]) == n_eval
    assert r.lower <= r.estimate <= r.upper and r.upper - r.lower < 0.2
