"""pytest_robust.perturbations.corruptions: the box, dtypes, reproducibility, strength, the reference, errors."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pytest_robust import Corruption, corruption_names
from pytest_robust.engine.host_syncs import count_host_syncs
from pytest_robust.perturbations.corruptions import NEEDS_COLOUR, NEEDS_MIN_SIDE, CorruptionGrid
from pytest_robust.perturbations.corruptions._ops import fast_length, filter2d
from pytest_robust.perturbations.corruptions.digital import jpeg_compression, pixelate
from pytest_robust.perturbations.corruptions.jpeg import jpeg
from pytest_robust.perturbations.corruptions.tables import TABLES

ALL = corruption_names()


def gen(seed: int = 0, device="cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@pytest.fixture(scope="module")
def photos():
    """Two real photographs (scikit-learn's china and flower), square crops in [0, 1]."""
    from sklearn.datasets import load_sample_images

    x = torch.tensor(np.stack(load_sample_images().images)).permute(0, 3, 1, 2).float() / 255
    return x[:, :, :, 100:527].contiguous()


def resized(x, side):
    return F.interpolate(x, size=(side, side), mode="area").clamp(0, 1)


def test_names():
    assert len(corruption_names("benchmark")) == 15 and len(corruption_names("extra")) == 4
    assert corruption_names() == corruption_names("benchmark") + corruption_names("extra")
    assert set(TABLES) == set(ALL)
    for name, table in TABLES.items():
        assert set(table) == {"imagenet", "cifar"} and all(len(rows) == 5 for rows in table.values()), name


# ---------------------------------------------------------------------------------------------
# every corruption x severity x preset: shape, dtype, device and the box
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["cifar", "imagenet"])
@pytest.mark.parametrize("name", ALL)
def test_keeps_shape_dtype_and_box(name, preset):
    x = torch.rand(3, 3, 36, 36, generator=gen(1))
    x[0] = 0.0  # images on the edges of the box
    x[1, :, :18] = 1.0
    for severity in range(1, 6):
        out = Corruption(name, severity, preset=preset)(x, gen(severity))
        assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
        assert torch.isfinite(out).all() and out.min() >= 0 and out.max() <= 1, (name, severity)
        assert not torch.equal(out[2], x[2]), (name, severity)  # it did something


@pytest.mark.parametrize("name", ALL)
def test_other_dtypes_grey_images_and_boxes(name):
    x = torch.rand(2, 3, 32, 32, generator=gen(2))
    double = Corruption(name, 3)(x.double(), gen(0))
    assert double.dtype == torch.float64
    half = Corruption(name, 3)(x.half(), gen(0))
    assert half.dtype == torch.float16 and torch.isfinite(half).all()
    # a box (lo, hi) is mapped to [0, 1] and back: same corruption, rescaled
    boxed = Corruption(name, 3, bounds=(-1.0, 1.0))(x * 2 - 1, gen(0))
    torch.testing.assert_close(boxed, Corruption(name, 3)(x, gen(0)) * 2 - 1, atol=2e-5, rtol=0)
    if name not in NEEDS_COLOUR:
        grey = Corruption(name, 3)(x[:, :1], gen(0))
        assert grey.shape == (2, 1, 32, 32) and grey.min() >= 0 and grey.max() <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ALL)
def test_cuda(name):
    x = torch.rand(4, 3, 64, 64, device="cuda", generator=gen(0, "cuda"))
    out = Corruption(name, 4)(x, gen(1, "cuda"))
    assert out.device == x.device and out.dtype == x.dtype and out.min() >= 0 and out.max() <= 1
    torch.testing.assert_close(out, Corruption(name, 4)(x, gen(1, "cuda")))


# ---------------------------------------------------------------------------------------------
# reproducibility
# ---------------------------------------------------------------------------------------------

#: Corruptions with no random choice.
DETERMINISTIC = {"defocus_blur", "zoom_blur", "brightness", "contrast", "pixelate", "jpeg_compression",
                 "gaussian_blur", "saturate"}


