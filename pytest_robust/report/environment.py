"""Facts about where a run happened, recorded with results and used to key baselines."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_commit(root) -> str:
    """The commit under test: $GITHUB_SHA when set, else ``git rev-parse HEAD``, else ''."""
    if os.environ.get("GITHUB_SHA"):
        return os.environ["GITHUB_SHA"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def environment(root) -> dict:
    """Versions, machine and accelerator names (the latter only if torch is already imported)."""
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "pytest_robust": _version("pytest-robust"),
        "torch": _version("torch"),
        "torchvision": _version("torchvision"),
        "pytest": _version("pytest"),
        "commit": git_commit(root),
    }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return env


def baseline_key(env: dict) -> str:
    """Where baselines are stored: what changes results, not which host ran them: the
    architecture, the torch version and the accelerators (their model names; "cpu" without). An
    ephemeral CI runner of the same kind finds the previous run's baselines. (The precision each
    check ran in is part of its own key: ``store.compare``.)"""
    gpus = "+".join(sorted(set(env.get("gpus", [])))) or "cpu"
    return f"{env['machine']}-torch{env['torch']}-{gpus}".replace(" ", "_")
