"""run_job's writes to its own descriptors, by a thread: a reader that stops reading costs
time at run_job's exit, never the job's pace, the record or the heartbeat.

Everything run_job writes to a descriptor (its `cronops:` lines, the job's output it passes
through, a --quiet run's replay) is queued, in order, one queue per descriptor, and a writer
thread writes it out. So neither the main thread (which records the outcome), the heartbeat
nor the job ever waits on a pipe nobody reads (`run_job … | less` left on its first page,
`| sleep 25`, a stalled log shipper). What a slow reader has not taken is kept in memory up to
ROOM bytes a descriptor, then in a temporary file (disk, not memory, as --quiet's spool), and
written when the reader takes it: the job runs at its own pace and ends when it is done, its
outcome is recorded then, and run_job's process stays to write the rest (its lock released,
its claim recorded) until the reader has taken it or gone away.

Where no temporary file can be made (a full /tmp), the job's output waits for room instead,
as a plain command's would; run_job's own lines never wait.

A writer thread ends as soon as its queue is empty: usually none is alive when run_job forks.
The child of a fork never uses the queue; it writes straight to its descriptors.
"""

import contextlib
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import BinaryIO

CHUNK = 65536
ROOM = 4 * CHUNK  # bytes kept in memory per descriptor; more goes to a temporary file
Loss = Callable[[int, str], None]  # (bytes not written, why), called by the writer thread


class _Item:
    """Bytes to write, or a file to copy from its start (a --quiet replay)."""

    __slots__ = ("data", "file", "on_loss", "seq")

    def __init__(
        self, data: bytes = b"", file: BinaryIO | None = None, on_loss: Loss | None = None
    ):
        self.data, self.file, self.on_loss, self.seq = data, file, on_loss, 0


class _Spill(_Item):
    """What a slow reader has not taken yet beyond ROOM: appended to a temporary file while it
    is the last item of its queue, read back by the writer."""

    __slots__ = ("end", "fd", "read")

    def __init__(self, on_loss: Loss | None):
        super().__init__(on_loss=on_loss)
        self.fd = _temporary_fd()
        self.end = self.read = 0

    def append(self, data: bytes) -> None:
        """All of `data` after what is there, or OSError (and then nothing of it counts)."""
        offset, view = self.end, memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, offset)
            offset, view = offset + written, view[written:]
        self.end = offset

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _temporary_fd() -> int:
    with tempfile.TemporaryFile() as file:  # unlinked at once: only the descriptor holds it
        return os.dup(file.fileno())