@pytest.mark.parametrize("name", ALL)
def test_reproducible_from_the_generator(name):
    x = torch.rand(3, 3, 40, 40, generator=gen(3))
    c = Corruption(name, 4)
    a, b = c(x, gen(7)), c(x, gen(7))
    assert torch.equal(a, b)
    g = gen(7)
    state = g.get_state()
    first = c(x, g)
    g.set_state(state)
    assert torch.equal(c(x, g), first)
    if name not in DETERMINISTIC:
        assert not torch.equal(c(x, gen(8)), a)


def test_batch_size_does_not_change_a_check():
    """The engine draws perturbations in fixed blocks, one generator each: a TSRM check under a
    corruption gives the same numbers whatever the batch size."""
    from pytest_robust import tsrm

    x = torch.rand(40, 3, 32, 32, generator=gen(4))
    y = (x.mean((1, 2, 3)) > 0.5).long()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2))
    torch.nn.init.normal_(model[1].weight, std=0.01, generator=gen(0))
    runs = [tsrm(model, (x, y), perturbation=Corruption("snow", 2), budget=600, batch_size=b, seed=3)
            for b in (64, 512)]
    assert runs[0].estimate == runs[1].estimate and runs[0].details["correct"] == runs[1].details["correct"]


# ---------------------------------------------------------------------------------------------
# strength: increases with severity, and the math of the simple ones
# ---------------------------------------------------------------------------------------------


def change(x, y):
    return float((y - x).abs().mean())


def decorrelation(x, y):
    """1 - Pearson correlation of each image with its corruption, averaged."""
    a, b = x.flatten(1), y.flatten(1)
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return float(1 - ((a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))).mean())


#: Strength measure per corruption (default: the mean absolute change). Frost's table trades image
#: weight against frost weight, so a layer's brightness offsets the darkening; its decorrelation
#: from the image grows.
MEASURES = {"frost": decorrelation}
#: Severity steps (s, s + 1) along which the reference table itself does not grow (not tested).
NOT_ORDERED = {
    # glass: sev 1 (sigma 0.7, d 1, 2 sweeps) vs sev 2 (0.9, 2, 1); sev 3 (1, 2, 3) vs sev 4 (1.1, 3, 2)
    ("imagenet", "glass_blur"): {1, 3},
    # fog: sev 3 and 4 have the same strength 2.5 (only roughness changes)
    ("imagenet", "fog"): {3},
    # pixelate 0.6 vs 0.5 at 72 px: a 43-px grid stretched unevenly vs a 36-px one stretched 2x
    ("imagenet", "pixelate"): {1},
    # frost: sev 3 (0.7, 0.7) and sev 4 (0.65, 0.7) differ by 0.05 image weight
    ("imagenet", "frost"): {3},
    ("cifar", "frost"): {3},
    # saturate: severities 1-2 desaturate (x0.3, x0.1), 3-5 saturate (x2 / x1.5 and up)
    ("imagenet", "saturate"): {2},
    ("cifar", "saturate"): {2, 3},
    # glass (0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)
    ("cifar", "glass_blur"): {1, 2, 4},
    # motion (8, 2) at sev 4 vs (6, 2): the extra taps weigh exp(-i^2/8) ~ 0
    ("cifar", "motion_blur"): {3},
    # elastic: severity 1 is the largest affine jitter (0.08 of the side), later ones shrink it
    ("cifar", "elastic_transform"): {1, 2, 3, 4},
    # pixelate at 32 px: 30- and 28-px grids (0.95, 0.9) stretched back with uneven blocks
    ("cifar", "pixelate"): {1},
    # spatter: 1-3 water, 4-5 mud
    ("cifar", "spatter"): {3},
    ("cifar", "snow"): {2},  # (0.1, 0.2, zoom 1, threshold 0.5) vs (0.15, 0.3, 1.75, 0.55)
}


@pytest.mark.parametrize("preset,side", [("imagenet", 72), ("cifar", 32)])
def test_strength_grows_with_severity(photos, preset, side):
    x = resized(photos, side)
    failures = []
    for name in ALL:
        measure = MEASURES.get(name, change)
        strength = [np.mean([measure(x, Corruption(name, s, preset)(x, gen(seed))) for seed in range(3)])
                    for s in range(1, 6)]
        skip = NOT_ORDERED.get((preset, name), set())
        for s in range(1, 5):
            if s not in skip and strength[s] < strength[s - 1] * 0.98:
                failures.append(f"{name} {s}->{s + 1}: {strength[s - 1]:.4f} -> {strength[s]:.4f}")
        if (preset, name) != ("cifar", "elastic_transform") and strength[4] <= strength[0]:
            failures.append(f"{name} 1->5: {strength[0]:.4f} -> {strength[4]:.4f}")
    assert not failures, failures


