"""The slot claim: one row per job and slot that only one live run can own.

Taking a claim is the INSERT that creates the row, or one conditional UPDATE that also checks
the claim's `version`, so two processes, on one host or on two hosts sharing the database, can
never both win it. A claim held by a running process is taken over only when that holder is
provably gone (ops/run/process.py):

- on the same machine (same boot id and pid namespace): its pid is free, or belongs to a
  process started at another time (pid reuse), and no process of its run (a child that
  inherited OPS_RUN_ID, ops/run/descendants.py) still runs; a live holder keeps its claim;
- anywhere else (another machine, another container, before a reboot), or for a claim written
  before holders were recorded: its heartbeat is older than STALE_HEARTBEATS intervals.

The host name (OPS_HOST) and the file lock play no part: two servers may share a name, two
checkouts may use two lock directories, and a lock directory may be deleted under a live run.

Each take increases `version` (the first claim is 1). The holder's heartbeat and its final
state are written only while (run, version) still match, so a run whose claim was taken over
never writes onto the new holder's. A run carries the version it holds as `run.claim_version`.

A running job can ask whether it still holds its claim: `current_claim()` and
`HeldClaim.still_held()` (ops/run/fencing.py and ops/run/held.py, with the locks a claim and a
fencing transaction share).
"""

import datetime as dt
import time
from collections.abc import Callable
from zoneinfo import ZoneInfo

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q

from ..models import JobRun, Outcome, SlotClaim
from ..schedule.slots import Slot, start_of_day
from ..values import Value
from . import descendants, patience, process
from .fencing import (  # noqa: F401  (their old home: callers import them from here too)
    ENV_HOLDER,
    ENV_JOB,
    ENV_RUN,
    ENV_SLOT,
    ENV_VERSION,
    current_claim,
    enter,
    environment,
    held_claim,
    held_fields,
    holder_mark,
    lock_holder,
    lock_job,
)

STALE_HEARTBEATS = 3  # a claim that cannot be checked is dead after this many missed heartbeats
RETRYABLE = [
    Outcome.FAILED,
    Outcome.TIMED_OUT,
    Outcome.TERMINATED,
    Outcome.ABANDONED,
    Outcome.WAITING,  # --after: the slot runs once its upstream succeeded
    Outcome.BLOCKED,
]
ATTEMPTS = 5  # re-reads when another run changed the claim between our read and our update
FENCE_POLL = 1.0  # seconds between two tries of a takeover held back by a fencing transaction


class ClaimResult(Value):
    status: str  # "claimed", "done" or "busy"
    run: JobRun | None = None
    holder: SlotClaim | None = None
    abandoned: JobRun | None = None
    version: int | None = None
    survivor: descendants.Proc | None = None  # busy: the dead holder's child that still runs
    # busy: the holder is gone, but a fencing transaction of its job (still_held(lock=True))
    # has not ended: the takeover waited for it until its bound
    fenced: bool = False

    @property
    def found(self) -> SlotClaim:
        """The claim that made it "done" or "busy" (those always carry it)."""
        assert self.holder is not None, f"a {self.status!r} claim result has no holder"
        return self.holder

    @property
    def taken(self) -> JobRun:
        """The run that holds the claim now ("claimed" always carries it)."""
        assert self.run is not None, f"a {self.status!r} claim result has no run"
        return self.run


def new_run(
    job: str,
    slot: Slot | None,
    *,
    host: str,
    pid: int,
    now: dt.datetime,
    command: str,
    outcome=Outcome.RUNNING,
    **extra,
) -> JobRun:
    lag = None
    if slot is not None and slot.at is not None:
        lag = (now - slot.at).total_seconds()
    return JobRun.objects.create(
        job=job,
        slot=slot.key if slot else "",
        logical_date=slot.logical_date if slot else None,
        scheduled_at=slot.at if slot else None,
        outcome=outcome,
        started_at=now,
        host=host,
        pid=pid,
        lag=lag,
        command=command[:500],
        **extra,
    )


def new_skip(
    runner, slot: Slot | None, note: str, exit_code: int, now: dt.datetime, catch_up=False, **extra
):
    """The history row of a run that skips its slot (`runner`: the Runner that skips; how it
    was started: ops/run/origin.py)."""
    return new_run(
        runner.plan.name,
        slot,
        host=runner.host,
        pid=runner.pid,
        now=now,
        command=runner.opts.command,
        outcome=Outcome.SKIPPED,
        note=note,
        exit_code=exit_code,
        finished_at=now,
        duration=0.0,
        **runner.origin.fields(catch_up=catch_up),
        **extra,
    )


