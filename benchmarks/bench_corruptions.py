"""Common corruptions: ``pytest_robust.Corruption`` against the ``imagecorruptions`` package.

Run from the repository root:

    python benchmarks/bench_corruptions.py [--quick] [--threads N] [--ref-images K]

Images: real photographs that ship inside packages (scikit-learn's ``china.jpg`` and
``flower.jpg``; scikit-image's astronaut, coffee and chelsea), cut into 32 square crops at
several positions and scales and resized to 224 x 224 px (box filter): a batch of 32 RGB images
in [0, 1]. Nothing is downloaded.

Per corruption and severity (the ImageNet-C tables, as both use for 224-px images):

- strength: the mean absolute change |x' - x| (in [0, 1] units, over pixels, channels and
  images) of ours and of the reference on the same first K images (``--ref-images``, default 8),
  and their ratio ours/reference (target: within a factor 1.5);
- throughput: images per second of ours on the batch of 32 (one call ``Corruption(name,
  severity)(x, generator)``, median of 3 runs) and of the reference, one image at a time as it
  works (``imagecorruptions.corrupt(uint8 image, severity, name)``, the same K images, uint8
  conversion of its input and output excluded from neither), and their ratio (targets: geometric
  mean over corruptions >= 3, no corruption below 1).

The reference needs, besides itself (``pip install imagecorruptions``), scikit-image, OpenCV and
SciPy: ``pip install imagecorruptions scikit-image opencv-python-headless``. It predates today's
NumPy, SciPy and scikit-image; this script (never the package) applies shims before importing
it: ``np.float_`` = ``np.float64``; scikit-image's ``gaussian(..., multichannel=True)`` mapped to
``channel_axis=-1``; ``scipy.ndimage.interpolation`` aliased to ``scipy.ndimage``; and frost,
which draws one of 5 photographs but ships 4 (frost1-4; ``frost5.jpg`` is missing from the
wheel), draws again when it picks the missing one. Its global NumPy random state is seeded.
"""

from __future__ import annotations

import importlib.util
import math
import os
import statistics
import sys
import time
import types

import numpy as np
import torch
import torch.nn.functional as F

# importing common first puts the repository root on sys.path
from common import header, markdown_table, parse_args, report

from pytest_robust import Corruption, corruption_names

SIDE = 224
BATCH = 32
SEED = 0


