"""The claim's heartbeat, refreshed by a thread of run_job while its job runs in a child."""

import sys
import threading

from django.db import DatabaseError, connection
from django.utils import timezone

from ..models import JobRun
from . import claims
from .plan import one_line, say


class Heartbeat:
    """Refreshes the claim's heartbeat from a thread, so another host can tell we are alive.

    A heartbeat that finds the claim no longer ours (another run took it over while this one
    was frozen or cut off from the database) says so once and calls `on_lost` with the note.
    It runs in run_job's own process, on a connection of its own: the job cannot stop it."""

    def __init__(self, run: JobRun, interval: float, on_lost=None):
        self.run, self.interval, self.on_lost = run, interval, on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="cronops-heartbeat")

    def _beat(self):
        failing = False
        try:
            while not self._stop.wait(self.interval):
                try:
                    owned = claims.heartbeat(self.run, timezone.now())
                    if not owned:
                        note = taken_over_note(self.run)
                        say(f"job {self.run.job}: {note}; stopping this run", sys.stderr)
                        if self.on_lost is not None:
                            self.on_lost(note)
                        return
                    failing = False
                except DatabaseError as exc:
                    if not failing:  # once per outage, not once per beat
                        say(f"job {self.run.job}: heartbeat failed: {one_line(exc)}", sys.stderr)
                    failing = True
                    connection.close()  # the next beat connects afresh (Django would not)
        finally:
            connection.close()

    def __enter__(self):
        if self.run.slot:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return False


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
