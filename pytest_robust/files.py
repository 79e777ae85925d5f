"""Writing files that are whole or absent: the ground floor under every module that writes one.

Every file pytest-robust writes (results.json, summary.md, the JUnit file, per_input.csv, plots,
baselines, cache entries) goes through ``replacing``: the bytes go to a temporary file in the
target's directory (same file system, so the rename is atomic), are flushed and fsync'ed, and the
file is renamed over the target with ``os.replace``. A full disk, a crash or a cancelled job leaves
the previous file (or none) and never a truncated one; two processes writing the same file leave
one of them whole (the last rename wins). The temporary file is removed when the write fails.
Pure Python: the engine (its cache), the report writers and the settings' validators use it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from pytest_robust.errors import RobustError

#: Characters of the target's name kept in its temporary file's name, which then stays within the
#: 255 bytes that ext4, APFS, NTFS and tmpfs allow whatever the target's name.
TEMP_NAME_KEEPS = 100


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The process's umask, read once: temporary files are created 0600; the renamed file gets the
#: mode an ordinary ``open(path, "w")`` would give it (0666 less the umask).
UMASK = _umask()


def ensure_directory(directory: Path) -> Path:
    """Create ``directory`` and its parents; a dangling link on the way is a ``RobustError`` naming it."""
    problem = dangling_link(directory)
    if problem:
        raise RobustError(problem)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@contextlib.contextmanager
def replacing(path: Path):
    """A binary file object whose bytes replace ``path`` when the block ends without an exception
    (module docstring); when it raises, ``path`` is left as it was and the temporary file removed."""
    path = Path(path)
    ensure_directory(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:TEMP_NAME_KEEPS]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, content: str | bytes) -> Path:
    """Write ``content`` (text as UTF-8, or bytes) to ``path`` whole or not at all (``replacing``)."""
    with replacing(path) as f:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)
    return Path(path)


def dangling_link(directory: Path) -> str | None:
    """What is wrong when ``directory`` or a parent is a symbolic link that points nowhere (with
    the fix), else None: ``os.makedirs`` would say only "File exists"."""
    for p in (directory, *directory.parents):
        if p.is_symlink() and not p.exists():
            return (f"{p} is a symbolic link to {os.readlink(p)}, which does not exist: create the directory it "
                    f"points to, or remove the link (rm {p}) to let pytest-robust create a directory there")
    return None