def photographs() -> torch.Tensor:
    """(32, 3, 224, 224) crops of the packaged photographs, in [0, 1]."""
    from sklearn.datasets import load_sample_images

    images = list(load_sample_images().images)
    try:
        from skimage import data

        images += [data.astronaut(), data.coffee(), data.chelsea()]
    except ImportError:
        pass
    crops = []
    scales = (1.0, 0.8, 0.6, 0.45)
    k = 0
    while len(crops) < BATCH:
        img = torch.from_numpy(np.array(images[k % len(images)])).permute(2, 0, 1).float() / 255
        h, w = img.shape[1:]
        scale = scales[(k // len(images)) % len(scales)]
        side = int(min(h, w) * scale)
        top = (h - side) * ((k * 7) % 5) // 4
        left = (w - side) * ((k * 3) % 5) // 4
        crop = img[:, top:top + side, left:left + side]
        crops.append(F.interpolate(crop[None], size=(SIDE, SIDE), mode="area")[0])
        k += 1
    return torch.stack(crops).clamp(0, 1)


def reference():
    """``imagecorruptions.corrupt`` with the shims of the docstring applied."""
    missing = [m for m in ("imagecorruptions", "skimage", "cv2", "scipy") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"the reference needs {', '.join(missing)}: pip install imagecorruptions scikit-image "
                         "opencv-python-headless")
    np.float_ = np.float64
    import scipy.ndimage
    import skimage.filters

    sys.modules["scipy.ndimage.interpolation"] = scipy.ndimage  # removed in SciPy 2; deprecated now
    original = skimage.filters.gaussian

    def gaussian(image, *args, multichannel=None, **kwargs):
        if multichannel:
            kwargs.setdefault("channel_axis", -1)
        return original(image, *args, **kwargs)

    skimage.filters.gaussian = gaussian
    shimmed = importlib.util.find_spec("pkg_resources") is None
    if shimmed:  # setuptools >= 81 dropped it; frost only needs resource_filename
        sys.modules["pkg_resources"] = types.SimpleNamespace(
            resource_filename=lambda module, name: os.path.join(os.path.dirname(sys.modules[module].__file__), name))
    try:
        import imagecorruptions
        from imagecorruptions import corruptions as module
    finally:
        if shimmed:  # others (pytest's monkeypatch) look for the real one
            del sys.modules["pkg_resources"]

    frost = module.frost

    def frost_with_shipped_photos(x, severity=1):
        while True:
            state = np.random.get_state()
            if np.random.randint(5) < 4:
                np.random.set_state(state)
                return frost(x, severity)

    module.frost = frost_with_shipped_photos
    imagecorruptions.corruption_dict["frost"] = frost_with_shipped_photos
    return imagecorruptions.corrupt


def measure(args) -> str:
    corrupt = reference()
    x = photographs()
    k = args.ref_images
    images = [np.ascontiguousarray((x[i].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)) for i in range(k)]
    names = corruption_names()
    severities = (1, 3, 5) if args.quick else (1, 2, 3, 4, 5)
    np.random.seed(SEED)
    rows, speed_ratios = [], {}
    for name in names:
        ours_rate, theirs_rate = [], []
        for s in severities:
            corruption = Corruption(name, s)
            times = []
            for run in range(3):
                g = torch.Generator().manual_seed(SEED + run)
                t0 = time.perf_counter()
                out = corruption(x, g)
                times.append(time.perf_counter() - t0)
            ours_ips = BATCH / statistics.median(times)
            ours_change = float((out[:k] - x[:k]).abs().mean())
            t0 = time.perf_counter()
            theirs = [corrupt(im, severity=s, corruption_name=name) for im in images]
            theirs_ips = k / (time.perf_counter() - t0)
            theirs_change = float(np.mean([np.abs(t.astype(np.float64) / 255 - im / 255).mean()
                                           for t, im in zip(theirs, images)]))
            ours_rate.append(ours_ips)
            theirs_rate.append(theirs_ips)
            rows.append([name, s, f"{ours_change:.4f}", f"{theirs_change:.4f}", f"{ours_change / theirs_change:.2f}",
                         f"{ours_ips:,.0f}", f"{theirs_ips:,.1f}", f"{ours_ips / theirs_ips:.1f}"])
        speed_ratios[name] = statistics.geometric_mean(ours_rate) / statistics.geometric_mean(theirs_rate)
        strengths = [float(r[4]) for r in rows]
    geo = math.exp(statistics.fmean(math.log(v) for v in speed_ratios.values()))
    slowest = min(speed_ratios, key=speed_ratios.get)
    line = header(args.device, f"images={BATCH} photographs at {SIDE}x{SIDE} (reference on the first {k})",
                  f"severities={','.join(map(str, severities))}", "ImageNet-C tables", f"seed={SEED}")
    summary = (
        f"\nStrength ratio ours/reference: {min(strengths):.2f} to {max(strengths):.2f} "
        f"({sum(1 / 1.5 <= v <= 1.5 for v in strengths)}/{len(strengths)} cells within a factor 1.5).\n"
        f"Throughput ratio ours/reference per corruption (geometric mean over its severities): "
        + ", ".join(f"{n} {v:.1f}" for n, v in speed_ratios.items())
        + f".\nGeometric mean over the {len(speed_ratios)} corruptions: {geo:.1f}x; slowest: {slowest} "
        f"{speed_ratios[slowest]:.1f}x."
    )
    table = markdown_table(
        ["corruption", "severity", "ours mean abs change", "reference", "ours/ref", "ours img/s", "ref img/s",
         "speed-up"],
        rows, "lrrrrrrr",
    )
    return f"{line}\n\n{table}\n{summary}"


def main(argv=None) -> None:
    args = parse_args(__doc__, quick="severities 1, 3, 5 only", argv=argv, extra={
        "--ref-images": dict(type=int, default=8, help="images the reference corrupts per cell (default 8)"),
    })
    report(f"Common corruptions vs imagecorruptions ({args.mode} run)", lambda: measure(args))


if __name__ == "__main__":
    main()
