"""run_job's writes to its own stdout and stderr, by a thread: a reader that stops reading
costs time at run_job's exit, never the record or the heartbeat.

Everything run_job writes to its descriptors (its `cronops:` lines, the job's output it passes
through, a --quiet run's replay) is queued, in order, and a writer thread writes it out. So
neither the main thread (which records the outcome) nor the heartbeat ever waits on a pipe
nobody reads (`run_job … | less` left on its first page, `| sleep 25`, a stalled log shipper):
they queue and go on. Descriptors that lead to the same place (`2>&1`, cron's mail pipe,
`--log`) share one queue, so what lands there keeps the order it was written in.

What a slow reader has not taken is kept in memory up to ROOM bytes a queue, then in a
temporary file (TMPDIR; --quiet's spool lives there too) up to SPILL_MAX: the job runs at its
own pace and its outcome is recorded when it ends, and run_job's process stays to write the
rest (its lock released, its claim recorded) until the reader has taken it or gone away. Past
SPILL_MAX, or where no temporary file can be made, the job's output waits for the reader, as a
plain command's would (memory and the temporary file stay bounded); run_job's own lines never
wait.

A writer thread ends once its queue has stayed empty for LINGER seconds, or at once before a
fork (`quiesce`): usually none is alive when run_job forks. The child of a fork never uses the
queue; it writes straight to its descriptors.
"""

import atexit
import contextlib
import os
import stat
import tempfile
import threading
import time
from collections import deque
from typing import BinaryIO

CHUNK = 65536
ROOM = 4 * CHUNK  # bytes a queue keeps in memory; more goes to a temporary file
SPILL_MAX = 32 * 1024 * 1024  # bytes a queue keeps in its temporary file, at most
LINGER = 1.0  # seconds an idle writer waits for more before it ends
EXIT_FLUSH = 10.0  # seconds an interpreter exit waits for what is still queued
QUIESCE = 0.2  # seconds a fork waits for a busy writer to end


class _Item:
    """Bytes to write to `fd`, or a file to copy from its start (a --quiet replay)."""

    __slots__ = ("data", "fd", "file", "seq")

    def __init__(self, fd: int, data: bytes = b"", file: BinaryIO | None = None):
        self.fd, self.data, self.file, self.seq = fd, data, file, 0


class _Spill(_Item):
    """What a slow reader has not taken beyond ROOM: appended to a temporary file while it is
    the last item of its queue, read back by the writer; `segments` say which descriptor each
    stretch of it is for (stdout and stderr may share a queue)."""

    __slots__ = ("end", "read", "segments", "spill_fd")

    def __init__(self, fd: int):
        super().__init__(fd)
        with tempfile.TemporaryFile() as file:  # unlinked: only the descriptor holds it
            self.spill_fd = os.dup(file.fileno())
        self.end = self.read = 0
        self.segments: deque[list[int]] = deque()  # [fd, end offset], in order

    def append(self, fd: int, data: bytes) -> None:
        """All of `data` after what is there, or OSError (and then none of it counts)."""
        offset, view = self.end, memoryview(data)
        while view:
            written = os.pwrite(self.spill_fd, view, offset)
            offset, view = offset + written, view[written:]
        self.end = offset
        if self.segments and self.segments[-1][0] == fd:
            self.segments[-1][1] = offset
        else:
            self.segments.append([fd, offset])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.spill_fd)


class _Queue:
    def __init__(self) -> None:
        self.items: deque[_Item] = deque()
        self.in_memory = 0  # bytes of its items held in memory
        self.on_disk = 0  # bytes of its spills not read back yet
        self.writer: threading.Thread | None = None
        self.done = 0  # the last item written (or given up)


def _destination(fd: int) -> object:
    """What `fd` leads to: descriptors that write to the same file or pipe share a queue."""
    try:
        info = os.fstat(fd)
    except OSError:
        return fd
    if stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode):
        return (info.st_dev, info.st_ino)
    return fd  # a terminal: each descriptor its own queue (they share a screen, not a buffer)


