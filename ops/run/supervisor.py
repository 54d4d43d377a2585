"""The job in a child process, and run_job as its supervisor.

run_job never runs job code. After the claim it closes its database connections and forks the
process it has already set up (one Django start-up per fire, as before); the child runs the
command (ops/run/child.py) and the parent supervises it:

- SIGTERM and SIGINT sent to run_job are passed to the job's process group;
- `--timeout` sends SIGTERM to the group, then SIGKILL after `--kill-after`; a claim taken
  over (the heartbeat thread says so) stops the job the same way, as does a passed signal the
  job ignores;
- the job's output is teed by threads of the parent (ops/run/output.py), its heartbeat and
  pings are threads of the parent too.

Nothing the job does (hold the GIL in a long C call, close its descriptors, write os.environ,
start threads, leave a transaction broken, ignore SIGTERM) reaches the parent's threads, its
timeout or its record: they live in another process.
"""

import contextlib
import gc
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connections

from ..models import Outcome
from ..schedule.options import DEFAULT_KILL_AFTER
from . import child as job_child

EXIT_SKIPPED = 75
EXIT_TIMEOUT = 124
_POLL = 0.05  # without a pidfd (kernels before 5.3) the parent polls the child this often


class Interrupted(Exception):
    """SIGTERM or SIGINT ended a wait of run_job's own (a standby's), before any job ran."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


class Signals:
    """SIGTERM and SIGINT for one run_job call.

    A signal is noted (the first one decides the outcome) and, while a job runs, passed on to
    its process group at once. The C-level handler also writes to a wake-up pipe, so the main
    thread wakes from whatever it waits on, whichever thread the kernel gave the signal to.
    Threads of run_job wake it through the same pipe (`wake`). Called from another thread than
    the main one (call_command in a worker thread), no handler can be installed: run_job then
    passes no signals, and the rest works the same."""

    HANDLED = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self.group: int | None = None  # the running job's process group
        self._previous: dict[int, object] = {}
        self._previous_wakeup = -1
        self._installed = False
        self._wake_read = self._wake_write = -1

    def install(self) -> None:
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_wakeup = signal.set_wakeup_fd(self._wake_write, warn_on_full_buffer=False)
        for sig in self.HANDLED:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
            with contextlib.suppress(ValueError, OSError):  # a previous fd its owner closed
                signal.set_wakeup_fd(self._previous_wakeup)
            self._installed = False
        for fd in (self._wake_read, self._wake_write):
            if fd >= 0:
                os.close(fd)
        self._wake_read = self._wake_write = -1

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signum
        self.forward(signum)

    def forward(self, signum: int) -> None:
        if self.group is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.group, signum)

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
        """A standby's pause; SIGTERM or SIGINT (also one that came before) ends it at once
        with Interrupted."""
        deadline = time.monotonic() + seconds
        while self.received is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.wait([], left)
        raise Interrupted(self.received)


@dataclass
class Ended:
    """How the job's child process ended, in run_job's terms (DESIGN.md's exit-code table)."""

    outcome: str
    exit_code: int
    note: str
    args: list[str] = field(default_factory=list)  # the arguments the command ran with


@dataclass
class Child:
    pid: int
    stdout: int  # read ends of the job's stdout and stderr
    stderr: int
    report: int  # what the child says about itself (ops/run/child.py)
    pidfd: int | None


def fork_job(
    command: str,
    args: Callable[[], list[str]],
    environ: dict[str, str | None],
    claim: object,
    signals: Signals,
) -> Child:
    """Fork the command's child process (ops/run/child.py) and return its handle.

    Called with no thread of run_job alive: what the child inherits is this thread's state
    only, and no other thread can be inside a lock the child would then wait on forever."""
    out_read, out_write = os.pipe2(os.O_CLOEXEC)
    err_read, err_write = os.pipe2(os.O_CLOEXEC)
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    for stream in (sys.stdout, sys.stderr):  # what is buffered is written once, by us
        with contextlib.suppress(Exception):
            stream.flush()
    # The child must never use (nor close) the connection of the parent: a PostgreSQL
    # connection closed there would end the parent's session. Both reconnect lazily.
    connections.close_all()
    gc.freeze()  # the child's collections leave the parent's objects (and pages) alone
    parent = os.getpid()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, Signals.HANDLED)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        gc.unfreeze()
        for fd in (out_read, out_write, err_read, err_write, report_read, report_write):
            os.close(fd)
        raise
    if pid == 0:
        job_child.main(  # never returns
            command,
            args,
            environ,
            claim,
            stdout=out_write,
            stderr=err_write,
            report=report_write,
            close=(out_read, err_read, report_read),
            unblock=blocked,
            parent=parent,
        )
    gc.unfreeze()
    for fd in (out_write, err_write, report_write):
        os.close(fd)
    with contextlib.suppress(OSError):  # the child does the same; whichever comes first
        os.setpgid(pid, pid)
    # A signal that came since the fork was held back: now it reaches the job's group too.
    signals.group = pid
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    return Child(pid, out_read, err_read, report_read, pidfd)