def test_simple_corruptions_follow_their_formulas():
    x = torch.rand(4, 3, 80, 80, generator=gen(5))
    out = Corruption("gaussian_noise", 1, "imagenet").sample(x * 0.5 + 0.25, gen(1))  # no clipping here
    assert abs(float((out - (x * 0.5 + 0.25)).std()) - 0.08) < 0.002
    flipped = Corruption("impulse_noise", 5, "imagenet")(x, gen(2)) != x
    assert abs(float(flipped.float().mean()) - 0.27) < 0.01
    m = x.mean((2, 3), keepdim=True)
    torch.testing.assert_close(Corruption("contrast", 2, "imagenet")(x, gen(0)), m + 0.3 * (x - m))
    grey = x[:, :1]
    torch.testing.assert_close(Corruption("brightness", 3, "imagenet")(grey, gen(0)), (grey + 0.3).clamp(max=1))
    # brightness and saturate keep the hue: channel order of every pixel unchanged
    for name in ("brightness", "saturate"):
        out = Corruption(name, 4, "imagenet")(x, gen(0))
        keep = (out.argsort(1) == x.argsort(1)) | (out.amax(1, keepdim=True) - out.amin(1, keepdim=True) < 1e-4)
        assert keep.float().mean() > 0.99, name
    shot = Corruption("shot_noise", 1, "imagenet")(x, gen(3)) * 60  # photon counts
    assert torch.allclose(shot, shot.round(), atol=1e-3)


def test_grid_cells_are_uniform_and_recomputable():
    grid = CorruptionGrid(["fog", "contrast"], [1, 3])
    assert grid.grid == [("fog", 1), ("fog", 3), ("contrast", 1), ("contrast", 3)]
    cells = grid.cells(4000, gen(0))
    counts = torch.bincount(cells, minlength=4).float() / 4000
    assert (counts - 0.25).abs().max() < 0.03
    x = torch.rand(64, 3, 32, 32, generator=gen(6))
    g = gen(9)
    state = g.get_state()
    out = grid(x, g)
    g.set_state(state)
    cells = grid.cells(64, g)
    for k, member in enumerate(grid.members):  # each row got its cell's corruption
        rows = cells == k
        if member.name == "contrast":
            torch.testing.assert_close(out[rows], member(x[rows], gen(0)))
    assert repr(grid) == "CorruptionGrid(corruptions=[fog, contrast], severities=[1, 3])"


def test_grid_draw_is_a_call_without_the_box_check():
    """The engine's draw gives a call's images; it checks shapes for every corruption of the grid
    (whichever cells are drawn) but not the values, which the engine checked once per check.
    JPEG's cells, coded together over severities, match each severity's own call."""
    x = torch.rand(64, 3, 32, 32, generator=gen(6))
    grid = CorruptionGrid(["fog", "jpeg_compression", "contrast"], [1, 5])
    out = grid(x, gen(9))
    assert torch.equal(grid.draw(x, gen(9), None, None), out)
    cells = grid.cells(64, gen(9))
    for k, member in enumerate(grid.members):
        if member.name != "fog":
            assert torch.equal(out[cells == k], member(x[cells == k], gen(0))), member
    snow = Corruption("snow", 2)
    assert torch.equal(snow.draw(x, gen(1), None, None), snow(x, gen(1)))
    with pytest.raises(ValueError, match="must lie in the box"):
        grid(x * 2, gen(0))
    assert grid.draw(x * 2, gen(0), None, None).max() <= 1
    with pytest.raises(ValueError, match="saturate .* needs RGB"):
        CorruptionGrid(["contrast", "saturate"]).draw(x[:1, :1], gen(0), None, None)


