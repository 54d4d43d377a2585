"""The run's helper threads never take the signals meant for the job.

A signal sent to the process (`kill PID`: cron's, systemd's or an operator's SIGTERM) goes to
any thread that does not block it. Python runs its handler in the main thread, but only once
that thread runs bytecode again: a SIGTERM that landed on an output reader left the job asleep
in `time.sleep(30)` for the whole 30 s (CI saw it once). So every thread the runner starts
blocks them, and the kernel hands them to the main thread, which it wakes.
"""

import signal
import threading

# --timeout and a takeover interrupt the command with a signal of our own, sent by a timer
# thread: SIGALRM belongs to the job (libraries use signal.alarm for per-call timeouts, and one
# that replaced or ignored our handler turned --timeout off).
SIG_INTERRUPT = signal.SIGRTMIN + 4
RUN_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, SIG_INTERRUPT})


def start(thread: threading.Thread) -> None:
    """Start `thread` with the run's signals blocked in it: a new thread inherits the mask of
    the thread that creates it, so they are blocked here for the instant of the start (one that
    arrives meanwhile stays pending for the process, and the main thread takes it after)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, RUN_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
