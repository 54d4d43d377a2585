"""The signals of one run_job call: noted, passed on to the job, and waking the main thread.

SIGTERM, SIGINT and SIGHUP end the run: the first one decides the outcome (128+N), and while a
job runs it is passed on at once to the job's process group and to the job's own process (which
may have left its group). SIGTSTP (Ctrl-Z) stops the job first, then run_job; SIGCONT continues
the job too: a run_job stopped alone would leave its job running unwatched while its heartbeat
goes stale and another server takes the slot over. The C-level handler also writes to a
wake-up pipe, so the main thread wakes from whatever it waits on, whichever thread the kernel
gave the signal to; run_job's own threads wake it through the same pipe (`wake`). Called from
another thread than the main one (call_command in a worker thread), no handler can be
installed: run_job then passes no signals, and the rest works the same.
"""

import contextlib
import os
import select
import signal
import threading
import time

# The C module's own functions (installed twice a run, and put back): the signal module's wrap
# each number and handler in an enum.
_RAW = getattr(signal, "_signal", signal)


class Interrupted(Exception):
    """A signal ended a wait of run_job's own (a standby's), before any job ran."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


def send(pid: int, sig: int) -> None:
    """`sig` to the job's process group and to the job's process itself (it may have moved to
    another group); a process already gone is no error."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, sig)


class Signals:
    ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    HANDLED = (*ENDING, signal.SIGTSTP, signal.SIGCONT)

    def __init__(self) -> None:
        self.received: int | None = None
        self.job: int | None = None  # the running job's pid (and process group)
        self._previous: dict[int, object] = {}
        self._previous_wakeup = -1
        self._installed = False
        self._wake_read = self._wake_write = -1

    @property
    def fds(self) -> tuple[int, ...]:
        """Descriptors of ours that the job must not inherit."""
        return tuple(fd for fd in (self._wake_read, self._wake_write) if fd >= 0)

    def install(self) -> None:
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_wakeup = signal.set_wakeup_fd(self._wake_write, warn_on_full_buffer=False)
        for sig in self.ENDING:
            self._previous[sig] = _RAW.signal(sig, self._on_signal)
        self._previous[signal.SIGTSTP] = _RAW.signal(signal.SIGTSTP, self._on_stop)
        self._previous[signal.SIGCONT] = _RAW.signal(signal.SIGCONT, self._on_continue)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            for sig, handler in self._previous.items():
                _RAW.signal(sig, handler)
            with contextlib.suppress(ValueError, OSError):  # a previous fd its owner closed
                signal.set_wakeup_fd(self._previous_wakeup)
            self._installed = False
        for fd in self.fds:
            os.close(fd)
        self._wake_read = self._wake_write = -1

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signum
        if self.job is not None:
            send(self.job, signum)

    def _on_stop(self, signum: int, frame: object) -> None:
        if self.job is not None:
            send(self.job, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)  # as SIGTSTP's default would; SIGCONT wakes both

    def _on_continue(self, signum: int, frame: object) -> None:
        if self.job is not None:
            send(self.job, signal.SIGCONT)

    def wake(self) -> None:
        """From any thread: the main thread's wait returns."""
        with contextlib.suppress(OSError):  # full (it is awake anyway), or closed meanwhile
            os.write(self._wake_write, b"\0")

    def wait(self, fds: list[int], timeout: float | None) -> list[int]:
        """Wait until one of `fds` is readable, a signal came, `wake()` was called or `timeout`
        seconds passed; returns the readable ones among `fds`."""
        wake = [self._wake_read] if self._wake_read >= 0 else []
        ready, _, _ = select.select([*fds, *wake], [], [], timeout)
        if wake and self._wake_read in ready:
            with contextlib.suppress(OSError):
                while os.read(self._wake_read, 512):
                    pass
        return [fd for fd in ready if fd != self._wake_read]

    def sleep(self, seconds: float) -> None:
        """A standby's pause; a signal that ends the run (also one that came before) ends it at
        once with Interrupted."""
        deadline = time.monotonic() + seconds
        while self.received is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.wait([], left)
        raise Interrupted(self.received)
