"""The job in a child process, and run_job as its supervisor.

run_job never runs job code. After the claim it closes its database connections and forks the
process it has already set up (one Django start-up per fire, as before); the child runs the
command (ops/run/child.py) and the parent supervises it:

- SIGTERM, SIGINT and SIGHUP sent to run_job are passed to the job (ops/run/signals.py);
- `--timeout` sends SIGTERM (and SIGCONT, for a stopped job) to the job's process group, its
  own process and the processes below it, then SIGKILL after `--kill-after`; a claim taken
  over (the heartbeat thread says so) stops the job the same way, and a passed signal the job
  ignores gets the same SIGKILL;
- the job's output is teed by threads of the parent (ops/run/output.py), its heartbeat
  (ops/run/heartbeat.py, from the claim to the record) and pings are threads of the parent too.

Nothing the job does (hold the GIL in a long C call, close its descriptors, write os.environ,
start threads, leave a transaction broken, ignore SIGTERM) reaches the parent's threads, its
timeout or its record: they live in another process.
"""

import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Callable

from django.db import connections

from ..models import Outcome
from ..schedule.options import DEFAULT_KILL_AFTER
from ..values import Value
from . import child as job_child
from . import descendants
from .signals import Signals, send

EXIT_SKIPPED = 75
EXIT_TIMEOUT = 124
_POLL = 0.05  # without a pidfd (kernels before 5.3) the parent polls the child this often


class Ended(Value):
    """How the job's child process ended, in run_job's terms (DESIGN.md's exit-code table)."""

    outcome: str
    exit_code: int
    note: str
    command: str = ""  # the command line it ran, as the child said (its slot's date added)


