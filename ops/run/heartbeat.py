"""The claim's heartbeat: refreshed by a thread of run_job from the take to the record.

A claim is alive while its heartbeat is fresh; another server takes a claim over once it is
3 intervals old (ops/run/claims.py). So the heartbeat belongs to holding the claim, not to a
phase of the run: it beats through the wait for the upstream (--after), the job, the end of
the job's leftovers, the end of its output, the waits between retries and the writing of the
record, whatever each of them costs. It stops once the outcome is on the claim (or the run
gives the claim up). It pauses only across the fork of the job, so that the child inherits no
thread's half-done work: the fork's own milliseconds, after a beat in progress has ended (at
most JOIN_SECONDS); its next beat comes one interval after its last one.

A beat that finds the claim no longer ours (another run took it over while this one was frozen
or cut off from the database) says so once and calls `on_lost` with the note. The thread runs
in run_job's own process, on a connection of its own: the job cannot stop it.
"""

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

from django.db import DatabaseError, connection
from django.utils import timezone

from ..models import JobRun, Outcome
from . import claims
from .plan import one_line, say
from .supervisor import EXIT_SKIPPED

JOIN_SECONDS = 5.0  # at most this long for a beat in progress to end, when the beating stops


class ClaimKeeper:
    """Keeps `run`'s claim alive from `start()` to `stop()` (a context manager). Without a slot
    there is no claim, and nothing to keep."""

    def __init__(self, run: JobRun, interval: float, on_lost: Callable[[str], None]):
        self.run = run  # the claim's tenure: its job, slot and version (not the attempt)
        self.interval = interval
        self.on_lost = on_lost
        self.lost: str | None = None  # why the claim is no longer ours, once a beat found it
        self._recording = False  # the outcome is being written: the record says what it finds
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last = time.monotonic()  # the claim's heartbeat was written as it was taken
        self._stopped = not run.slot

    def __enter__(self) -> "ClaimKeeper":
        self._resume()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def recording(self) -> None:
        """The outcome is being written onto the claim: beats go on, but a claim found taken
        over is for the record to report (it sees it too), not for a beat to stop the run."""
        self._recording = True

    def stop(self) -> None:
        """The outcome is on the claim (or the run gave it up): no more beats."""
        self._stopped = True
        self._halt()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No beat (and no thread of the keeper's) across the fork of the job."""
        self._halt()
        try:
            yield
        finally:
            self._resume()

    def _resume(self) -> None:
        if self._stopped or self.lost is not None or self._thread is not None:
            return
        self._stop = threading.Event()
        thread = threading.Thread(
            target=self._beat, args=(self._stop,), daemon=True, name="cronops-heartbeat"
        )
        try:
            thread.start()
        except RuntimeError as exc:  # a process limit: the run goes on and is recorded
            say(
                f"job {self.run.job}: the claim's heartbeat cannot run ({exc}): after 3 "
                "intervals another server may take the slot over",
                sys.stderr,
            )
            return
        self._thread = thread

    def _halt(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            # A beat stuck in the database (a partition) is left to end on its own: it writes
            # nothing more once it sees its event set (a resumed keeper's new thread may beat
            # meanwhile: the same UPDATE, twice).
            thread.join(JOIN_SECONDS)

    def _beat(self, stop: threading.Event) -> None:
        failing = False
        try:
            while not stop.wait(max(0.0, self._last + self.interval - time.monotonic())):
                self._last = time.monotonic()
                note = None
                try:
                    owned = claims.heartbeat(self.run, timezone.now)
                    if not owned and not stop.is_set() and not self._recording:
                        note = taken_over_note(self.run)
                except DatabaseError as exc:
                    if not failing:  # once per outage, not once per beat
                        say(f"job {self.run.job}: heartbeat failed: {one_line(exc)}", sys.stderr)
                    failing = True
                    connection.close()  # the next beat connects afresh (Django would not)
                    continue
                failing = False
                if note is not None:
                    self.lost = note
                    say(f"job {self.run.job}: {note}; stopping this run", sys.stderr)
                    self.on_lost(note)
                    return
        finally:
            connection.close()


def taken_over_note(run: JobRun) -> str:
    """Who holds the slot now, for a run that lost its claim (one read of the claim)."""
    now = claims.peek(run.job, run.slot)
    if now is None:
        who = "another run"
    else:
        who = f"run #{now.run_id} on {now.host} (claim version {now.version})"
    return (
        f"the claim on {run.slot} was taken over by {who} while this run was frozen or cut "
        "off from the database (no heartbeat for 3 intervals)"
    )


def taken_over(run: JobRun, *, said: bool, stderr) -> None:
    """The command ended after its claim was taken over (the heartbeat did not see it in time,
    or it did: `said`): `run` is recorded as taken over, never as the slot's outcome."""
    note = taken_over_note(run)
    if not said:
        say(f"job {run.job}: {note}", stderr)
    ended = f"{run.outcome}, exit {run.exit_code}" if run.exit_code else run.outcome
    run.note = f"{note}; the job had ended by then ({ended})"[:300]
    run.outcome, run.exit_code = Outcome.TAKEN_OVER, EXIT_SKIPPED
