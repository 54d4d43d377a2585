"""A signal already taken by CPython's C-level handler while the job sits in a blocking call
still ends the command (ops/run/threads.py, Nudger).

CPython runs a Python signal handler at the main thread's next bytecode. A signal that lands
just before a blocking call does not interrupt that call: a SIGTERM did nothing for the 30 s
a job slept (CI, once; about 1 run in 50 of tests/test_runner.py's SIGTERM test here). Here the
C-level handler is made to run on another thread (`signal.raise_signal` there), which leaves
the main thread exactly so: blocked in a read, the signal taken, its handler not run.
"""

import os
import signal
import threading

import pytest

from ops.run import runner
from ops.run.threads import SIG_NUDGE, quiet_nudges


@pytest.fixture
def guard():
    guard = runner.Guard()
    guard.install()
    yield guard
    guard.uninstall()


@pytest.fixture
def never_readable():
    """A pipe nothing writes to until the test is over (then one byte, so no read hangs)."""
    read, write = os.pipe()
    yield read
    os.write(write, b"!")
    os.close(write)
    os.close(read)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_taken_while_the_job_blocks_still_interrupts_it(guard, never_readable, sig):
    threading.Timer(0.2, signal.raise_signal, args=(sig,)).start()
    with pytest.raises(runner.JobInterrupted) as stopped, guard.command(timeout=None):
        os.read(never_readable, 1)  # before: blocked until the pipe got its byte
    assert (stopped.value.outcome, stopped.value.exit_code) == ("terminated", 128 + sig)


def test_a_timeout_signal_taken_while_the_job_blocks_still_times_it_out(guard, never_readable):
    # The --timeout timer's own signal can be taken the same way.
    threading.Timer(0.2, signal.raise_signal, args=(runner.SIG_INTERRUPT,)).start()
    with pytest.raises(runner.JobInterrupted) as stopped, guard.command(timeout=3600):
        os.read(never_readable, 1)
    assert (stopped.value.outcome, stopped.value.exit_code) == ("timed_out", 124)


def test_after_the_run_the_wakeup_fd_is_the_callers_again_and_the_watcher_ends():
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    guard = runner.Guard()
    earlier = set(threading.enumerate())
    guard.install()
    [watcher] = [t for t in set(threading.enumerate()) - earlier if t.name == "cronops-nudger"]
    guard.uninstall()
    assert signal.set_wakeup_fd(before) == before
    watcher.join(5)  # it reads end of file on its pipe at once
    assert not watcher.is_alive()


def _count_nudges():
    nudges = []
    signal.signal(SIG_NUDGE, lambda signum, frame: nudges.append(signum))
    return nudges


def _spin(seconds):
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:  # bytecode all along: a handler runs at once
        pass


def test_a_signal_whose_handler_ran_at_once_is_not_nudged(guard):
    nudges = _count_nudges()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # outside the command: noted as pending
        _spin(0.5)  # the first three nudges would have gone out by now
        assert guard.pending is not None
        assert nudges == []
    finally:
        quiet_nudges()
        guard.pending = None


# The fork is the point (multiprocessing's "fork" start method does the same); the child only
# raises a signal and exits.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_does_not_write_into_the_runs_pipe(guard):
    nudges = _count_nudges()
    try:
        pid = os.fork()
        if pid == 0:
            try:
                signal.raise_signal(signal.SIGTERM)  # our handler, in the child: noted only
            finally:
                os._exit(0 if signal.set_wakeup_fd(-1) == -1 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        _spin(0.5)
        assert nudges == []
    finally:
        quiet_nudges()
