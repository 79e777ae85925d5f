"""Digital corruptions: contrast, elastic transform, pixelate, JPEG, and the extra saturate."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from pytest_robust.engine.precision import at_least_float32
from pytest_robust.errors import ArgumentError
from pytest_robust.perturbations.corruptions._ops import blur, box_rows, constant, uniform, warp
from pytest_robust.perturbations.corruptions.jpeg import jpeg


def contrast(x, c, g, preset):
    """x' = m + c (x - m), m the mean of each channel of each image."""
    m = x.mean((2, 3), keepdim=True)
    return torch.add(m * (1 - c), x, alpha=c)


def saturate(x, c, g, preset):
    """HSV saturation S' = clip(a S + b, 0, 1) with hue and value kept ((a, b) = c).

    With V = max(RGB) and S = (V - min(RGB)) / V, each channel is V - (V - x_k) S' / S; a grey
    pixel (S = 0, hue 0 = red, as scikit-image's ``rgb2hsv``) becomes (V, V (1 - S'), V (1 - S'))."""
    a, b = c
    v = x.amax(1, keepdim=True)
    s = (v - x.amin(1, keepdim=True)) / v.clamp(min=1e-12)
    s_new = (a * s + b).clamp(0, 1)
    scaled = v - (v - x) * s_new / s.clamp(min=1e-12)
    red = torch.cat([v, v * (1 - s_new), v * (1 - s_new)], 1)
    return torch.where(s > 0, scaled, red)


def pixelate(x, c, g, preset):
    """Downsample to (int(c h), int(c w)) px by PIL's ``BOX`` filter (``_ops.box_rows``, rows then
    columns: Pillow's resize of float images, to float32 rounding), then upsample by nearest
    neighbour at pixel centres (torch's ``nearest-exact``). That is the map of the reference's
    ``BOX`` upsampling and of Pillow's ``NEAREST`` except where a pixel centre falls exactly on a
    source pixel's edge, which rounds to the other neighbour in some sizes. The reference resizes
    8-bit images, so it also differs by its rounding (< 1.5/255)."""
    h, w = x.shape[-2:]
    small = box_rows(box_rows(x, int(h * c)).transpose(2, 3).contiguous(), int(w * c)).transpose(2, 3)
    return F.interpolate(small.contiguous(), size=(h, w), mode="nearest-exact")


#: torchvision's warning on its image codecs, deprecated since 0.29 in favour of TorchCodec
DEPRECATED = "The image decoding and encoding"


@functools.cache
def libjpeg():
    """(encode, decode): torchvision's bindings of libjpeg-turbo, ``torchvision.io.encode_jpeg``
    and ``decode_jpeg``, once a round trip of a small image works; None where they are missing (a
    torchvision without its image extension, or a release after their deprecation in 0.29), and
    the tensor codec codes on the CPU too, with the same numbers.

    torchvision is imported here, when the first JPEG corruption is built (``Corruption``), not
    with the package, nor mid-run: its import costs about a second and 160 MB of resident memory,
    which checks without JPEG (tabular data, token ids, any other perturbation) never pay."""
    try:
        from torchvision.io import decode_jpeg, encode_jpeg
    except ImportError:  # pragma: no cover - a torchvision without them
        return None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", DEPRECATED, DeprecationWarning)
            decode_jpeg(encode_jpeg(torch.zeros(1, 8, 8, dtype=torch.uint8), quality=50))
    except RuntimeError:  # pragma: no cover - "Couldn't load the image extension"
        return None
    return encode_jpeg, decode_jpeg