def holder_of(row: SlotClaim) -> process.Identity:
    return process.Identity(
        boot_id=row.holder_boot_id,
        pid_ns=row.holder_pid_ns,
        pid=row.pid,
        started=row.holder_started,
    )


def stale_limit(row: SlotClaim, stale_after: float) -> float:
    """Seconds without a heartbeat after which `row`'s holder counts as gone: STALE_HEARTBEATS
    of the holder's own interval (it wrote it on the claim), never the judge's; `stale_after`
    (the judge's own) only for a claim written before holders recorded their interval."""
    if row.heartbeat_interval:
        return STALE_HEARTBEATS * row.heartbeat_interval
    return stale_after


def holder_alive(
    row: SlotClaim, now: dt.datetime, stale_after: float, me: process.Identity | None = None
) -> bool:
    """Whether a running claim still has a live holder, as far as this process can tell."""
    me = me or process.identify()
    holder = holder_of(row)
    if process.same_machine(holder, me):
        return not process.is_gone(holder, me) or survivor(row) is not None
    return row.heartbeat_at >= now - dt.timedelta(seconds=stale_limit(row, stale_after))


def survivor(row: SlotClaim) -> descendants.Proc | None:
    """A process of the holder's run that still runs on this machine although the holder's
    own process is gone: a child of the job that inherited OPS_RUN_ID. Asked only once the
    holder is known dead, so a scan of /proc is paid only then."""
    if not row.run_id:
        return None
    mark = holder_mark(row.pid, row.holder_started) if row.holder_started is not None else ""
    return descendants.survivor(row.run_id, row.job, holder=mark)


def _holder_fields(identity: process.Identity, host: str, heartbeat: float) -> dict:
    return {
        "heartbeat_interval": heartbeat,
        "host": host,
        "pid": identity.pid,
        "holder_boot_id": identity.boot_id,
        "holder_pid_ns": identity.pid_ns,
        "holder_started": identity.started,
    }


def _same_slot(job: str, slot: Slot):
    """Claims of the same job under other keys that stand for `slot` (docs/run_job.md, "Slots,
    logical dates and claims"): the same instant under any key (another TIME_ZONE's wall clock,
    or a once-a-day key whose claim ran at that instant); and for a slot keyed by date, any claim of
    its logical date (the job's earlier several-a-day schedule, or a key from before the upgrade).
    A once-a-day claim covers the one instant it ran for, not the other slots of a day that now
    has several."""
    return (
        SlotClaim.objects.filter(_same_slot_q(slot), job=job)
        .exclude(slot=slot.key)
        .filter(state__in=[Outcome.SUCCEEDED, Outcome.RUNNING])
        .order_by("id")
    )


def _same_slot_q(slot: Slot) -> Q:
    same = Q(scheduled_at=slot.at) if slot.at is not None else Q(pk__in=[])
    if slot.by_date:
        same |= Q(logical_date=slot.logical_date)
    return same


def _slot_claims(job: str, slot: Slot) -> tuple[SlotClaim | None, list[SlotClaim]]:
    """In one read: the slot's own claim (None: never claimed) and its claims under other
    keys, as _same_slot() finds them."""
    held = Q(state__in=[Outcome.SUCCEEDED, Outcome.RUNNING])
    rows = SlotClaim.objects.filter(Q(slot=slot.key) | (_same_slot_q(slot) & held), job=job)
    own, others = None, []
    for row in rows.order_by("id"):
        if row.slot == slot.key:
            own = row
        else:
            others.append(row)
    return own, others


class _Yield(Exception):
    """Rolls our claim back: the slot is held or done under another key."""

    def __init__(self, result: "ClaimResult"):
        self.result = result


class _HolderBusy(Exception):
    """Rolls our claim back: a takeover met a fencing transaction of the holder's job."""

    def __init__(self, row: SlotClaim):
        self.row = row


def _take_from(row: SlotClaim) -> None:
    """Before a takeover of `row`: its holder's lock, else _HolderBusy. Never waited for in
    the claim's transaction: that holds the job's lock, which every claim of the job needs."""
    if not lock_holder(row.job, row.slot, wait=False):
        raise _HolderBusy(row)


