"""The claim step of one slot: claim it, stand by behind a live holder (ops/run/standby.py), or
wait for a gone holder's fencing transaction to end; what each gives the run.

A takeover of a holder that stopped heartbeating inside `still_held(lock=True)` (frozen, or cut
off from the database) waits for that transaction outside its own claim transaction, so the
claims of the job's other slots go on meanwhile (ops/run/claims.py). The wait says what it
waits for, once; it is bounded (a standby's bound, else TAKEOVER_WAIT: then exit 75 naming the
holder); SIGTERM and SIGINT end it at once (runner.signals.sleep raises Interrupted), recorded
as a skip with 128+N and nothing claimed. A claim that meets another writer's lock (SQLite's
one writer, a PostgreSQL lock) is retried the same way (ops/run/patience.py); past its bound
the run is a failure: exit 1, /fail, recorded if anything can be written.
"""

import time
from typing import TYPE_CHECKING

from django.utils import timezone

from ..models import Outcome, SlotClaim
from ..schedule.durations import format_duration, human_duration
from ..schedule.slots import Slot
from . import claims, patience, standby
from .plan import say
from .signals import Interrupted

if TYPE_CHECKING:
    from .runner import Runner

EXIT_SKIPPED = 75
# Seconds a run that does not stand by waits for a gone holder's fencing transaction: the
# idle_in_transaction_session_timeout docs/several-servers.md suggests (its holder has been
# idle for 3 heartbeats already when the wait begins).
TAKEOVER_WAIT = 300.0


def claim_slot(runner: "Runner", slot: Slot, catch_up: bool) -> claims.ClaimResult | int:
    """The slot's claim ("claimed"), or the exit code of a run that ends here (recorded)."""
    try:
        result = claim(runner, slot, catch_up)
        if result.status == "busy" and runner.standby is not None and not result.fenced:
            stood = stand_by(runner, slot, result, catch_up)
            if isinstance(stood, int):
                return stood
            result = stood
    except Interrupted as interrupted:
        # Nothing is claimed (each try's transaction was rolled back), nothing to ping.
        runner.stop = True
        note = f"{interrupted} while {runner.claim_wait or f'claiming {slot}'}"
        return runner.skip(slot, note, interrupted.exit_code, catch_up, ping=False)
    except patience.Locked as locked:
        return cannot_claim(runner, slot, locked, catch_up)
    if result.status == "done":
        return runner.skip(slot, f"already done for {slot}", 0, catch_up)
    if result.status == "busy":
        return runner.skip(slot, busy_note(runner, slot, result), EXIT_SKIPPED, catch_up)
    if result.abandoned is not None:
        say(
            f"job {runner.plan.name}: recorded the dead attempt #{result.abandoned.pk} for "
            f"{slot} as abandoned",
            runner.stderr,
        )
    return result


def cannot_claim(runner: "Runner", slot: Slot, locked: patience.Locked, catch_up: bool) -> int:
    """Another writer held the database for the whole bound: a failed attempt, recorded if the
    database takes one more write now, said on stderr and pinged /fail either way."""
    runner.stop = True
    note = f"{locked}: could not claim {slot}"
    now = timezone.now()
    try:
        patience.patiently(
            lambda: claims.new_run(
                runner.plan.name, slot, host=runner.host, pid=runner.pid, now=now,
                command=runner.opts.command, outcome=Outcome.FAILED, note=note, exit_code=1,
                finished_at=now, duration=0.0, **runner.origin.fields(catch_up=catch_up),
            ),
            sleep=time.sleep,
            bound=0.0,  # one try
        )  # fmt: skip
    except patience.Locked:
        note += " (not recorded: nothing can be written)"
    say(f"error: job {runner.plan.name}: {note}", runner.stderr)
    head = runner.catch_up_head() + f"cronops: {note}\n".encode()
    runner.monitors().finish(None, b"", kind="fail", head=head)
    return 1


def takeover_bound(runner: "Runner") -> float:
    return runner.standby if runner.standby is not None else TAKEOVER_WAIT