class Outbox:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queues: dict[int, deque[_Item]] = {}
        self._in_memory: dict[int, int] = {}  # bytes of each queue held in memory
        self._writers: dict[int, threading.Thread] = {}
        self._seq = 0  # the last item queued
        self._done: dict[int, int] = {}  # per descriptor, the last item written (or given up)
        self.spill_problem = ""  # why no temporary file could take what a reader left
        self.direct = False  # in a forked child: write at once, in the caller

    def put(self, fd: int, data: bytes, on_loss: Loss | None = None, *, job: bool = False) -> None:
        """Queue `data` for `fd`; never waits on the reader. `job`: the job's output, which
        waits for room when nothing can be kept on disk (run_job's own lines never do)."""
        if not data:
            return
        if self.direct:
            _write(fd, data, on_loss)
            return
        with self._lock:
            queue = self._queues.setdefault(fd, deque())
            last = queue[-1] if queue else None
            if isinstance(last, _Spill) and self._spilled(last, data):
                self._changed.notify_all()
                return
            if self._in_memory.get(fd, 0) + len(data) > ROOM and self._spill(fd, data, on_loss):
                return
            while job and self._in_memory.get(fd, 0) >= ROOM and self._writers.get(fd):
                self._changed.wait(0.5)  # no disk for it: at the reader's pace
            self._queue(fd, _Item(data, on_loss=on_loss))

    def put_file(self, fd: int, file: BinaryIO, on_loss: Loss | None = None) -> None:
        """Queue the whole of `file` (from its start) for `fd`; the writer closes it."""
        if self.direct:
            _copy(fd, file, on_loss)
            return
        with self._lock:
            self._queue(fd, _Item(file=file, on_loss=on_loss))

    def _spilled(self, spill: _Spill, data: bytes) -> bool:
        try:
            spill.append(data)
            return True
        except OSError as exc:
            self.spill_problem = self.spill_problem or (exc.strerror or str(exc))
            return False

    def _spill(self, fd: int, data: bytes, on_loss: Loss | None) -> bool:
        """Start keeping `fd`'s queue on disk, with `data`; False when no file can take it."""
        try:
            spill = _Spill(on_loss)
        except OSError as exc:
            self.spill_problem = self.spill_problem or (exc.strerror or str(exc))
            return False
        if not self._spilled(spill, data):
            spill.close()
            return False
        self._queue(fd, spill)
        return True

    def _queue(self, fd: int, item: _Item) -> None:
        self._seq += 1
        item.seq = self._seq
        self._queues.setdefault(fd, deque()).append(item)
        self._in_memory[fd] = self._in_memory.get(fd, 0) + len(item.data)
        writer = self._writers.get(fd)
        if writer is None or not writer.is_alive():
            writer = threading.Thread(
                target=self._write, args=(fd,), daemon=True, name=f"cronops-outbox-{fd}"
            )
            self._writers[fd] = writer
            writer.start()

    def _write(self, fd: int) -> None:
        while True:
            with self._lock:
                queue = self._queues.get(fd)
                if not queue:
                    self._writers.pop(fd, None)
                    self._changed.notify_all()
                    return
                item = queue[0]
                # A spill is written up to its end as it stands; it is done once it is read to
                # its end and nothing came after it (then puts start a new item).
                size = item.end - item.read if isinstance(item, _Spill) else 0
            # Outside the lock: these are the writes that may wait on the reader.
            if isinstance(item, _Spill):
                if size:
                    self._copy_spill(fd, item, size)
                    continue
            elif item.file is not None:
                _copy(fd, item.file, item.on_loss)
            else:
                _write(fd, item.data, item.on_loss)
            with self._lock:
                if isinstance(item, _Spill) and item.read < item.end:
                    continue  # appended to meanwhile
                queue.popleft()
                self._in_memory[fd] -= len(item.data)
                self._done[fd] = item.seq
                self._changed.notify_all()
            if isinstance(item, _Spill):
                item.close()

    def _copy_spill(self, fd: int, spill: _Spill, size: int) -> None:
        try:
            data = os.pread(spill.fd, min(size, CHUNK), spill.read)
        except OSError as exc:
            data = b""
            if spill.on_loss is not None:
                spill.on_loss(size, exc.strerror or str(exc))
        spill.read += len(data) or size
        _write(fd, data, spill.on_loss)

    def flush(self, deadline: float | None = None) -> bool:
        """Wait until what is queued now is written (or given up), at most until `deadline`
        (time.monotonic()); False when the deadline came first."""
        with self._lock:
            target = {fd: q[-1].seq for fd, q in self._queues.items() if q}
            while any(self._done.get(fd, 0) < seq for fd, seq in target.items()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(min(left, 1.0) if left is not None else 1.0)
        return True

    def quiesce(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for every writer thread to end (before a fork: what a
        child inherits is then one thread's state). A writer still waiting on its reader after
        that is left alone: it holds no lock the child takes (the child's queue is new)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            writers = list(self._writers.values())
        for writer in writers:
            writer.join(max(0.0, deadline - time.monotonic()))


def write_all(fd: int, data: bytes) -> tuple[int, str]:
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


def _write(fd: int, data: bytes, on_loss: Loss | None) -> None:
    lost, why = write_all(fd, data)
    if lost and on_loss is not None:
        on_loss(lost, why)


def _copy(fd: int, file: BinaryIO, on_loss: Loss | None) -> None:
    try:
        file.seek(0)
        while chunk := file.read(CHUNK):
            _write(fd, chunk, on_loss)
    except (OSError, ValueError) as exc:
        if on_loss is not None:
            on_loss(0, getattr(exc, "strerror", None) or str(exc))
    finally:
        with contextlib.suppress(OSError):
            file.close()


OUTBOX = Outbox()


def _in_child() -> None:
    # A writer thread does not exist in the child, and may have held the lock at the fork.
    OUTBOX._reset()
    OUTBOX.direct = True


os.register_at_fork(after_in_child=_in_child)
