"""The job's output: passed through, kept as a bounded tail, and run_job's own log.

The job runs in a child process whose stdout and stderr are pipes (ops/run/supervisor.py). A
reader thread per stream hands the bytes to run_job's writer for its own descriptor 1 or 2
(cron's mail, or `--log`; ops/run/outbox.py) and keeps them in a ring buffer, so memory stays
bounded whatever the job prints. With
`quiet`, output is spooled to a temporary file (disk, not memory) and printed only when the
job fails, like `chronic`. Whatever the job does to its own descriptors, run_job's stay its own.
"""

import contextlib
import errno
import fcntl
import os
import stat
import sys
import tempfile
import threading
import time
from builtins import bytes as _bytes
from pathlib import Path

from .failure import LastLine
from .outbox import OUTBOX

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
    Cuts fall on UTF-8 character boundaries.

    The job's stdout and stderr are written by two reader threads, in the order they read
    them: each stream's unfinished line is kept apart until its newline, so that one stream's
    output never lands inside a line of the other (`exiting with 7logical date ...`). Lines
    are kept in the order they were finished; a line longer than the tail is taken as it
    comes; what is still unfinished is shown last, one line per stream."""

    def __init__(self, limit: int, redactor=None):
        self.limit = limit
        self.redactor = redactor
        self.margin = redactor.longest if redactor else 0
        self.total = 0
        self._buf = bytearray()
        self._open: dict[int, bytearray] = {}  # per stream: its unfinished line
        self._lock = threading.Lock()

    def write(self, data: bytes, stream: int = 0) -> None:
        keep = self.limit + self.margin
        with self._lock:
            self.total += len(data)
            line = self._open.setdefault(stream, bytearray())
            line += data
            end = line.rfind(b"\n") + 1
            if end == 0:
                if len(line) <= keep:
                    return  # unfinished: kept apart until its newline
                end = len(line)  # longer than the tail: taken as it comes
            self._buf += line[:end]
            del line[:end]
            if len(self._buf) > 2 * keep:
                del self._buf[: len(self._buf) - keep]

    def _window(self, size: int) -> tuple[_bytes, int]:
        """(the last `size` bytes: the finished lines, then each stream's unfinished line on a
        line of its own; how many of those bytes the job wrote, the added newlines not)."""
        if not size:
            return b"", 0
        pending = [bytes(line) for line in self._open.values() if line]
        # After a line longer than the tail, taken unfinished, what is pending starts anew.
        apart = b"\n" if pending and self._buf and not self._buf.endswith(b"\n") else b""
        data = bytes(self._buf[-size:]) + apart + b"\n".join(pending)
        return data[-size:], min(size, len(self._buf) + sum(map(len, pending)))

    def bytes(self, limit: int | None = None) -> bytes:
        """The last `limit` bytes (redacted), starting on a character boundary."""
        return self._cut(limit)[0]

    def _cut(self, limit: int | None) -> tuple[_bytes, bool]:
        """(the last `limit` bytes, redacted; whether output before them was left out)."""
        limit = self.limit if limit is None else min(limit, self.limit)
        with self._lock:
            window, written = self._window(limit + self.margin if limit else 0)
            whole = self.total <= written
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


def write_fd(fd: int, text: str) -> None:
    """Queue `text` for descriptor `fd` (ops/run/outbox.py): never waits on its reader, never
    raises."""
    _flush()
    with contextlib.suppress(Exception):
        OUTBOX.put(fd, text.encode("utf-8", "backslashreplace"))


def _flush_or_drop(stream, fd: int) -> None:
    """Flush `stream` (whose descriptor is `fd`); when that fails, drop what it holds.

    Bytes that cannot be written (a full disk under the log, a reader gone) would fail every
    later flush, and the one at interpreter exit turns the exit code into 120. They are
    flushed into /dev/null instead.
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


def settle() -> None:
    """Leave `sys.stdout` and `sys.stderr` flushable at exit, whatever happened to them."""
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        if stream is not None:
            _flush_or_drop(stream, fd)


