"""The per-job file lock: no two runs of one job overlap on this host.

flock(2) through filelock: the kernel drops the lock when the process dies (kill -9, OOM), so
a crash never leaves a job locked. Lock files are never deleted (deleting one would let two
processes lock two different inodes); the holder writes its pid, host and start time into the
file so that a skipped run can say who holds it.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout


class LockError(OSError):
    """The lock directory or file cannot be used (permissions, disk)."""


@dataclass
class Holder:
    pid: int | None = None
    host: str = ""
    since: str = ""

    def describe(self) -> str:
        if self.pid is None:
            return "running (holder unknown)"
        return f"running since {self.since}, pid {self.pid}, host {self.host}"


def ensure_lock_dir(directory: Path) -> Path:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    except OSError as exc:
        raise LockError(f"lock directory {directory}: {exc.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise LockError(f"lock directory {directory}: not writable")
    return directory


class JobLock:
    def __init__(self, directory: Path, job: str, *, host: str, since: str):
        self.path = ensure_lock_dir(Path(directory)) / f"{job}.lock"
        self._me = json.dumps({"pid": os.getpid(), "host": host, "since": since})
        self._lock = FileLock(
            self.path,
            mode=0o600,
            preserve_lock_file=True,
            fallback_to_soft=False,
            thread_local=False,
            on_acquired=self._write_holder,
        )

    def _write_holder(self, fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, self._me.encode(), 0)

    def acquire(self, wait: float | None = None) -> bool:
        """True when locked; False when another process holds it (after `wait` seconds)."""
        try:
            self._lock.acquire(timeout=wait if wait else 0, blocking=bool(wait))
        except Timeout:
            return False
        except OSError as exc:
            raise LockError(f"lock file {self.path}: {exc.strerror or exc}") from None
        return True

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release()

    def holder(self) -> Holder:
        try:
            data = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return Holder()
        return Holder(pid=data.get("pid"), host=data.get("host", ""), since=data.get("since", ""))
