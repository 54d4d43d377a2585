"""Pass a job's output through while keeping a bounded tail of it.

The job runs in-process, so its stdout and stderr are file descriptors 1 and 2 (and whatever
child processes it starts inherit them). Both are redirected into pipes; a reader thread per
stream copies the bytes to the original descriptor and into a ring buffer. Memory stays bounded
whatever the job prints. With `quiet`, output is spooled to a temporary file (disk, not memory)
and printed only when the job fails, like `chronic`.

A job may close or fill its own descriptors (`os.close(1)`, `sys.stderr.close()`, a stdout on
a full disk): afterwards the runner puts fds 1 and 2 back, drops what the job could not write,
and gives Python usable `sys.stdout`/`sys.stderr` again, so that its own messages, the
record and the final ping still happen.
"""

import contextlib
import errno
import fcntl
import os
import socket
import stat
import sys
import tempfile
import threading
import time
from builtins import bytes as _bytes
from pathlib import Path

from .threads import start as start_thread

CHUNK = 65536


def utf8_start(data: bytes) -> bytes:
    """`data` without the continuation bytes of a character cut at its start (at most 3)."""
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
        skip += 1
    return data[skip:]


def utf8_end(data: bytes) -> bytes:
    """`data` without a character cut at its end (an incomplete multi-byte sequence)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead
        if byte & 0x80 == 0:
            return data  # ASCII: nothing cut
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return data if back >= need else data[:-back]
    return data


class Tail:
    """The last `limit` bytes written, and how many bytes were written in all.

    With a `redactor`, the known secrets are replaced in what `bytes()` and `text()` give
    (never in what passes through). The buffer keeps `redactor.longest` bytes more than the
    limit, so that a secret straddling the cut is seen whole, replaced, and not kept in part.
    Cuts fall on UTF-8 character boundaries."""

    def __init__(self, limit: int, redactor=None):
        self.limit = limit
        self.redactor = redactor
        self.margin = redactor.longest if redactor else 0
        self.total = 0
        self._buf = bytearray()
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        keep = self.limit + self.margin
        with self._lock:
            self.total += len(data)
            self._buf += data
            if len(self._buf) > 2 * keep:
                del self._buf[: len(self._buf) - keep]

    def bytes(self, limit: int | None = None) -> bytes:
        """The last `limit` bytes (redacted), starting on a character boundary."""
        return self._cut(limit)[0]

    def _cut(self, limit: int | None) -> tuple[_bytes, bool]:
        """(the last `limit` bytes, redacted; whether output before them was left out)."""
        limit = self.limit if limit is None else min(limit, self.limit)
        with self._lock:
            window = bytes(self._buf[-(limit + self.margin) :]) if limit else b""
            whole = self.total <= len(window)
        # Where the kept part starts in the window: a secret beginning before it is dropped
        # whole (it ends inside the margin) or replaced whole (it crosses the start).
        drop = 0 if whole else max(0, len(window) - limit)
        data = self.redactor.bytes(window, drop) if self.redactor else window[drop:]
        cut = not whole or drop > 0
        if len(data) > limit:
            data, cut = data[-limit:], True
        if cut:
            data = utf8_start(data)
        return data, cut or (self.total > 0 and not data)

    def text(self, limit: int | None = None) -> str:
        """The last `limit` bytes as text, headed by a notice when output was left out."""
        text, cut = self.output(limit)
        return truncation_notice(self.total) + text if cut else text

    def output(self, limit: int | None = None) -> tuple[str, bool]:
        """(the last `limit` bytes as text, whether output before them was left out)."""
        data, cut = self._cut(limit)
        # PostgreSQL text cannot hold NUL: one NUL in a job's output must not make its outcome
        # unrecordable (the slot would then run again and again).
        return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd"), cut


def truncation_notice(written: int) -> str:
    return f"[cronops] output truncated: only the end of {written} bytes is shown\n"


def _write_all(fd: int, data: bytes) -> tuple[int, str]:
    """Write `data` to `fd`; (bytes that could not be written, why) - never raises."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError as exc:
            # A full disk under the log, or the reader went away: the job must not fail for
            # it, but the loss is counted so that the runner can report it.
            return len(view), exc.strerror or type(exc).__name__
        view = view[written:]
    return 0, ""


def write_fd(fd: int, text: str) -> None:
    """Write `text` to descriptor `fd`, past Python's stream objects (which the job may have
    closed or replaced); never raises."""
    _flush()
    _write_all(fd, text.encode("utf-8", "backslashreplace"))


