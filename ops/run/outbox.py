"""run_job's writes to its own descriptors, by a thread: a reader that stops reading costs
output, never the record or the heartbeat.

Everything run_job writes to a descriptor (its `cronops:` lines, the job's output it passes
through, a --quiet run's replay) is queued, in order, one queue per descriptor, and a writer
thread writes it out. So the main thread (which records the outcome) and the heartbeat never
wait on a pipe nobody reads (`run_job … | less`, `| sleep 25`, a stalled log shipper): they
queue and go on. The job's output waits for room while the job runs (it goes at the reader's
pace, as a plain command's would); once the job has ended, what is left in its pipes is queued
without waiting (the pipes' capacity bounds it), so its last lines reach the tail and the
record whatever the reader does.

A writer thread ends as soon as its queue is empty: usually none is alive when run_job forks.
The child of a fork never uses the queue; it writes straight to its descriptors.
"""

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import BinaryIO

CHUNK = 65536
ROOM = 4 * CHUNK  # bytes of the job's output queued per descriptor before the job waits
Loss = Callable[[int, str], None]  # (bytes not written, why), called by the writer thread


class _Item:
    __slots__ = ("data", "file", "on_loss", "seq")

    def __init__(self, data: bytes, file: BinaryIO | None, on_loss: Loss | None, seq: int):
        self.data, self.file, self.on_loss, self.seq = data, file, on_loss, seq


class Outbox:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queues: dict[int, deque[_Item]] = {}
        self._queued: dict[int, int] = {}  # bytes waiting, per descriptor (files not counted)
        self._writers: dict[int, threading.Thread] = {}
        self._seq = 0  # the last item queued
        self._done: dict[int, int] = {}  # per descriptor, the last item written (or given up)
        self.direct = False  # in a forked child: write at once, in the caller

    def put(self, fd: int, data: bytes, on_loss: Loss | None = None, wait=None) -> None:
        """Queue `data` for `fd`. With `wait` (a callable), while it returns True and the queue
        is full, the caller waits for room: the job's output, while the job runs."""
        if not data:
            return
        if self.direct:
            lost, why = write_all(fd, data)
            if lost and on_loss is not None:
                on_loss(lost, why)
            return
        with self._lock:
            while wait is not None and self._queued.get(fd, 0) >= ROOM and wait():
                self._changed.wait(0.5)
            self._queue(fd, _Item(data, None, on_loss, 0))

    def put_file(self, fd: int, file: BinaryIO, on_loss: Loss | None = None) -> None:
        """Queue the whole of `file` (from its start) for `fd`; the writer closes it."""
        if self.direct:
            _copy(fd, file, on_loss)
            return
        with self._lock:
            self._queue(fd, _Item(b"", file, on_loss, 0))

    def _queue(self, fd: int, item: _Item) -> None:
        self._seq += 1
        item.seq = self._seq
        self._queues.setdefault(fd, deque()).append(item)
        self._queued[fd] = self._queued.get(fd, 0) + len(item.data)
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
            # Outside the lock: this is the write that may wait on the reader.
            if item.file is not None:
                _copy(fd, item.file, item.on_loss)
            else:
                lost, why = write_all(fd, item.data)
                if lost and item.on_loss is not None:
                    item.on_loss(lost, why)
            with self._lock:
                queue.popleft()
                self._queued[fd] -= len(item.data)
                self._done[fd] = item.seq
                self._changed.notify_all()

    def wake(self) -> None:
        """Waiters for room look again at their `wait` (the job has ended)."""
        with self._lock:
            self._changed.notify_all()

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


def _copy(fd: int, file: BinaryIO, on_loss: Loss | None) -> None:
    try:
        file.seek(0)
        while chunk := file.read(CHUNK):
            lost, why = write_all(fd, chunk)
            if lost and on_loss is not None:
                on_loss(lost, why)
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