def claim(runner: "Runner", slot: Slot, catch_up: bool = False) -> claims.ClaimResult:
    runner.claim_wait = ""
    if runner.standby is not None:
        deadline = runner.standby_deadline
    else:
        deadline = time.monotonic() + TAKEOVER_WAIT

    def begins(row: SlotClaim, left: float) -> None:
        runner.claim_wait = (
            f"waiting to take {slot} over from run #{row.run_id} on {row.host} (pid {row.pid})"
        )
        say(
            f"job {runner.plan.name}: run #{row.run_id} on {row.host} (pid {row.pid}) holds "
            f"{slot} inside a transaction (a fencing transaction of its job, "
            "still_held(lock=True), or a heartbeat the database holds up) although its "
            f"heartbeat is stale; waiting up to {human_duration(left)} for that transaction to "
            "end before taking the slot over",
            runner.stdout,
        )

    def locked(reason: str, bound: float) -> None:
        runner.claim_wait = f"waiting for a lock to claim {slot} ({reason})"
        say(
            f"job {runner.plan.name}: {reason}; waiting for it to claim {slot} (at most "
            f"{human_duration(bound)})",
            runner.stderr,
        )

    fence = claims.Waiting(runner.signals.sleep, deadline, timezone.now, begins)
    return patience.patiently(
        lambda: claims.claim(
            runner.plan.name,
            slot,
            host=runner.host,
            pid=runner.pid,
            now=timezone.now(),
            force=bool(runner.opts.force),
            stale_after=claims.STALE_HEARTBEATS * runner.heartbeat,
            command=runner.opts.command,
            wait=fence,
            run_fields=runner.origin.fields(catch_up=catch_up),
        ),
        sleep=runner.signals.sleep,
        waiting=locked,
    )


def busy_note(runner: "Runner", slot: Slot, result: claims.ClaimResult) -> str:
    holder = result.found
    if result.fenced:
        return (
            f"skipped: run #{holder.run_id} on {holder.host} (pid {holder.pid}) stopped "
            "heartbeating inside a fencing transaction of its job, which had not ended when "
            f"this run's bound ({format_duration(takeover_bound(runner))}) passed; {slot} is "
            "taken over once it ends"
        )
    if result.survivor is not None:  # its runner died, a child of it did not
        return (
            f"skipped: the runner of run #{holder.run_id} (pid {holder.pid}, host "
            f"{holder.host}) is gone, but a process of run #{holder.run_id} "
            f"({result.survivor.describe()}) is still running"
        )
    since = timezone.localtime(holder.started_at).strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"skipped: running since {since}, pid {holder.pid}, host {holder.host}"


def stand_by(runner: "Runner", slot: Slot, result: claims.ClaimResult, catch_up: bool):
    """Wait while another run holds `slot` (README: several servers). Returns this slot's
    exit code when there is nothing left to do here, else the ClaimResult it took."""
    total, seen = 0.0, result.found
    name = runner.plan.name
    # Said once, so that a run_job that lives for an hour in the log explains itself.
    say(
        f"job {name}: {slot} is running on {seen.host} (pid {seen.pid}); standing by",
        runner.stdout,
    )
    while result.status == "busy":
        try:
            waited = standby.wait(
                name,
                slot,
                deadline=runner.standby_deadline,
                heartbeat=runner.heartbeat,
                sleep=runner.signals.sleep,
                clock=timezone.now,
            )
        except Interrupted as interrupted:
            # SIGTERM, SIGINT: the wait ends at once; nothing is claimed, nothing to ping.
            runner.stop = True
            note = f"standby {interrupted} while {result.found.host} ran {slot}"
            return runner.skip(slot, note, interrupted.exit_code, catch_up, ping=False)
        total += waited.seconds
        holder = seen = waited.claim or result.found
        if waited.verdict == standby.DONE:
            note = f"done on {holder.host} for {slot} (stood by {standby.waited(total)})"
            return runner.skip(slot, note, 0, catch_up)
        if waited.verdict == standby.FAILED:
            outcome = holder.state.replace("_", " ")
            note = (
                f"{outcome} on {holder.host} for {slot}: not run again by a standby (it "
                "runs a slot whose holder died or was terminated, not one that failed)"
            )
            return runner.skip(slot, note, 0, catch_up)
        if waited.verdict == standby.GAVE_UP:
            since = timezone.localtime(holder.started_at).strftime("%Y-%m-%d %H:%M:%S %Z")
            note = (
                f"skipped: running since {since}, pid {holder.pid}, host {holder.host} "
                f"(stood by {standby.waited(total)}, the standby's bound)"
            )
            return runner.skip(slot, note, EXIT_SKIPPED, catch_up)
        result = claim(runner, slot, catch_up)  # TAKE: another standby may be quicker (busy again)
        if result.status == "done":
            holder = result.found
            note = f"done on {holder.host} for {slot} (stood by {standby.waited(total)})"
            return runner.skip(slot, note, 0, catch_up)
        if result.fenced:  # the holder's fencing transaction outlasted the bound
            return result
    if seen.state in standby.RUN_AGAIN:
        say(
            f"job {name}: the run on {seen.host} was {seen.state.replace('_', ' ')}; "
            f"this standby runs {slot}",
            runner.stderr,
        )
    return result