class Outbox:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queues: dict[object, _Queue] = {}
        self._seq = 0  # the last item queued
        self._parking = False  # writers end as soon as they are idle (a fork comes)
        self.lost = 0  # bytes that could not be written, in all (Tee counts its share)
        self.lost_reason = ""
        self.direct = False  # in a forked child: write at once, in the caller

    def put(self, fd: int, data: bytes, *, job: bool = False) -> None:
        """Queue `data` for `fd`; never waits on the reader, but `job` (the job's output) does
        when the queue's memory and temporary file are full."""
        if not data:
            return
        if self.direct:
            self._write(fd, data)
            return
        with self._lock:
            queue = self._queues.setdefault(_destination(fd), _Queue())
            last = queue.items[-1] if queue.items else None
            if isinstance(last, _Spill) and self._spilled(queue, last, fd, data):
                self._changed.notify_all()
                return
            if queue.in_memory + len(data) > ROOM and not isinstance(last, _Spill):
                spill = self._spill(queue, fd, data)
                if spill is not None:
                    self._queue(queue, spill)
                    return
            while job and queue.in_memory >= ROOM and queue.writer is not None:
                self._changed.wait(0.5)  # no room left: at the reader's pace
            self._queue(queue, _Item(fd, data))

    def put_file(self, fd: int, file: BinaryIO) -> None:
        """Queue the whole of `file` (from its start) for `fd`; the writer closes it."""
        if self.direct:
            self._copy(fd, file)
            return
        with self._lock:
            self._queue(self._queues.setdefault(_destination(fd), _Queue()), _Item(fd, file=file))

    def _spilled(self, queue: _Queue, spill: _Spill, fd: int, data: bytes) -> bool:
        if queue.on_disk + len(data) > SPILL_MAX:
            return False
        try:
            spill.append(fd, data)
        except OSError:
            return False  # a full TMPDIR: the queue's memory, then the reader's pace
        queue.on_disk += len(data)
        return True

    def _spill(self, queue: _Queue, fd: int, data: bytes) -> _Spill | None:
        if queue.on_disk + len(data) > SPILL_MAX:
            return None
        try:
            spill = _Spill(fd)
        except OSError:
            return None
        if not self._spilled(queue, spill, fd, data):
            spill.close()
            return None
        return spill

    def _queue(self, queue: _Queue, item: _Item) -> None:
        self._seq += 1
        item.seq = self._seq
        queue.items.append(item)
        queue.in_memory += len(item.data)
        if queue.writer is None:
            writer = threading.Thread(
                target=self._drain, args=(queue,), daemon=True, name="cronops-outbox"
            )
            try:
                writer.start()
            except RuntimeError:  # no thread to be had (a process limit): write it here
                self._drain_here(queue)
                return
            queue.writer = writer

    def _drain_here(self, queue: _Queue) -> None:
        """Without a writer thread: what is queued is written by the caller, lock released."""
        self._lock.release()
        try:
            self._drain(queue, linger=0.0)
        finally:
            self._lock.acquire()

    def _drain(self, queue: _Queue, linger: float = LINGER) -> None:
        while True:
            with self._lock:
                idle_until = time.monotonic() + linger
                while not queue.items and not self._parking:
                    left = idle_until - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                if not queue.items:
                    queue.writer = None
                    self._changed.notify_all()
                    return
                item = queue.items[0]
                stretch = None
                if isinstance(item, _Spill) and item.read < item.end:
                    fd, end = item.segments[0]
                    stretch = (fd, min(end - item.read, CHUNK))
            # Outside the lock: the writes that may wait on the reader.
            if isinstance(item, _Spill):
                if stretch is not None:
                    self._copy_spill(queue, item, *stretch)
                    continue
            elif item.file is not None:
                self._copy(item.fd, item.file)
            else:
                self._write(item.fd, item.data)
            with self._lock:
                if isinstance(item, _Spill) and item.read < item.end:
                    continue  # appended to meanwhile
                queue.items.popleft()
                queue.in_memory -= len(item.data)
                queue.done = item.seq
                self._changed.notify_all()
            if isinstance(item, _Spill):
                item.close()

    def _write(self, fd: int, data: bytes) -> None:
        lost, why = write_all(fd, data)
        if lost:
            self._count(lost, why)

    def _count(self, lost: int, why: str) -> None:
        with self._lock if not self.direct else contextlib.nullcontext():
            self.lost += lost
            self.lost_reason = why

    def _copy_spill(self, queue: _Queue, spill: _Spill, fd: int, size: int) -> None:
        """The next `size` bytes of `spill` (all for `fd`) to `fd`."""
        try:
            data = os.pread(spill.spill_fd, size, spill.read)
        except OSError as exc:
            data = b""
            self._count(size, exc.strerror or str(exc))
        self._write(fd, data)
        with self._lock:
            taken = len(data) or size
            spill.read += taken
            queue.on_disk -= taken
            if spill.read >= spill.segments[0][1] and len(spill.segments) > 1:
                spill.segments.popleft()

    def _copy(self, fd: int, file: BinaryIO) -> None:
        try:
            file.seek(0)
            while chunk := file.read(CHUNK):
                self._write(fd, chunk)
        except (OSError, ValueError):
            pass  # the spool cannot be read back: what it held was never written
        finally:
            with contextlib.suppress(OSError):
                file.close()

    def flush(self, deadline: float | None = None) -> bool:
        """Wait until what is queued now is written (or given up), at most until `deadline`
        (time.monotonic()); False when the deadline came first."""
        with self._lock:
            target = [(q, q.items[-1].seq) for q in self._queues.values() if q.items]
            while any(q.done < seq for q, seq in target):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(min(left, 1.0) if left is not None else 1.0)
        return True

    def quiesce(self, timeout: float = QUIESCE) -> None:
        """Before a fork: idle writers end now, and a busy one gets up to `timeout` seconds,
        so that the child usually inherits one thread. A writer still waiting on its reader
        after that is left alone: it holds no lock the child takes (its queue is new)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._parking = True
            self._changed.notify_all()
            writers = [q.writer for q in self._queues.values() if q.writer is not None]
        try:
            for writer in writers:
                writer.join(max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._parking = False


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


OUTBOX = Outbox()


def _in_child() -> None:
    # A writer thread does not exist in the child, and may have held the lock at the fork.
    OUTBOX._reset()
    OUTBOX.direct = True


os.register_at_fork(after_in_child=_in_child)
# An exit that is not run_job's own (a usage error's SystemExit, an in-process caller's
# interpreter ending): what is queued is written first, for a bounded time.
atexit.register(lambda: OUTBOX.flush(time.monotonic() + EXIT_FLUSH))