class Waiting(Value):
    """How claim() waits for a gone holder's fencing transaction to end: with run_job's sleep
    (a signal ends it at once: signals.Interrupted) until `deadline` (time.monotonic());
    `begins(claim, seconds left)` is called once, when the wait begins."""

    sleep: Callable[[float], None]
    deadline: float
    clock: Callable[[], dt.datetime]
    begins: Callable[[SlotClaim, float], None]
    began: bool = False


def _conflict(others: list[SlotClaim], *, me, now, stale_after, force) -> ClaimResult | None:
    """The same slot claimed under another key (`others`, _slot_claims'): done (a success), busy
    (a live holder), or None. A running claim there whose holder is gone is recorded abandoned
    (version + 1, so that holder, if it was only frozen, finds it lost at its next heartbeat)."""
    for row in others:
        if row.state == Outcome.SUCCEEDED:
            if not force:
                return ClaimResult(status="done", holder=row)
            continue
        if holder_alive(row, now, stale_after, me):
            return ClaimResult(status="busy", holder=row)
        _take_from(row)  # a fencing transaction of its holder ends first
        gone = SlotClaim.objects.filter(pk=row.pk, version=row.version, state=Outcome.RUNNING)
        if gone.update(state=Outcome.ABANDONED, version=F("version") + 1) and row.run_id:
            _abandon(row, proven_gone=process.same_machine(holder_of(row), me))
    return None


def _free(row: SlotClaim, *, me, now, stale_after, force) -> Q | None:
    """The condition under which `row` may be taken now, or None when it may not."""
    if row.state == Outcome.SUCCEEDED:
        return Q(state=Outcome.SUCCEEDED) if force else None
    if row.state != Outcome.RUNNING:
        return Q(state__in=RETRYABLE)
    holder = holder_of(row)
    if process.same_machine(holder, me):
        if not process.is_gone(holder, me) or survivor(row) is not None:
            return None
        return Q(state=Outcome.RUNNING)
    cutoff = now - dt.timedelta(seconds=stale_limit(row, stale_after))
    if row.heartbeat_at < cutoff:
        # The UPDATE checks it again: a heartbeat that arrives meanwhile keeps the claim.
        return Q(state=Outcome.RUNNING, heartbeat_at__lt=cutoff)
    return None


def claim(
    job: str,
    slot: Slot,
    *,
    host: str,
    pid: int,
    now: dt.datetime,
    stale_after: float,
    force: bool,
    command: str,
    identity: process.Identity | None = None,
    heartbeat: float | None = None,
    wait: Waiting | None = None,
    run_fields: dict | None = None,
) -> ClaimResult:
    """Claim `slot` for `job` for the process `identity` (default: process `pid`), which
    heartbeats every `heartbeat` seconds (default: `stale_after` / STALE_HEARTBEATS, its own
    judge's limit); the interval is stored on the claim, and others judge it by it.

    Race-safe against the same slot under another key: our claim and the other keys' are read
    and written in one transaction serialised per job (lock_job); when another key holds or
    has done the slot, what ours wrote is rolled back and the answer is that one's.

    A takeover that meets a fencing transaction of the gone holder's job is rolled back too
    and, with `wait`, tried again every FENCE_POLL seconds until its deadline; then (or without
    `wait`) the answer is "busy", `fenced`."""
    me = identity or process.identify(pid)
    if heartbeat is None:
        heartbeat = stale_after / STALE_HEARTBEATS
    holder = _holder_fields(me, host, heartbeat)
    attempts = 0
    while attempts < ATTEMPTS:
        try:
            result = _claim_once(
                job,
                slot,
                me=me,
                holder=holder,
                now=now,
                stale_after=stale_after,
                force=force,
                command=command,
                run_fields=run_fields or {},
            )
        except _Yield as yielded:
            return yielded.result
        except IntegrityError:
            # Another run created the claim first (a database whose claims the job's lock does
            # not serialise): the transaction is rolled back; read it again.
            result = None
        except _HolderBusy as busy:
            left = wait.deadline - time.monotonic() if wait is not None else 0.0
            if wait is None or left <= 0:
                return ClaimResult(status="busy", holder=busy.row, fenced=True)
            if not wait.began:
                wait.began = True
                wait.begins(busy.row, left)
            wait.sleep(min(FENCE_POLL, left))
            now = wait.clock()
            continue
        if result is not None:
            return result
        attempts += 1
    row = SlotClaim.objects.get(job=job, slot=slot.key)
    return ClaimResult(status="done" if row.state == Outcome.SUCCEEDED else "busy", holder=row)