class Supervisor:
    """Waits for the job's child: passes signals, enforces the timeout and a lost claim."""

    def __init__(
        self,
        child: Child,
        signals: Signals,
        *,
        timeout: float | None,
        kill_after: float = DEFAULT_KILL_AFTER,
    ):
        self.child = child
        self.signals = signals
        self.timeout = timeout
        self.kill_after = kill_after
        self.lost_note: str | None = None  # set by the heartbeat thread
        self.timed_out = False
        self.status: int | None = None

    def lose(self, note: str) -> None:
        """From the heartbeat thread: the claim was taken over; stop the job as a timeout does."""
        self.lost_note = note
        self.signals.wake()

    def wait(self) -> int:
        """Wait for the child to end; its wait status (os.waitpid's)."""
        started = time.monotonic()
        deadline = started + self.timeout if self.timeout else None
        stopping: float | None = None  # since when the job is being stopped (SIGTERM sent)
        killed = False
        fds = [self.child.pidfd] if self.child.pidfd is not None else []
        while True:
            pid, status = os.waitpid(self.child.pid, os.WNOHANG)
            if pid:
                self.status = status
                return status
            now = time.monotonic()
            if stopping is None:
                if deadline is not None and now >= deadline:
                    self.timed_out = True
                if self.timed_out or self.lost_note is not None:
                    self._signal_group(signal.SIGTERM)
                    stopping = now
                elif self.signals.received is not None:
                    stopping = now  # the handler passed the signal on already
            elif not killed and now >= stopping + self.kill_after:
                self._signal_group(signal.SIGKILL)
                killed = True
            waits = []
            if stopping is None and deadline is not None:
                waits.append(deadline - now)
            if stopping is not None and not killed:
                waits.append(stopping + self.kill_after - now)
            if self.child.pidfd is None:
                waits.append(_POLL)
            self.signals.wait(fds, max(0.0, min(waits)) if waits else None)

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, sig)

    def ended(self, report: dict) -> Ended:
        """The outcome: a lost claim, then a timeout, then a signal to run_job, then the
        child's own end (its exit status, or the signal that killed it)."""
        args = list(report.get("args") or [])
        if self.lost_note is not None:
            return Ended(Outcome.TAKEN_OVER, EXIT_SKIPPED, self.lost_note, args)
        if self.timed_out:
            note = f"timed out after {self.timeout:g}s"
            return Ended(Outcome.TIMED_OUT, EXIT_TIMEOUT, note, args)
        received = self.signals.received
        if received is not None:
            name = signal.Signals(received).name
            return Ended(Outcome.TERMINATED, 128 + received, f"terminated by {name}", args)
        assert self.status is not None
        code = os.waitstatus_to_exitcode(self.status)
        if code < 0:
            name = signal.Signals(-code).name
            return Ended(Outcome.TERMINATED, 128 - code, f"the job was killed by {name}", args)
        line = str(report.get("line") or "")
        if "code" not in report and code == 0:
            # It exited 0 before it could say how the command ended (os._exit in the job).
            return Ended(Outcome.SUCCEEDED, 0, "", args)
        return Ended(Outcome.SUCCEEDED if code == 0 else Outcome.FAILED, code, line, args)

    def close(self) -> None:
        for fd in (self.child.pidfd, self.child.report):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
