"""Signals meant for the job reach the main thread, and interrupt it.

A signal sent to the process (`kill PID`: cron's, systemd's or an operator's SIGTERM) goes to
any thread that does not block it, and Python runs its handler in the main thread only once
that thread runs bytecode again. So every thread the runner starts blocks the run's signals
(`start`: the kernel then picks the main thread, which it wakes), and `Nudger` interrupts the
main thread again when a signal was taken just before a blocking call.
"""

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

# --timeout and a takeover interrupt the command with a signal of our own, sent by a timer
# thread: SIGALRM belongs to the job (libraries use signal.alarm for per-call timeouts, and one
# that replaced or ignored our handler turned --timeout off).
SIG_INTERRUPT = signal.SIGRTMIN + 4
RUN_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, SIG_INTERRUPT})
# Wakes the main thread from a blocking call so that a signal already taken is handled
# (`Nudger`); its own handler does nothing.
SIG_NUDGE = signal.SIGRTMIN + 5
NUDGES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # seconds between nudges, then it gives up


def start(thread: threading.Thread) -> None:
    """Start `thread` with the run's signals blocked in it: a new thread inherits the mask of
    the thread that creates it, so they are blocked here for the instant of the start (one that
    arrives meanwhile stays pending for the process, and the main thread takes it after)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, RUN_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Nudger:
    """Interrupts the main thread again after a run signal whose handler has not run yet.

    CPython runs a handler at the main thread's next bytecode. A signal that lands just before
    a blocking call (`time.sleep`, a read) is taken by the C-level handler and does not
    interrupt that call, so its handler waits until the call returns: a SIGTERM did nothing for
    the 30 s a job slept (CI once; here about 1 run in 50 of that test), and --timeout's own
    signal can be lost the same way. The C-level handler also writes the signal's number to
    the wakeup fd: this thread reads it and sends SIG_NUDGE to the main thread until
    `handled()` says the handler has run since (a few times at most). A job that sets its own
    wakeup fd (asyncio's signal handlers) turns this off while it holds it.
    """

    def __init__(self, handled: Callable[[], float]):
        self.handled = handled  # monotonic time of the handler's latest run
        self._write = -1
        self._previous_fd = -1
        self._closed = False
        self._lock = threading.Lock()

    def install(self) -> None:
        since = time.monotonic()  # before any byte the pipe will carry was written
        read, self._write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.set_blocking(read, True)
        quiet_nudges()
        self._closed = False
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        _live.add(self)
        start(threading.Thread(target=self._watch, args=(read, since), daemon=True,
                               name="cronops-nudger"))  # fmt: skip

    def uninstall(self) -> None:
        if self._write < 0:
            return
        with self._lock:
            self._closed = True  # no nudge from here on
        _live.discard(self)
        with contextlib.suppress(ValueError, OSError):  # a previous fd the caller has closed
            signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write)  # the watcher reads end of file, closes its end and ends
        self._write = -1

    def _after_fork_in_child(self) -> None:
        # A forked child (multiprocessing's "fork", os.fork) must not write its own signals
        # into the parent's pipe: the parent would nudge itself for a SIGTERM sent to a worker.
        self._closed = True
        with contextlib.suppress(ValueError, OSError):
            if signal.set_wakeup_fd(-1) != self._write:
                signal.set_wakeup_fd(self._previous_fd)  # not ours: left as the job set it
        with contextlib.suppress(OSError):
            os.close(self._write)
        self._write = -1

    def _watch(self, read_fd: int, since: float) -> None:
        main = threading.main_thread().ident
        try:
            while data := os.read(read_fd, 4096):
                # Every byte of `data` was written after `since`, so a handler run later than
                # it ran for them. The time must not be taken now: this thread gets the GIL
                # back only after the main thread, which has usually run the handler already
                # (then all six nudges went out for nothing, each an EINTR in the job).
                seen, since = since, time.monotonic()
                if not RUN_SIGNALS.intersection(data):
                    continue
                for pause in NUDGES:
                    time.sleep(pause)
                    if self.handled() > seen or main is None:
                        break
                    with self._lock:
                        if self._closed:
                            break
                        signal.pthread_kill(main, SIG_NUDGE)
                # The run that ended these nudges is not one for the next signal.
                since = max(since, self.handled())
        except OSError:
            pass
        finally:
            os.close(read_fd)


def _ignore_nudge(signum: int, frame: object) -> None:
    """SIG_NUDGE's handler: only the interruption it causes matters."""


def quiet_nudges() -> None:
    """(Re)install SIG_NUDGE's no-op handler. Left in place after the run, and put back after
    the job: a nudge already sent must never meet SIG_DFL, which ends the process for a
    real-time signal, nor a handler of the job's."""
    signal.signal(SIG_NUDGE, _ignore_nudge)


_live: set[Nudger] = set()


def _after_fork_in_child() -> None:
    for nudger in list(_live):
        nudger._after_fork_in_child()
    _live.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
