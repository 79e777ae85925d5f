"""A directory of fitted artefacts (e.g. NPPR's learned perturbation models), keyed by content.

An entry is one ``torch.save`` file ``<cache_dir>/<kind>-<key[:24]>.pt`` holding a dict of tensors
and plain values, with the full key inside. The key is a SHA-256 over everything the artefact
depends on: the model's weights (every state_dict tensor's name, dtype, shape and bytes), the model
class, and the caller's settings (any JSON-able dict). An entry is trusted only if it loads with
``torch.load(weights_only=True)`` (no code runs while loading), is a dict of the expected format,
carries exactly the expected key, and its payload still has the SHA-256 stored with it
(``payload_checksum``: an entry altered after it was written, even one that still loads, is
caught); anything else is reported as invalid, and the caller refits.
Writes go to a temporary file renamed into place (``files.replacing``), so concurrent writers
(xdist workers) and a full disk never leave a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from pytest_robust.files import replacing

#: Bumped whenever the layout of stored entries changes; part of every key.
FORMAT = 2
#: Entry fields that are not payload (the checksum covers everything else).
HEADER = ("format", "key", "checksum")


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of the model's class and of every state_dict entry (name, dtype, shape, raw bytes)."""
    digest = hashlib.sha256(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tensor_fingerprint(*tensors: torch.Tensor) -> str:
    """SHA-256 of tensors' dtypes, shapes and bytes (e.g. to key on the exact data a fit used)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def payload_checksum(entry: dict) -> str:
    """SHA-256 of an entry's payload (every field but ``HEADER``): tensors by dtype, shape and
    bytes, nested dicts by their sorted keys, other values by their JSON text."""
    digest = hashlib.sha256()

    def feed(value) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(tensor_fingerprint(value).encode())
        elif isinstance(value, dict):
            for k in sorted(value, key=str):
                digest.update(f"<{k}>".encode())
                feed(value[k])
        else:
            digest.update(json.dumps(value, sort_keys=True, default=str).encode())

    feed({k: v for k, v in entry.items() if k not in HEADER})
    return digest.hexdigest()


def cache_key(kind: str, model_hash: str, settings: dict) -> str:
    """The key of an artefact of ``kind`` fitted to the model with ``model_hash`` under ``settings``."""
    text = json.dumps({"format": FORMAT, "kind": kind, "model": model_hash, "settings": settings},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_path(cache_dir: str | os.PathLike, kind: str, key: str) -> Path:
    return Path(cache_dir) / f"{kind}-{key[:24]}.pt"


def load(path: Path, key: str) -> tuple[dict | None, str]:
    """(entry, "hit") for a trusted entry with this key, (None, "miss") when there is no file,
    (None, "invalid: <reason>") when the file cannot be trusted (the caller should refit)."""
    if not path.exists():
        return None, "miss"
    try:
        entry = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a corrupt file can fail in many ways (pickle, zip, EOF, ...)
        return None, f"invalid: unreadable ({type(err).__name__}: {err})"
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None, "invalid: not an entry of this format"
    if entry.get("key") != key:
        return None, "invalid: keyed to another model or other settings"
    if entry.get("checksum") != payload_checksum(entry):
        return None, "invalid: its payload does not match the checksum stored with it (altered after it was written)"
    return entry, "hit"


def store(path: Path, key: str, entry: dict) -> None:
    """Write ``entry`` (tensors and plain values) with its key, atomically (``files.replacing``)."""
    with replacing(path) as f:
        torch.save({**entry, "format": FORMAT, "key": key, "checksum": payload_checksum(entry)}, f)
