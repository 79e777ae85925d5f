"""Digital corruptions: contrast, elastic transform, pixelate, JPEG, and the extra saturate."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from pytest_robust.engine.device import upload
from pytest_robust.perturbations.corruptions._ops import blur, box_matrix, constant, uniform, warp


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
    """Downsample by box averaging to (int(c h), int(c w)) px (PIL's ``BOX``, as two matrix
    matrix products), then upsample by nearest neighbour (pixel centres, PIL's ``NEAREST``; CIFAR-10-C's
    ``BOX`` upsampling is the same map)."""
    h, w = x.shape[-2:]
    out_h, out_w = int(h * c), int(w * c)
    if h % out_h == 0 and w % out_w == 0:  # whole boxes: the same average, pooled
        small = F.avg_pool2d(x, (h // out_h, w // out_w))
    else:
        small = box_matrix(out_h, h, x) @ x @ box_matrix(out_w, w, x).T
    return F.interpolate(small, size=(h, w), mode="nearest-exact")


def _pil_jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    """Encode one (h, w) or (h, w, 3) uint8 image as JPEG at ``quality`` with Pillow, decode it."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return np.asarray(Image.open(buffer))


def _pil_jpegs(images: np.ndarray, qualities: list) -> np.ndarray:
    """``_pil_jpeg`` of each of the (n, h, w[, 3]) images at its quality, spread over
    ``torch.get_num_threads()`` threads (Pillow releases the GIL while it codes)."""
    threads = max(1, torch.get_num_threads())
    if threads == 1:
        return np.stack([_pil_jpeg(im, q) for im, q in zip(images, qualities)])
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return np.stack(list(pool.map(_pil_jpeg, images, qualities)))


def jpeg_compression(x, c, g, preset):
    """JPEG encoding at quality c (or at c[i] for image i, c a list) and decoding of the image
    quantised to 8 bits (round(255 x)), by Pillow's libjpeg-turbo (the codec of the reference) on
    the host, for images on any device: RGB images are coded as YCbCr with 4:2:0 chroma
    subsampling (Pillow's default), grey images as one luma component. So a CUDA batch gets
    exactly the CPU's numbers.

    Host synchronisation: on CUDA the quantised batch is copied to the host in one transfer, the
    only time a corruption waits for the device (the codec runs on the host, image by image);
    the decoded batch, divided by 255 on the host, goes back without a wait (``_ops.upload``).
    torchvision's GPU codec (nvJPEG) is not used: its encoder takes 3-channel images only, keeps
    chroma at full resolution (4:4:4, fixed in torchvision 0.29's ``encode_jpegs_cuda``), so its
    RGB images differ from the CPU's, and it waits for the device twice per image. torchvision's
    CPU encoder measured 10x slower than Pillow's on 224-px images (torchvision 0.29).
    """
    qualities = [int(q) for q in (c if isinstance(c, list) else [c] * len(x))]
    levels = x.permute(0, 2, 3, 1).mul(255).round_().to(torch.uint8).contiguous().numpy(force=True)
    decoded = _pil_jpegs(levels if x.shape[1] == 3 else levels[..., 0], qualities)
    out = torch.from_numpy(decoded if x.shape[1] == 3 else decoded[..., None]).permute(0, 3, 1, 2)
    return upload(out.to(x.dtype).div_(255), x.device)  # channels-last memory, (n, c, h, w) shape


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
