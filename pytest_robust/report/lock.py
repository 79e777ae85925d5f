"""One run at a time per report directory.

A run that writes a report directory (``--robust-report``) holds an exclusive lock on
``<directory>/.robust-run.lock`` from its start to its end (``flock`` on POSIX, ``msvcrt.locking``
on Windows). A second run that names the same directory while the first holds it stops before any
check runs, with an error naming the holder (pid, host, start time) and the fix: two runs writing
one directory would leave one run's results.json beside the other's plots, mixed in silence. The
operating system drops the lock when its process ends, even when it is killed, so a crashed run
never blocks the next one; a finished run removes the file. Runs one after the other do not mix
either: results.json lists its run's files, and the next run removes those it does not rewrite
(``session.ResultCollector``).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from pytest_robust.errors import RobustError
from pytest_robust.files import ensure_directory

LOCK_NAME = ".robust-run.lock"


class DirectoryInUse(RobustError):
    """Another run holds the report directory."""


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock on ``fd`` without waiting; False when another process holds it."""
    try:
        if os.name == "nt":
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


class RunLock:
    """The lock of one report directory, held by this process between ``acquire`` and ``release``."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self.fd: int | None = None
        self.created = False  # whether acquire created the directory (release removes it if still empty)

    def acquire(self) -> None:
        """Hold the directory, or raise ``DirectoryInUse`` naming the run that holds it; a directory
        that cannot be created or written (a read-only file system, no permission) is a
        ``RobustError`` naming it, before any check runs."""
        self.created = not self.directory.exists()
        try:
            ensure_directory(self.directory)
            self._hold()
        except OSError as err:
            raise RobustError(
                f"report directory {self.directory} cannot be written ({err.strerror or err}): name a writable "
                "directory with --robust-report (or robust_report in ini), or leave it out") from None

    def _hold(self) -> None:
        """Open and lock the lock file (``acquire``)."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            if not _try_lock(fd):
                try:
                    holder = os.read(fd, 512).decode("utf-8", "replace").strip() or "holder unknown"
                except OSError:  # Windows: the holder's locked byte cannot be read
                    holder = "holder unknown"
                os.close(fd)
                raise DirectoryInUse(
                    f"report directory {self.directory} is in use by another pytest-robust run ({holder}); two runs "
                    "writing one directory would mix their results. Give each run its own directory (e.g. "
                    "--robust-report reports/$CI_JOB_ID), or start this run when the other has finished")
            try:
                current = os.stat(self.path)
            except FileNotFoundError:  # the holder removed the file as we opened it: take the next one
                current = None
            if current is not None and os.path.samestat(current, os.fstat(fd)):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"
                     .encode())
        self.fd = fd

    def release(self) -> None:
        """Remove the lock file, then let go of the lock (in that order: a run that opened this file
        meanwhile finds it gone and takes a new one); a directory that ``acquire`` created and that
        stayed empty (no check ran) is removed too."""
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:  # Windows cannot remove an open file: it stays behind, unlocked
            pass
        os.close(self.fd)
        self.fd = None
        if self.created and not any(self.directory.iterdir()):
            self.directory.rmdir()