def jpeg_compression(x, c, g, preset):
    """JPEG encoding at quality c (or at c[i] for image i, c a list) and decoding of the image
    quantised to 8 bits (round(255 x)), as Pillow's libjpeg-turbo (the codec of the reference)
    does it: RGB images as YCbCr with 4:2:0 chroma subsampling (Pillow's default), grey images as
    one luma component. Every device gets the same numbers, each by its fastest path:

    - on a CPU, torchvision's bindings of libjpeg-turbo (``torchvision.io.encode_jpeg`` and
      ``decode_jpeg``: the library and the settings Pillow uses, islow DCT, 4:2:0 and fancy
      upsampling, equal to Pillow level for level, ``tests/test_corruptions.py``) code the images
      one by one, each quantised by NumPy in its planar layout, its planes interleaved into the
      codec's own layout one at a time (so the codec copies nothing) and the result rescaled while
      it is in the cache: its SIMD code on 8-bit images measured 8x faster than the batched tensor
      codec below;
    - on any other device, ``jpeg.jpeg`` codes the whole batch there, libjpeg's integer
      arithmetic in float64 tensors, equal to Pillow's result level for level, with nothing read
      back to the host. (torchvision's nvJPEG encoder is not used: it takes 3-channel images
      only and keeps chroma at full resolution, 4:4:4, so its images differ from the CPU's.)
    """
    if isinstance(c, list) and len(c) != len(x):
        raise ArgumentError(f"jpeg_compression got {len(c)} qualities for {len(x)} images: give one per image")
    qualities = [int(q) for q in (c if isinstance(c, list) else [c] * len(x))]
    codec = libjpeg() if x.device.type == "cpu" else None
    if codec is None:
        return jpeg(x, qualities)
    encode, decode = codec
    # each image quantised in its own (planar) layout, then its planes interleaved into the codec's
    # layout one at a time: a transposing copy of the whole float batch, or the codec's own, costs
    # twice as much; half-precision images in float32 (``at_least_float32``; NumPy has no bfloat16)
    images = x.to(at_least_float32(x.dtype)).numpy(force=True)
    out = np.empty(x.shape, images.dtype)
    scale = images.dtype.type(255)
    levels, planes = np.empty(images.shape[1:], images.dtype), np.empty(images.shape[1:], np.uint8)
    octets = torch.empty((*images.shape[2:], images.shape[1]), dtype=torch.uint8)
    interleaved = octets.numpy()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", DEPRECATED, DeprecationWarning)
        for image, quality, decoded in zip(images, qualities, out):
            # half to even, as torch.round; the levels are whole numbers in [0, 255], so exact
            np.rint(np.multiply(image, scale, out=levels), out=planes, casting="unsafe")
            for channel, plane in enumerate(planes):
                interleaved[..., channel] = plane
            coded = encode(octets.permute(2, 0, 1), quality=quality)
            np.copyto(decoded, decode(coded).numpy())
            np.divide(decoded, scale, out=decoded)  # two SIMD passes, faster than one mixed-type divide
    return torch.from_numpy(out).to(x.dtype)


def elastic_transform(x, c, g, preset):
    """Resample each image at p + (dy, dx)(p) (bilinear, reflected borders), a smooth random field.

    imagenet (``imagecorruptions``): dy, dx = alpha blur(U(-0.005 h, 0.005 h)) with a Gaussian of
    sigma (0.01 h, 0.01 w) px (truncated at 3 sigma), alpha = c.
    cifar (CIFAR-10-C): (alpha, sigma, jitter) = c times the side s = min(h, w); first a random
    affine map that moves the three points centre + (s/3, s/3), centre + (s/3, -s/3) and
    centre - (s/3, s/3) by U(-jitter, jitter) px each, then the field alpha blur(U(-1, 1)) with
    sigma px; both are composed into one resampling.
    """
    n, _, h, w = x.shape
    if preset == "imagenet":
        field = blur((2 * uniform(g, (n, 2, h, w), x) - 1) * 0.005 * h, 0.01 * h, 0.01 * w, truncate=3.0) * c
        return warp(x, field[:, 0], field[:, 1])
    side = min(h, w)
    alpha, sigma, jitter = (v * side for v in c)
    cy, cx, third = float(h // 2), float(w // 2), float(side // 3)
    src = constant(((cx + third, cy + third, 1), (cx + third, cy - third, 1), (cx - third, cy - third, 1)),
                   x.device, x.dtype)
    dst = src[:, :2] + (2 * uniform(g, (n, 3, 2), x) - 1) * jitter
    # the _ex forms skip the singularity check, a host read on CUDA: the three points are not collinear
    forward = torch.linalg.solve_ex(src.expand(n, 3, 3), dst).result.transpose(1, 2)  # (n, 2, 3): src -> dst
    inverse = torch.linalg.inv_ex(forward[:, :, :2]).inverse
    matrix = torch.cat([inverse, -(inverse @ forward[:, :, 2:])], 2)
    field = blur(2 * uniform(g, (n, 2, h, w), x) - 1, sigma, truncate=3.0) * alpha
    return warp(x, field[:, 0], field[:, 1], matrix)