def pillow_jpeg(x: torch.Tensor, qualities) -> torch.Tensor:
    """The CPU path of JPEG written out: each image rounded to 8 bits, coded by Pillow at its
    quality (grey as one luma component, RGB with Pillow's default 4:2:0 chroma), decoded, / 255."""
    from PIL import Image

    out = []
    for image, quality in zip(x, qualities):
        levels = (image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        buffer = io.BytesIO()
        Image.fromarray(levels[..., 0] if len(image) == 1 else levels).save(buffer, format="JPEG", quality=quality)
        decoded = np.array(Image.open(buffer)).reshape(levels.shape)
        out.append(torch.from_numpy(decoded).permute(2, 0, 1).float() / 255)
    return torch.stack(out)


def test_fft_lengths_are_the_next_5_smooth_numbers():
    def smooth(m):
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        return m == 1

    for n in range(1, 700):
        length = fast_length(n)
        assert length >= n and smooth(length) and not any(smooth(m) for m in range(n, length)), n


@pytest.mark.parametrize("shape, k, shared", [((2, 3, 37, 41), 17, False), ((1, 3, 224, 224), 21, True),
                                               ((3, 1, 9, 30), 5, False)])
def test_fft_filter_is_the_direct_correlation_with_replicated_borders(shape, k, shared):
    """At FFT lengths longer than the padded image (37 + 16 = 53 -> 54, 224 + 20 = 244 -> 250),
    the result is the plain correlation: the zeros past the padding reach no pixel of the crop.
    The FFT's float32 rounding on values in [0, 1] is about 1e-6."""
    x = torch.rand(shape, generator=gen(2))
    kernels = torch.rand((1 if shared else shape[0], k, k), generator=gen(3))
    kernels = kernels / kernels.sum((1, 2), keepdim=True)
    padded = F.pad(x, (k // 2,) * 4, mode="replicate")
    direct = torch.cat([F.conv2d(padded[i:i + 1].transpose(0, 1), kernels[0 if shared else i][None, None])
                        for i in range(shape[0])]).reshape(shape)
    assert torch.allclose(filter2d(x, kernels), direct, atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", [(3, 1, 8, 8), (2, 1, 13, 21), (3, 3, 32, 32), (2, 3, 37, 41), (2, 3, 28, 28),
                                   (1, 3, 100, 36), (2, 3, 32, 4), (1, 3, 9, 5), (2, 1, 6, 4)])
def test_jpeg_is_pillows_codec_bit_for_bit(shape):
    """Grey and RGB images, any size (even heights that are not whole 16-px MCUs, whose chroma
    padding differs; widths of 4 px or less, whose chroma is not upsampled by the fancy filter),
    one quality or one per image: Pillow's result exactly, on the CPU path (torchvision's bindings
    of the same libjpeg-turbo) and on the batched tensor codec that other devices run, and that a
    CPU runs when torchvision has no JPEG codec. (Both are integer arithmetic, so exact equality
    holds on every machine.)"""
    x = torch.rand(shape, generator=gen(0))
    for severity in (1, 5):
        c = Corruption("jpeg_compression", severity)
        quality = TABLES["jpeg_compression"][c.preset_for(x)][severity - 1]
        assert torch.equal(c(x, gen(0)), pillow_jpeg(x, [quality] * len(x)))
    qualities = [90, 40, 7][: len(x)]
    assert torch.equal(jpeg_compression(x, qualities, None, "cifar"), pillow_jpeg(x, qualities))
    for batch_qualities in ([100] * len(x), [1] * len(x), [95, 50, 3][: len(x)], qualities):
        assert torch.equal(jpeg(x, batch_qualities), pillow_jpeg(x, batch_qualities)), batch_qualities
    with pytest.MonkeyPatch.context() as patch:  # a torchvision without the (deprecated) codec bindings
        patch.setattr("pytest_robust.perturbations.corruptions.digital.libjpeg", lambda: None)
        assert torch.equal(jpeg_compression(x, qualities, None, "cifar"), pillow_jpeg(x, qualities))
    for dtype in (torch.float16, torch.bfloat16):  # quantised from x's own values, returned in its dtype
        low = x.to(dtype)
        expected = pillow_jpeg(low.float(), qualities).to(dtype)
        assert torch.equal(jpeg_compression(low, qualities, None, "cifar"), expected)
        assert torch.equal(jpeg(low, qualities), expected)  # the tensor codec of other devices too


def test_jpeg_tensor_codec_on_photographs_and_in_half_precision():
    """The tensor codec equals Pillow on a smooth image (where quantisation keeps many
    coefficients, unlike noise) at every ImageNet-C quality, and returns x's dtype."""
    x = torch.nn.functional.interpolate(torch.rand(2, 3, 9, 9, generator=gen(1)), size=(67, 90), mode="bicubic")
    x = x.clamp(0, 1)
    for quality in TABLES["jpeg_compression"]["imagenet"] + (80, 98):
        assert torch.equal(jpeg(x, [quality] * 2), pillow_jpeg(x, [quality] * 2)), quality
    for dtype in (torch.float16, torch.bfloat16):
        assert jpeg(x.to(dtype), [50, 50]).dtype == dtype


@pytest.mark.parametrize("shape, factor", [((2, 3, 224, 224), 0.6), ((1, 3, 224, 224), 0.25), ((2, 1, 32, 32), 0.95),
                                           ((1, 3, 32, 32), 0.65), ((1, 1, 37, 53), 0.5), ((1, 1, 41, 29), 0.3)])
def test_pixelate_is_pillows_box_then_nearest(shape, factor):
    """Pixelate equals Pillow's BOX downsampling and nearest upsampling on 32-bit float images
    (mode "F": no rounding to 8 bits), to float32 rounding (1e-5 on values in [0, 1]), on these
    sizes (nearest upsampling at pixel centres can round a centre that falls exactly on an edge
    to the other neighbour than Pillow in some sizes; the downsampling is Pillow's everywhere)."""
    from PIL import Image

    x = torch.rand(shape, generator=gen(2))
    h, w = shape[-2:]
    expected = torch.stack([torch.stack([
        torch.from_numpy(np.asarray(Image.fromarray(plane.numpy(), mode="F")
                                    .resize((int(w * factor), int(h * factor)), Image.BOX)
                                    .resize((w, h), Image.NEAREST)).copy())
        for plane in image]) for image in x])
    torch.testing.assert_close(pixelate(x, factor, None, "imagenet"), expected, rtol=0, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_jpeg_is_the_cpus_and_the_grid_never_waits():
    """On CUDA, JPEG of grey and RGB images gives the CPU's numbers exactly (the tensor codec on
    the device), and a grid's draw never waits for the device (cells and seeds come from a host
    generator; constant tables are uploaded on first use)."""
    for channels in (1, 3):
        x = torch.rand(5, channels, 37, 32, generator=gen(0))
        c = Corruption("jpeg_compression", 3)
        assert torch.equal(c(x.cuda(), gen(0, "cuda")).cpu(), c(x, gen(0)))
    x = torch.rand(256, 3, 32, 32, device="cuda", generator=gen(0, "cuda"))
    for names in (["fog", "zoom_blur", "elastic_transform", "snow", "frost", "spatter"], ALL):
        grid = CorruptionGrid(names)
        for member in grid.members:  # first uses: constant tables, page-locked buffers
            member.corrupt(x[:2], gen(0, "cuda"))
        grid.draw(x, gen(0, "cuda"), None, None)
        seeded = gen(1, "cuda")  # seeding a CUDA generator is not the grid's wait
        with count_host_syncs(torch.nn.Identity(), device="cuda") as count:
            out = grid.draw(x, seeded, None, None)
        assert count.syncs == 0, count.where
        g = gen(1, "cuda")
        assert torch.equal(grid(x, g), out) and not torch.equal(grid(x, g), out)  # the generator advances


# ---------------------------------------------------------------------------------------------
# against the reference (only where imagecorruptions and its dependencies are installed)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["defocus_blur", "zoom_blur", "brightness", "contrast", "saturate", "gaussian_blur",
                                  "jpeg_compression", "pixelate"])
def test_deterministic_corruptions_match_the_reference(photos, name):
    missing = [m for m in ("imagecorruptions", "skimage", "cv2") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the reference needs {', '.join(missing)} (pip install imagecorruptions scikit-image "
                    "opencv-python-headless)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_corruptions import reference

    corrupt = reference()
    image = (resized(photos[:1], 96)[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    x = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255
    for severity in (1, 3, 5):
        ours = Corruption(name, severity, "imagenet")(x, gen(0))[0].permute(1, 2, 0).numpy()
        theirs = corrupt(image, severity=severity, corruption_name=name).astype(np.float64) / 255
        assert np.abs(ours - theirs).mean() < 0.01, (name, severity, np.abs(ours - theirs).mean())


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------


def test_bad_names_severities_and_presets():
    with pytest.raises(ValueError, match="unknown corruption 'gausian_noise' \\(did you mean 'gaussian_noise'\\?\\)"):
        Corruption("gausian_noise", 1)
    for severity in (0, 6, 2.5, True, "3"):
        with pytest.raises(ValueError, match="severity must be an integer from 1 to 5"):
            Corruption("fog", severity)
    with pytest.raises(ValueError, match="preset must be None .* 'imagenet' or 'cifar'"):
        Corruption("fog", 1, preset="tiny")
    with pytest.raises(ValueError, match="needs the images' pixel box"):
        Corruption("fog", 1, bounds=None)
    with pytest.raises(ValueError, match="corruptions must be a non-empty list"):
        CorruptionGrid("fog")
    with pytest.raises(ValueError, match="severities must be a non-empty list"):
        CorruptionGrid(["fog"], 3)
    with pytest.raises(ValueError, match="did you mean 'contrast'"):
        CorruptionGrid(["contrst"])


def test_bad_images():
    c = Corruption("gaussian_noise", 1)
    with pytest.raises(ValueError, match=r"images of shape \(n, channels, height, width\), got \(3, 32, 32\)"):
        c(torch.rand(3, 32, 32), gen())
    with pytest.raises(ValueError, match=r"1 \(grey\) or 3 \(RGB\) channels .* got shape \(2, 32, 32, 3\)"):
        c(torch.rand(2, 32, 32, 3), gen())
    with pytest.raises(ValueError, match="floating-point images"):
        c(torch.zeros(1, 3, 32, 32, dtype=torch.uint8), gen())
    outside = torch.full((1, 3, 32, 32), 0.5)
    outside[0, 0, 0, :2] = torch.tensor([-0.25, 1.5])
    with pytest.raises(ValueError, match=r"must lie in the box \(0.0, 1.0\).* got values from -0.25 to 1.5"):
        c(outside, gen())
    with pytest.raises(ValueError, match="saturate .* needs RGB images"):
        Corruption("saturate", 1)(torch.rand(1, 1, 32, 32), gen())
    for name in NEEDS_MIN_SIDE:
        with pytest.raises(ValueError, match=f"{name} cannot apply to 8x8 images.*at least 32x32 px"):
            Corruption(name, 1)(torch.rand(1, 1, 8, 8), gen())
    with pytest.raises(ValueError, match="pixelate needs images of at least 4x4 px, got 3x3"):
        Corruption("pixelate", 1)(torch.rand(1, 1, 3, 3), gen())


def test_small_grey_images_that_apply():
    """The corruptions that mean something on 8x8 grey digits run there (the CIFAR table)."""
    x = torch.rand(5, 1, 8, 8, generator=gen(7))
    usable = [n for n in ALL if n not in NEEDS_MIN_SIDE + NEEDS_COLOUR]
    assert len(usable) == 13
    for name in usable:
        out = Corruption(name, 5)(x, gen(1))
        assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1


def test_repr():
    assert repr(Corruption("fog", 2)) == "Corruption('fog', severity=2)"
    boxed = Corruption("fog", 2, "cifar", bounds=(-1, 1))
    assert repr(boxed) == "Corruption('fog', severity=2, preset='cifar', bounds=(-1, 1))"


def test_jpeg_takes_bfloat16_and_refuses_a_quality_list_of_the_wrong_length():
    """The CPU path takes bfloat16 batches (NumPy has none) and returns their dtype; a list of
    qualities must have one per image, or the error says so (no image is left unwritten)."""
    x = torch.rand(3, 3, 16, 16, generator=gen(3))
    out = jpeg_compression(x.to(torch.bfloat16), 50, None, "cifar")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), jpeg_compression(x.to(torch.bfloat16).float(), 50, None, "cifar"),
                               rtol=0, atol=0.01)  # bfloat16 keeps 8 bits of the levels / 255
    with pytest.raises(ValueError, match="2 qualities for 3 images: give one per image"):
        jpeg_compression(x, [50, 40], None, "cifar")
