"""Writing files that are whole or absent, and text from test ids that is safe where it lands.

Every file pytest-robust writes (results.json, summary.md, the JUnit file, per_input.csv, plots,
baselines, cache entries) goes through ``replacing``: the bytes go to a temporary file in the
target's directory (same file system, so the rename is atomic), are flushed and fsync'ed, and the
file is renamed over the target with ``os.replace``. A full disk, a crash or a cancelled job leaves
the previous file (or none) and never a truncated one; two processes writing the same file leave
one of them whole (the last rename wins). The temporary file is removed when the write fails.

Test ids, reprs and messages come from users (parametrize ids, ``__repr__``, file names), so what
lands in a report is made inert: ``md_text`` for summary.md (GitHub markdown, where
``|`` splits table cells, newlines end rows and HTML renders), ``csv_cell`` for CSV files
(OWASP's CSV-injection rule), ``file_stem`` for file names (one path component, bounded length).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

from pytest_robust.errors import RobustError
from pytest_robust.settings.validation import dangling_link

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


def file_stem(text: str, limit: int = 120) -> str:
    """``text`` as one safe path component: runs of anything but letters, digits, '_', '.' and '-'
    become '_', no dots or '_' at either end (no '..', no hidden files), at most ``limit`` characters (ASCII, so
    bytes), "check" when nothing is left. A name built from it stays in its directory."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.")[:limit] or "check"


#: Characters that GitHub markdown would read as syntax, and what stands for them: backslash
#: escapes for markdown, visible escapes for line breaks. ``<`` is an entity where it could open an
#: HTML tag, comment or autolink (before a letter, '/', '!' or '?'); "<= 0.5" stays as it is.
_MARKDOWN = {"\\": "\\\\", "|": "\\|", "`": "\\`", "*": "\\*", "[": "\\[", "]": "\\]", "\r": "\\r", "\n": "\\n"}
_SYNTAX = re.compile(r"[\\|`*\[\]\r\n]|<(?=[A-Za-z/!?])")


def md_text(text) -> str:
    """``text`` as literal markdown text, safe in a table cell, a list item or a heading: no
    character of it can end the row or line, split a cell, open a code span, a link, emphasis or
    an HTML tag."""
    return _SYNTAX.sub(lambda m: _MARKDOWN.get(m.group(), "&lt;"), str(text))


#: First characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A CSV cell that a spreadsheet shows as text: a string beginning with ``FORMULA_START`` gets a
    leading single quote (OWASP's rule). Numbers the tool computed stay numbers (-0.25 is data)."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value