def _claim_once(
    job, slot, *, me, holder, now, stale_after, force, command, run_fields
) -> ClaimResult | None:
    """One attempt; None when another run changed the claim between our read and our update."""
    with transaction.atomic():
        patience.in_transaction()  # under run_job: a lock wait ends and is tried again
        lock_job(job)
        # One read for the slot's claims under every key: the job's lock makes it, our write
        # and the look at the other keys one step (a fresh slot's claim is written last, with
        # its run: two statements fewer in the transaction that holds SQLite's one writer).
        row, others = _slot_claims(job, slot)
        abandoned = None
        if row is not None:
            free = _free(row, me=me, now=now, stale_after=stale_after, force=force)
            if free is None:
                if row.state == Outcome.SUCCEEDED:
                    return ClaimResult(status="done", holder=row)
                left = None
                if process.same_machine(holder_of(row), me) and process.is_gone(holder_of(row), me):
                    left = survivor(row)
                return ClaimResult(status="busy", holder=row, survivor=left)
            if row.state == Outcome.RUNNING:
                # A takeover: a fencing transaction of the holder ends first; the UPDATE below
                # then sees the claim as committed (a heartbeat meanwhile keeps it).
                _take_from(row)
            taken = SlotClaim.objects.filter(free, pk=row.pk, version=row.version).update(
                state=Outcome.RUNNING,
                version=F("version") + 1,
                scheduled_at=slot.at,
                started_at=now,
                heartbeat_at=now,
                **holder,
            )
            if not taken:
                return None  # another run changed it first: read it again
            if row.state == Outcome.RUNNING and row.run_id:
                abandoned = _abandon(row, proven_gone=process.same_machine(holder_of(row), me))
        # Now the same slot under other keys (the lock makes it one step with ours).
        other = _conflict(others, me=me, now=now, stale_after=stale_after, force=force)
        if other is not None:
            raise _Yield(other)  # rolls ours back: no row, no run, nothing to record
        run = new_run(
            job, slot, host=holder["host"], pid=me.pid, now=now, command=command, **run_fields
        )
        if row is None:
            version = 1
            SlotClaim.objects.create(
                job=job,
                slot=slot.key,
                logical_date=slot.logical_date,
                scheduled_at=slot.at,
                state=Outcome.RUNNING,
                version=version,
                started_at=now,
                heartbeat_at=now,
                run=run,
                **holder,
            )
        else:
            version = row.version + 1
            SlotClaim.objects.filter(pk=row.pk, version=version).update(run=run)
        run.claim_version = version
        run.claim_was = None if row is None else row.state  # a --force run's: succeeded
    return ClaimResult(status="claimed", run=run, abandoned=abandoned, version=version)


def _abandon(row: SlotClaim, proven_gone: bool) -> JobRun | None:
    """Record the dead holder's run as abandoned. (If it was only frozen or cut off from the
    database and comes back, it finds out at its next heartbeat and records itself as taken
    over instead.)"""
    if row.run_id is None:
        return None  # no run recorded on the claim (the query below would find none either)
    abandoned = JobRun.objects.filter(pk=row.run_id, outcome=Outcome.RUNNING).first()
    if abandoned is not None:
        abandoned.outcome = Outcome.ABANDONED
        abandoned.finished_at = row.heartbeat_at
        why = "process died" if proven_gone else "heartbeat stopped"
        abandoned.note = (
            f"{why} (pid {row.pid} on {row.host}, last heartbeat "
            f"{row.heartbeat_at:%Y-%m-%d %H:%M:%S %Z})"
        )
        abandoned.save(update_fields=["outcome", "finished_at", "note"])
    return abandoned


def _ours(run: JobRun):
    """The run's claim, while the run still owns it (same run, same version)."""
    version = getattr(run, "claim_version", None)
    mine = {"job": run.job, "slot": run.slot, "run_id": run.pk}  # one filter(): one clone
    return SlotClaim.objects.filter(**mine, **({} if version is None else {"version": version}))


def release(run: JobRun, state: str | None = None) -> int:
    """Put the run's final outcome (or `state`) on its claim; 0 when the claim is no longer
    ours (another run took it over), and then nothing is written."""
    return _ours(run).update(state=state or run.outcome)


