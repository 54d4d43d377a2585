"""--after: a slot runs only once its upstream jobs have succeeded for the same logical date.

Checked after the slot is claimed, so that only one run (of all servers) waits, and its claim
heartbeats meanwhile. For each upstream job, its claims of the slot's logical date say:

- succeeded (under any key): done;
- failed, timed out, terminated, abandoned or itself blocked, none running or done: the slot
  is blocked: not run, recorded `blocked` (exit 69, a /fail ping naming the upstream); a later
  success of the upstream (a re-run by hand) lets the next fire (with --catch-up) run it;
- running, waiting, or no claim yet: the run waits, polling every POLL seconds, up to
  --after-wait (default 30m) and never past the job's next fire time; still not done, it is
  recorded `waiting` (exit 75, a /log ping), and the next fire with --catch-up runs the slot
  once the upstream succeeded. A catch-up slot does not wait: it is recorded `waiting` at once
  (else a run catching up three days would wait four times --after-wait).

A signal during the wait ends it at once (128+N, the job never started), like a standby's.
"""

import datetime as dt
import time
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from django.conf import settings

from ..models import JobRun, Outcome, SlotClaim
from ..schedule.durations import human_duration
from ..schedule.options import DEFAULT_AFTER_WAIT
from ..schedule.slots import Slot
from .plan import say
from .supervisor import EXIT_SKIPPED, Ended

if TYPE_CHECKING:
    from .runner import Runner

EXIT_BLOCKED = 69  # sysexits' EX_UNAVAILABLE: what the job needs (its upstream) failed
POLL = 1.0  # seconds between two looks at the upstream's claims
DONE, FAILED, PENDING = "done", "failed", "pending"
_FAILED_STATES = {
    Outcome.FAILED,
    Outcome.TIMED_OUT,
    Outcome.TERMINATED,
    Outcome.ABANDONED,
    Outcome.BLOCKED,
}


def upstream_state(job: str, day: dt.date) -> str:
    """DONE, FAILED or PENDING: where `job` stands for logical date `day` (one indexed read)."""
    states = set(
        SlotClaim.objects.filter(job=job, logical_date=day).values_list("state", flat=True)
    )
    if Outcome.SUCCEEDED in states:
        return DONE
    if Outcome.RUNNING in states or Outcome.WAITING in states or not states & _FAILED_STATES:
        return PENDING
    return FAILED


def kept_state(run: JobRun) -> str | None:
    """The state a run that never ran its job (waiting, blocked) leaves on its claim when it
    took the claim from a success (--force): the success stands, so the next fire does not
    run the slot again."""
    if run.outcome in (Outcome.WAITING, Outcome.BLOCKED):
        if getattr(run, "claim_was", None) == Outcome.SUCCEEDED:
            return Outcome.SUCCEEDED
    return None


def gate(
    runner: "Runner", run: JobRun, slot: Slot, *, now: dt.datetime, catch_up: bool = False
) -> Ended | None:
    """None once every upstream succeeded for the slot's date; else how the run ends. A
    catch-up slot (an earlier one) does not wait: its upstream had its day already."""
    upstreams = runner.opts.after or ()
    day = slot.logical_date
    bound = runner.opts.after_wait if runner.opts.after_wait is not None else DEFAULT_AFTER_WAIT
    if catch_up:
        bound = 0.0
    expr = runner.plan.job.cron_expr if runner.plan.job else None
    if expr is not None:
        from ..schedule.slots import next_fire

        until_next = (next_fire(expr, now, ZoneInfo(settings.TIME_ZONE)) - now).total_seconds()
        bound = max(0.0, min(bound, until_next))
    deadline = time.monotonic() + bound
    ended = _wait(runner, upstreams, day, bound, deadline)  # the claim heartbeats meanwhile
    if ended is not None and getattr(run, "claim_was", None) == Outcome.SUCCEEDED:
        if ended.outcome in (Outcome.WAITING, Outcome.BLOCKED):  # kept_state keeps it done
            ended.note += "; the slot's earlier success stands (this --force run did not run it)"
    return ended


def _wait(
    runner: "Runner",
    upstreams: tuple[str, ...],
    day: dt.date,
    bound: float,
    deadline: float,
) -> Ended | None:
    said = False
    while True:
        states = {name: upstream_state(name, day) for name in upstreams}
        failed = [name for name, state in states.items() if state == FAILED]
        if failed:
            names = ", ".join(failed)
            return Ended(
                Outcome.BLOCKED,
                EXIT_BLOCKED,
                f"blocked: {names} did not succeed for {day}; not run (once {names} "
                "succeeded, the next fire with --catch-up or a run by hand runs it)",
            )
        pending = [name for name, state in states.items() if state == PENDING]
        if not pending:
            return None
        names = ", ".join(pending)
        left = deadline - time.monotonic()
        if left <= 0:
            return Ended(
                Outcome.WAITING,
                EXIT_SKIPPED,
                f"waiting: {names} has not succeeded for {day} ("
                + (f"waited {human_duration(bound)}" if bound else "a catch-up slot")
                + "); the next fire with --catch-up runs it",
            )
        if not said and not runner.opts.quiet:
            say(
                f"job {runner.plan.name}: waiting up to {human_duration(left)} for {names} "
                f"to succeed for {day}",
                runner.stdout,
            )
            said = True
        runner.signals.wait([], min(POLL, left))
        if (lost := runner.lost_claim) is not None:
            return Ended(Outcome.TAKEN_OVER, EXIT_SKIPPED, lost)
        ended = runner.terminated()
        if ended is not None:
            return Ended(ended.outcome, ended.exit_code, f"{ended.note} while waiting for {names}")
