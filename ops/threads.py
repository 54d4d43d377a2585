"""The run's helper threads never take the signals meant for the job.

A signal sent to the process (`kill PID`: cron's, systemd's or an operator's SIGTERM) goes to
any thread that does not block it. Python runs its handler in the main thread, but only once
that thread runs bytecode again: a SIGTERM that landed on an output reader left the job asleep
in `time.sleep(30)` for the whole 30 s (CI saw it once). So every thread the runner starts
blocks them, and the kernel hands them to the main thread, which it wakes.
"""

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
        read, self._write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.set_blocking(read, True)
        # Left in place after the run: a nudge already sent must never meet SIG_DFL (which
        # ends the process for a real-time signal).
        signal.signal(SIG_NUDGE, lambda signum, frame: None)
        self._closed = False
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        start(threading.Thread(target=self._watch, args=(read,), daemon=True,
                               name="cronops-nudger"))  # fmt: skip

    def uninstall(self) -> None:
        if self._write < 0:
            return
        with self._lock:
            self._closed = True  # no nudge from here on
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write)  # the watcher reads end of file, closes its end and ends
        self._write = -1

    def _watch(self, read_fd: int) -> None:
        main = threading.main_thread().ident
        try:
            while data := os.read(read_fd, 64):
                if not RUN_SIGNALS.intersection(data):
                    continue
                seen = time.monotonic()
                for pause in NUDGES:
                    time.sleep(pause)
                    if self.handled() >= seen or main is None:
                        break
                    with self._lock:
                        if self._closed:
                            break
                        signal.pthread_kill(main, SIG_NUDGE)
        except OSError:
            pass
        finally:
            os.close(read_fd)
