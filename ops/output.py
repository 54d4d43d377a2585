"""Pass a job's output through while keeping a bounded tail of it.

The job runs in-process, so its stdout and stderr are file descriptors 1 and 2 (and whatever
child processes it starts inherit them). Both are redirected into pipes; a reader thread per
stream copies the bytes to the original descriptor and into a ring buffer. Memory stays bounded
whatever the job prints. With `quiet`, output is spooled to a temporary file (disk, not memory)
and printed only when the job fails, like `chronic`.
"""

import os
import sys
import tempfile
import threading
import time

CHUNK = 65536


class Tail:
    """The last `limit` bytes written, and how many bytes were written in all."""

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0
        self._buf = bytearray()
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self.total += len(data)
            self._buf += data
            if len(self._buf) > 2 * self.limit:
                del self._buf[: len(self._buf) - self.limit]

    def bytes(self, limit: int | None = None) -> bytes:
        limit = self.limit if limit is None else min(limit, self.limit)
        with self._lock:
            data = bytes(self._buf[-limit:]) if limit else b""
        return data

    def text(self, limit: int | None = None) -> str:
        data = self.bytes(limit)
        cut = self.total > len(data)
        # PostgreSQL text cannot hold NUL: one NUL in a job's output must not make its outcome
        # unrecordable (the slot would then run again and again).
        text = data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        if cut:
            text = text[1:] if text.startswith("\ufffd") else text
            return f"[cronops] output truncated, last {len(data)} of {self.total} bytes\n{text}"
        return text


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


class CapturedOutput:
    """Context manager: fds 1 and 2 go through pipes into `tail` (and through, unless quiet)."""

    def __init__(self, tail: Tail, quiet: bool = False):
        self.tail = tail
        self.quiet = quiet
        self._spool = tempfile.TemporaryFile() if quiet else None
        self._spool_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._saved: dict[int, int] = {}
        self.lost = 0  # bytes of output that could not be passed through
        self.lost_reason = ""

    def __enter__(self):
        _flush()
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
            thread.start()
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
        _flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # drops our pipe's write end: its reader sees EOF
        # A background child that still holds the pipe must not hold the runner up.
        deadline = time.monotonic() + join_timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for saved in self._saved.values():
            os.close(saved)
        self._saved = {}

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
        except (OSError, ValueError):
            pass