class Child(Value):
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
    *,
    not_inherited: tuple[int, ...] = (),
) -> Child | None:
    """Fork the command's child process (ops/run/child.py) and return its handle; None when a
    signal that ends the run came first (the job never starts).

    Called with the heartbeat paused (ClaimKeeper.paused) and run_job's idle output writers
    ended (Outbox.quiesce): usually no other thread of run_job is alive, and what the child
    inherits is this thread's state. Those that may be (a writer waiting on a reader that
    stopped reading, an earlier attempt's start ping still unanswered or output reader held by
    a leftover) hold no lock the child takes: its output queue is new (ops/run/outbox.py), and
    it never pings or reads run_job's pipes.
    `not_inherited`: run_job's own descriptors (its lock, its wake-up pipe), closed in the
    child, so that the job can neither unlock the job's lock nor wake run_job."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, Signals.ENDING)
    if signals.received is not None:  # came before the block: the job does not start
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return None
    out_read, out_write = os.pipe2(os.O_CLOEXEC)
    err_read, err_write = os.pipe2(os.O_CLOEXEC)
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(report_read, False)
    for stream in (sys.stdout, sys.stderr):  # what is buffered is written once, by us
        with contextlib.suppress(Exception):
            stream.flush()
    # The child must never use (nor close) the connection of the parent: a PostgreSQL
    # connection closed there would end the parent's session. Both reconnect lazily.
    connections.close_all()
    gc.freeze()  # the child's collections leave the parent's objects (and pages) alone
    parent = os.getpid()
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
            close=(out_read, err_read, report_read, *not_inherited),
            unblock=blocked,
            parent=parent,
        )
    gc.unfreeze()
    for fd in (out_write, err_write, report_write):
        os.close(fd)
    with contextlib.suppress(OSError):  # the child does the same; whichever comes first
        os.setpgid(pid, pid)
    # A signal that came since the fork was held back: now it reaches the job too.
    signals.job = pid
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
        exclude: frozenset[int] = frozenset(),
        lost: Callable[[], str | None] = lambda: None,
    ):
        self.child = child
        self.lost = lost  # why the claim is no longer ours (the heartbeat found it), or None
        self.exclude = exclude  # an in-process caller's own children: never signalled
        self.signals = signals
        self.timeout = timeout
        self.kill_after = kill_after
        self.timed_out = False
        self.status: int | None = None
        self.received: int | None = None  # the signal that ended the run, as the job ended
        self.report = bytearray()

    def wait(self) -> int:
        """Wait for the child to end; its wait status (os.waitpid's)."""
        started = time.monotonic()
        deadline = started + self.timeout if self.timeout else None
        stopping: float | None = None  # since when the job is being stopped (SIGTERM sent)
        killed = False
        pidfd = [self.child.pidfd] if self.child.pidfd is not None else []
        fds = [self.child.report, *pidfd]
        while True:
            if self.child.report in fds and self.child.report in self.signals.wait(fds, 0):
                if self._read_report():
                    # The child closed it (as it exits): an end of file is always ready, and
                    # waiting on it would spin until the child can be reaped.
                    fds = pidfd
            pid, status = os.waitpid(self.child.pid, os.WNOHANG)
            if pid:
                self.status, self.received = status, self.signals.received
                self._read_report()
                return status
            now = time.monotonic()
            if stopping is None:
                if deadline is not None and now >= deadline:
                    self.timed_out = True
                if self.timed_out or self.lost() is not None:
                    self.stop(signal.SIGTERM)
                    stopping = now
                elif self.signals.received is not None:
                    self.stop(self.signals.received)  # once more: it may have come pre-fork
                    stopping = now
            elif not killed and now >= stopping + self.kill_after:
                self.stop(signal.SIGKILL)
                killed = True
            waits = []
            if stopping is None and deadline is not None:
                waits.append(deadline - now)
            if stopping is not None and not killed:
                waits.append(stopping + self.kill_after - now)
            if self.child.pidfd is None:
                waits.append(_POLL)
            self.signals.wait(fds, max(0.0, min(waits)) if waits else None)

    def stop(self, sig: int) -> None:
        """`sig` to the job's group, its process and every process below run_job (one that
        left the group too), then SIGCONT so that a stopped job receives it."""
        send(self.child.pid, sig)
        descendants.signal_descendants(sig, self.exclude)
        if sig != signal.SIGKILL:
            send(self.child.pid, signal.SIGCONT)

    def _read_report(self) -> bool:
        """Read what the child reported; True at the end of the pipe."""
        with contextlib.suppress(OSError):  # BlockingIOError: nothing more for now
            while len(self.report) < job_child.REPORT_MAX:
                chunk = os.read(self.child.report, job_child.REPORT_MAX)
                if not chunk:
                    return True
                self.report += chunk
            # a job that fakes reports on our pipe: the rest is drained, not kept
            while os.read(self.child.report, 65536):
                pass
            return True
        return False

    def ended(self) -> Ended:
        """The outcome: a lost claim, then a timeout, then a signal to run_job that came while
        the job ran, then the job's own end (its exit status, or the signal that killed it)."""
        report = job_child.parse_report(bytes(self.report))
        command = str(report.get("command") or "")
        if (lost := self.lost()) is not None:
            return Ended(Outcome.TAKEN_OVER, EXIT_SKIPPED, lost, command)
        if self.timed_out:
            note = f"timed out after {self.timeout:g}s"
            return Ended(Outcome.TIMED_OUT, EXIT_TIMEOUT, note, command)
        assert self.status is not None
        code = os.waitstatus_to_exitcode(self.status)
        if self.received is not None:
            name = signal.Signals(self.received).name
            if code == 0:
                # Told to stop, the job finished its work and said so: its slot is done (a
                # standby must not run it again).
                note = f"{name} passed to the job, which then finished (exit 0)"
                return Ended(Outcome.SUCCEEDED, 0, note, command)
            return Ended(Outcome.TERMINATED, 128 + self.received, f"terminated by {name}", command)
        if code < 0:
            # A crash (SIGSEGV) or the OOM killer: the job's own failure, not run_job's stop,
            # so a standby does not run it again (it would crash there too).
            name = signal.Signals(-code).name
            return Ended(Outcome.FAILED, 128 - code, f"the job was killed by {name}", command)
        line = str(report.get("line") or "")
        return Ended(Outcome.SUCCEEDED if code == 0 else Outcome.FAILED, code, line, command)

    def close(self) -> None:
        for fd in (self.child.pidfd, self.child.report):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