class Tee:
    """The job's stdout and stderr pipes, read until every writer is gone: through to run_job's
    fds 1 and 2 (or into a spool file, quiet), and into `tail`. What passes through is queued
    for run_job's writer threads (ops/run/outbox.py): a reader of run_job's that stops reading
    holds up neither the job nor the end of the run."""

    def __init__(self, tail: Tail, quiet: bool = False):
        self.tail = tail
        self.quiet = quiet
        self.last_err = LastLine(tail.margin)  # why a failure failed (ops/run/failure.py)
        self._replayed = False  # the spool is the writer's now
        self._spool_lock = threading.Lock()
        self.spool_problem = ""
        self._spool = None
        if quiet:
            try:
                self._spool = tempfile.TemporaryFile()
            except OSError as exc:  # no usable TMPDIR: the output passes through instead
                self.spool_problem = (
                    f"--quiet could not spool the output ({exc.strerror or exc}): it passed through"
                )
        self._threads: list[threading.Thread] = []
        self.deadline: float | None = None  # when the output stops holding the run up (finish)
        self._lost_before = OUTBOX.lost  # what run_job had failed to write before this run

    def start(self, stdout: int, stderr: int) -> None:
        """Read the pipes' read ends (this object closes them). RuntimeError when a reader
        thread cannot be started (a process limit): the pipes it would read are closed."""
        for source, target in ((stdout, 1), (stderr, 2)):
            thread = threading.Thread(
                target=self._pump,
                args=(source, target),
                daemon=True,
                name=f"cronops-output-{target}",
            )
            try:
                thread.start()
            except RuntimeError:
                for fd in (stdout, stderr)[len(self._threads) :]:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                raise
            self._threads.append(thread)

    def _pump(self, source: int, target: int) -> None:
        # Only a failed read ends the loop: closing the pipe early would kill the job with
        # EPIPE for a problem of run_job's (a full spool, a full log).
        try:
            while chunk := _read(source):
                self.tail.write(chunk, target)
                if target == 2:
                    self.last_err.write(chunk)
                if not self._spooled(chunk):
                    OUTBOX.put(target, chunk, job=True)
        finally:
            os.close(source)

    def _spooled(self, chunk: bytes) -> bool:
        """Whether `chunk` went into the quiet spool. When the spool's disk is full, quiet
        ends: what follows passes through (cron's mail still gets it), and the note says so."""
        if self._spool is None:
            return False
        with self._spool_lock:
            if self._replayed or self._spool.closed:
                return self.spool_problem == ""  # a child outliving the job: dropped
            try:
                self._spool.write(chunk)
                return True
            except OSError as exc:
                self.spool_problem = (
                    f"--quiet could not spool the output ({exc.strerror or exc}): the output "
                    "after that passed through"
                )
                # Closing flushes what the buffer holds, onto the same full disk: it raises
                # again, and the file is closed all the same.
                with contextlib.suppress(OSError):
                    self._spool.close()
                return False

    def finish(self, timeout: float) -> None:
        """The job has ended: read both pipes to their end of file and see what passed through
        written, for at most `timeout` seconds in all (also `settle`'s bound): a process the job
        left behind that still holds a pipe, or a reader of run_job's that stopped reading,
        must not hold the record up."""
        self.deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, self.deadline - time.monotonic()))
        self.settle()

    def settle(self) -> None:
        """Wait (until finish's deadline) for what is queued to be written, so that a loss (a
        full disk under the log) is known before the outcome is recorded. Without a deadline
        (the job never ran) there is nothing of the job's to wait for."""
        if self.deadline is not None:
            OUTBOX.flush(self.deadline)

    @property
    def lost(self) -> int:
        """Bytes of output that could not be written since this run began (run_job's own
        lines among them: they share the log)."""
        return OUTBOX.lost - self._lost_before

    def loss_note(self) -> str:
        """One line about output that never reached the log, or ""."""
        if not self.lost:
            return ""
        return (
            f"output lost: {self.lost} of {self.tail.total} bytes not written "
            f"({OUTBOX.lost_reason})"
        )

    def replay(self) -> None:
        """Print the spooled output (quiet mode, on failure): queued, the writer closes it."""
        if self._spool is None:
            return
        with self._spool_lock:
            if self._replayed or self._spool.closed:
                return  # it failed: what came after it passed through already
            with contextlib.suppress(OSError):
                self._spool.flush()
            OUTBOX.put_file(1, self._spool)
            self._replayed = True

    def close(self) -> None:
        if self._spool is not None and not self._replayed:
            with self._spool_lock, contextlib.suppress(OSError):
                self._spool.close()


def _read(source: int) -> bytes:
    """The next chunk of a pipe, or b"" at its end (or when it cannot be read)."""
    try:
        return os.read(source, CHUNK)
    except OSError:
        return b""


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def log_option(argv: list[str]) -> str | None:
    """The `--log` of `argv`; also when another option is malformed (its error goes there)."""
    from ..schedule.options import OptionsError, parse_run_args

    try:
        return parse_run_args(argv).log
    except OptionsError:
        for word in argv:  # installed lines write --log=PATH first
            if not word.startswith("-"):
                break
            if word.startswith("--log="):
                return word.removeprefix("--log=")
        return None


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
            fd = open_append(path)
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


def open_append(path: Path) -> int:
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
    """Started with fd 0, 1 or 2 closed (`>&-`), run_job's first pipe would take its number
    (and the job's output would go where its stdin should be), and Python sets sys.stdout /
    sys.stderr to None, so every command's `self.stdout.write` would fail after its work is
    done. /dev/null goes on each closed one, and the streams get a stream on it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:
            stream = open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            setattr(sys, name, stream)