def _flush_or_drop(stream, fd: int) -> None:
    """Flush `stream` (whose descriptor is `fd`); when that fails, drop what it holds.

    Bytes a job left in `sys.stdout`'s buffer after closing or filling its own stdout cannot be
    written; kept, they would fail every later flush, and the one at interpreter exit turns the
    exit code into 120. They are flushed into /dev/null instead.
    """
    try:
        stream.flush()
        return
    except ValueError:
        return  # closed: nothing is pending
    except Exception:  # noqa: S110  OSError (closed or full descriptor), or a job's odd object
        pass
    try:
        saved = os.dup(fd)
    except OSError:
        saved = None  # the job closed it
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
        with contextlib.suppress(Exception):
            stream.flush()
    finally:
        if saved is not None:
            os.dup2(saved, fd)
            os.close(saved)


# Held while the runner puts descriptors back on fds 1 and 2, and while a thread of ours makes
# sure fds 0-2 are taken before it opens a socket (see hold_standard_fds).
FD_TABLE = threading.Lock()


def hold_standard_fds() -> None:
    """Put /dev/null on any of fds 0, 1, 2 the job closed.

    A descriptor opened while one of them is free takes its number: a ping's socket would
    become fd 1, receive the job's output, and be closed under the runner's restored stdout
    later. Our threads call this before they open one; the job's own threads are its own."""
    with FD_TABLE:
        for fd in (0, 1, 2):
            try:
                os.fstat(fd)
            except OSError:
                null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                if null != fd:
                    os.dup2(null, fd, inheritable=False)
                    os.close(null)


def socket_above_standard_fds(family: int, kind: int, proto: int) -> socket.socket:
    """A new socket whose descriptor is not 0, 1 or 2.

    hold_standard_fds() runs first, but the job may close fd 1 between that and our socket():
    the socket then sits on fd 1 and the job's prints would go into the ping (seen in CI as a
    start ping sent twice). Such a socket is moved above 2 before it connects, and its low
    number is closed again, as the job left it; what the job wrote meanwhile went nowhere."""
    hold_standard_fds()
    sock = socket.socket(family, kind, proto)
    low = sock.fileno()
    if low > 2:
        return sock
    high = fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 3)
    moved = socket.socket(family, kind, proto, fileno=high)
    mine = os.fstat(high)
    sock.detach()
    with FD_TABLE, contextlib.suppress(OSError):
        now = os.fstat(low)
        if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):  # not replaced by the job
            os.close(low)
    return moved


def settle() -> None:
    """Leave `sys.stdout` and `sys.stderr` flushable at exit, whatever happened to them."""
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        if stream is not None:
            _flush_or_drop(stream, fd)


def _reopened(fd: int, old) -> object:
    """A new text stream on `fd` in place of `old`, a standard stream the job closed."""
    return open(
        fd,
        "w",
        encoding=getattr(old, "encoding", None) or "utf-8",
        errors="backslashreplace",
        buffering=1,
        closefd=False,
    )