def pass_on(run: JobRun, following: JobRun) -> int:
    """Put the run's claim on `following`, its next attempt (--retries), keeping the claim's
    state and version; 0 when the claim is no longer ours, and then nothing is written."""
    version = getattr(run, "claim_version", None)
    if version is not None:
        following.claim_version = version
    return _ours(run).update(run=following)


def peek(job: str, slot_key: str) -> SlotClaim | None:
    """The claim of one slot as it stands: one read on the unique (job, slot) index."""
    return SlotClaim.objects.filter(job=job, slot=slot_key).first()


def heartbeat(run: JobRun, clock: Callable[[], dt.datetime]) -> int:
    """Refresh the claim's heartbeat; 0 when the claim is no longer this run's. By the claim's
    version (a take makes a new one), not by the attempt: --retries moves the claim from one
    attempt's row to the next under the same version while the heartbeat goes on."""
    version = run.claim_version  # set by claim(), kept by pass_on()
    held = SlotClaim.objects.filter(job=run.job, slot=run.slot, version=version, pid=run.pid)
    if connection.vendor != "postgresql":
        return held.update(heartbeat_at=clock())
    with transaction.atomic():
        # A beat the database holds up (a lock on the table: a migration) holds its claim's
        # holder lock meanwhile, so a takeover waits for it; and it reads the clock once the
        # table is its to write, so that it lands fresh instead of with the time it was sent.
        lock_holder(run.job, run.slot, shared=True)
        with connection.cursor() as cursor:
            table = connection.ops.quote_name(SlotClaim._meta.db_table)
            cursor.execute(f"LOCK TABLE {table} IN ROW EXCLUSIVE MODE")  # the UPDATE's own
        return held.update(heartbeat_at=clock())


class Floor(Value):
    """How far back catch-up may go: after the latest succeeded slot, from the first claim."""

    first: dt.datetime | None  # None: the job never claimed a slot, so there is no catch-up
    latest_success: dt.datetime | None


def catch_up_floor(job: str, tz: ZoneInfo) -> Floor:
    """By slot instant (never by key text, never by when a run happened): a by-hand success of
    an old date does not raise the floor. Two index seeks (ops_claim_job_sched/_state)."""
    first, latest = floor_claims(job)
    start = first.scheduled_at if first else None
    if first and start is None and first.logical_date:
        # Only --logical-date runs of the command before it had a schedule: their dates.
        start = start_of_day(first.logical_date, tz)
    return Floor(first=start, latest_success=latest.scheduled_at if latest else None)


def floor_claims(job: str) -> tuple[SlotClaim | None, SlotClaim | None]:
    """(the job's first claim, its latest succeeded scheduled claim): what catch-up's floor is
    made of, which retention keeps whatever their age."""
    claims = SlotClaim.objects.filter(job=job).only("pk", "scheduled_at", "logical_date")
    first = claims.filter(scheduled_at__isnull=False).order_by("scheduled_at").first()
    if first is None:
        first = claims.filter(logical_date__isnull=False).order_by("logical_date").first()
    latest = (
        claims.filter(state=Outcome.SUCCEEDED, scheduled_at__isnull=False)
        .order_by("-scheduled_at")
        .first()
    )
    return first, latest


def done_keys(job: str, slots: list[Slot]) -> set[str]:
    """The keys of `slots` that already succeeded: under their own key, at the same instant
    under another key, or (a slot keyed by date) their logical date under another key."""
    keys = {s.key for s in slots}
    done = SlotClaim.objects.filter(job=job, state=Outcome.SUCCEEDED)
    found = set(done.filter(slot__in=keys).values_list("slot", flat=True))
    instants = {s.at for s in slots if s.at is not None}
    if instants:
        done_at = set(done.filter(scheduled_at__in=instants).values_list("scheduled_at", flat=True))
        found |= {s.key for s in slots if s.at is not None and s.at in done_at}
    dates = {s.logical_date for s in slots if s.by_date}
    if dates:
        done_dates = set(done.filter(logical_date__in=dates).values_list("logical_date", flat=True))
        found |= {s.key for s in slots if s.by_date and s.logical_date in done_dates}
    return found


def peek_slot(job: str, slot: Slot) -> SlotClaim | None:
    """The claim that decides `slot` now, for a standby: its own key's while that one is running
    or done, else the same slot's under another key (running or done) if there is one."""
    own = peek(job, slot.key)
    if own is not None and own.state in (Outcome.RUNNING, Outcome.SUCCEEDED):
        return own
    return _same_slot(job, slot).first() or own
