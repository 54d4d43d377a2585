"""The per-job file lock: no two runs of one job overlap on this host.

flock(2) on `<OPS_LOCK_DIR>/<job>.lock`: the kernel drops the lock when the process dies
(kill -9, OOM), so a crash never leaves a job locked. Lock files are never deleted (deleting
one would let two processes lock two different inodes). The holder writes its pid, host and
start time into the file, so that a skipped run can say who holds it.

The file is opened without following symbolic links and must be a regular file of ours with
one link: in a shared directory (/run/lock, /tmp) another user could otherwise plant a link
that makes the holder note overwrite a file of the app user's. Nothing is written before the
lock is held.

This is fcntl directly rather than the filelock package: the same flock call, but filelock's
import cost 32 ms of every cron run's start-up (bench/RESULTS.md, P1).
"""

import errno
import fcntl
import json
import os
import stat
import time
from pathlib import Path

from ..values import Value


class LockError(OSError):
    """The lock directory or file cannot be used (permissions, disk)."""


class Holder(Value):
    pid: int | None = None
    host: str = ""
    since: str = ""

    def describe(self) -> str:
        if self.pid is None:
            return "running (holder unknown)"
        return f"running since {self.since}, pid {self.pid}, host {self.host}"


def ensure_lock_dir(directory: Path) -> Path:
    try:
        # Created 0700; an existing directory is left as it is (it may be shared, like
        # /run/lock): `manage.py check` says when it cannot be used.
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise LockError(f"lock directory {directory}: {exc.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise LockError(f"lock directory {directory}: not writable")
    return directory


def open_lock_file(path: Path) -> int:
    """Open (or create, 0600) the lock file: never through a symbolic link, and only a regular
    file owned by this user with a single link; LockError naming the path otherwise."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockError(f"lock file {path} is a symbolic link: refusing to use it") from None
        raise LockError(f"lock file {path}: {exc.strerror}") from None
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "not a regular file"
    elif info.st_uid != os.geteuid():
        problem = f"owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    elif info.st_nlink != 1:
        problem = f"has {info.st_nlink} hard links"
    if problem:
        os.close(fd)
        raise LockError(f"lock file {path}: {problem}: refusing to use it")
    return fd


class JobLock:
    POLL = 0.1  # seconds between tries while --wait

    def __init__(self, directory: Path, job: str, *, host: str, since: str):
        self.path = ensure_lock_dir(Path(directory)) / f"{job}.lock"
        self._me = json.dumps({"pid": os.getpid(), "host": host, "since": since}).encode()
        self._fd: int | None = None

    def acquire(self, wait: float | None = None) -> bool:
        """True when locked; False when another process holds it (after `wait` seconds)."""
        fd = open_lock_file(self.path)
        deadline = time.monotonic() + (wait or 0)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(self.POLL)
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, self._me, 0)
        except OSError:
            pass  # the holder note is a courtesy; the lock is what counts
        return True

    @property
    def fd(self) -> int | None:
        """The lock file's descriptor while the lock is held."""
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def holder(self, patience: float = 0.5) -> Holder:
        """Who holds the lock. A holder writes its note just after taking the lock, so an
        empty file is read again for a moment before it counts as unknown."""
        deadline = time.monotonic() + patience
        while True:
            try:
                data = json.loads(_read_no_follow(self.path) or b"null")
            except (OSError, ValueError):
                data = None
            if isinstance(data, dict) or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        if not isinstance(data, dict):
            return Holder()
        return Holder(pid=data.get("pid"), host=data.get("host", ""), since=data.get("since", ""))


def _read_no_follow(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)