class CapturedOutput:
    """Context manager: fds 1 and 2 go through pipes into `tail` (and through, unless quiet)."""

    def __init__(self, tail: Tail, quiet: bool = False):
        self.tail = tail
        self.quiet = quiet
        self._spool = tempfile.TemporaryFile() if quiet else None
        self._spool_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._saved: dict[int, int] = {}
        self._streams: dict[int, object] = {}  # sys.stdout/sys.stderr as the job got them
        self._replaced: dict[int, object] = {}  # ... and what replaced them when it closed them
        self.lost = 0  # bytes of output that could not be passed through
        self.lost_reason = ""

    def __enter__(self):
        _flush()
        self._streams = {1: sys.stdout, 2: sys.stderr}
        for fd in (1, 2):
            read_end, write_end = os.pipe()
            self._saved[fd] = os.dup(fd)
            # The reader gets a descriptor of its own, closed only by itself: a background child
            # that outlives the job keeps writing to the real output, never to a reused number.
            original = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(
                target=self._pump,
                args=(read_end, original),
                daemon=True,
                name=f"cronops-output-{fd}",
            )
            start_thread(thread)
            self._threads.append(thread)
        return self

    def _pump(self, read_end: int, original: int) -> None:
        try:
            while chunk := os.read(read_end, CHUNK):
                self.tail.write(chunk)
                if self._spool is not None:
                    with self._spool_lock:
                        if not self._spool.closed:  # a child outliving the job: drop it
                            self._spool.write(chunk)
                else:
                    self._count_loss(*_write_all(original, chunk))
        finally:
            os.close(read_end)
            os.close(original)

    def _count_loss(self, lost: int, reason: str) -> None:
        if lost:
            self.lost += lost
            self.lost_reason = self.lost_reason or reason

    def loss_note(self) -> str:
        """One line about output that never reached the log, or ""."""
        if not self.lost:
            return ""
        return (
            f"output lost: {self.lost} of {self.tail.total} bytes not written ({self.lost_reason})"
        )

    def __exit__(self, *exc):
        self.restore()
        return False

    def restore(self, join_timeout: float = 2.0) -> None:
        if not self._saved:
            return
        for fd, stream in self._streams.items():
            current = sys.stdout if fd == 1 else sys.stderr
            for candidate in {id(s): s for s in (stream, current) if s is not None}.values():
                _flush_or_drop(candidate, fd)
        with FD_TABLE:
            for fd, saved in self._saved.items():
                try:
                    os.dup2(saved, fd)  # drops our pipe's write end: its reader sees EOF
                except OSError:  # the job closed our copy too: never leave fd 1 or 2 free
                    null = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(null, fd)
                    os.close(null)
        # A background child that still holds the pipe must not hold the runner up.
        deadline = time.monotonic() + join_timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for saved in self._saved.values():
            try:
                os.close(saved)
            except OSError:
                pass
        self._saved = {}
        for fd, name in ((1, "stdout"), (2, "stderr")):
            stream = getattr(sys, name)
            if stream is None or getattr(stream, "closed", False):
                self._replaced[fd] = _reopened(fd, stream)
                setattr(sys, name, self._replaced[fd])

    def usable(self, stream):
        """`stream`, or the stream that replaced it if it was sys.stdout/sys.stderr and the job
        closed it (the runner's messages go to the same place as before)."""
        for fd, original in self._streams.items():
            if stream is original and fd in self._replaced:
                return self._replaced[fd]
        return stream

    def replay(self) -> None:
        """Print the spooled output (quiet mode, on failure)."""
        if self._spool is None:
            return
        with self._spool_lock:
            self._spool.seek(0)
            while chunk := self._spool.read(CHUNK):
                self._count_loss(*_write_all(1, chunk))

    def close(self) -> None:
        if self._spool is not None:
            with self._spool_lock:
                self._spool.close()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


class JobLog:
    """`run_job --log=PATH`: descriptors 1 and 2 append to PATH for the whole run.

    Installed cron lines use this instead of a shell `>> PATH 2>&1`, which fails before run_job
    starts when the directory is gone (deleted, not created yet on a new host): then nothing
    is recorded, pinged or written anywhere. Here the directory is created (0750) and the file
    opened with O_APPEND|O_CREAT|O_NOFOLLOW (0640). When that fails, the output stays where
    cron sends it (its mail) and `problem` says why, for the history note and the ping.
    """

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self.problem = ""
        self._saved: dict[int, int] = {}
        if self.path is not None:
            self._open(self.path)

    def _open(self, path: Path) -> None:
        try:
            fd = _open_append(path)
        except OSError as exc:
            reasons: dict[int | None, str | None] = {
                errno.ELOOP: "it is a symbolic link",
                errno.ENXIO: "it is not a regular file",  # a FIFO nobody reads
            }
            why = reasons.get(exc.errno, exc.strerror)
            self.problem = f"cannot open the log {path}: {why}; output went to cron's mail"
            return
        _flush()
        for target in (1, 2):
            try:
                self._saved[target] = os.dup(target)
            except OSError:
                pass  # started with it closed: nothing to put back
            os.dup2(fd, target)
        if fd > 2:
            os.close(fd)

    def close(self) -> None:
        """Put the descriptors back (for in-process callers; cron's process just exits)."""
        if not self._saved:
            return
        settle()
        for target, saved in self._saved.items():
            os.dup2(saved, target)
            os.close(saved)
        self._saved = {}


def _open_append(path: Path) -> int:
    missing = []
    directory = path.parent
    while not directory.is_dir() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o750)
        except FileExistsError:
            pass  # another job of this minute made it first
    # O_NONBLOCK: a FIFO planted at the path (no reader) would block the open, and the job with it.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(path, flags, 0o640)
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):  # a file, or /dev/null
        os.close(fd)
        raise OSError(errno.EINVAL, "it is not a regular file")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def standard_streams() -> None:
    """Started with fd 1 or 2 closed (`>&-`), Python sets sys.stdout / sys.stderr to None, and
    every command's `self.stdout.write` fails after its work is done (recorded failed, and so
    run again). Give them a stream on the fd: the --log file, else /dev/null."""
    hold_standard_fds()
    for name, fd in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:
            setattr(sys, name, _reopened(fd, None))
