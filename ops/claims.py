"""The slot claim: one row per job and slot that only one live run can own.

Taking a claim is a single conditional UPDATE (or the INSERT that creates the row), so two
processes, on one host or on two hosts sharing the database, can never both win it.
"""

import datetime as dt
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Q

from .models import JobRun, Outcome, SlotClaim
from .slots import Slot

STALE_HEARTBEATS = 3  # a claim from another host is dead after this many missed heartbeats
RETRYABLE = [Outcome.FAILED, Outcome.TIMED_OUT, Outcome.TERMINATED, Outcome.ABANDONED]


@dataclass
class ClaimResult:
    status: str  # "claimed", "done" or "busy"
    run: JobRun | None = None
    holder: SlotClaim | None = None
    abandoned: JobRun | None = None


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
) -> ClaimResult:
    with transaction.atomic():
        row, created = SlotClaim.objects.get_or_create(
            job=job,
            slot=slot.key,
            defaults={
                "logical_date": slot.logical_date,
                "state": Outcome.RUNNING,
                "host": host,
                "pid": pid,
                "started_at": now,
                "heartbeat_at": now,
            },
        )
        abandoned = None
        if not created:
            # We hold this job's lock, so a "running" claim from our own host is a dead process;
            # from another host it is dead once its heartbeat is stale.
            free = (
                Q(state__in=RETRYABLE)
                | Q(state=Outcome.RUNNING, host=host)
                | Q(state=Outcome.RUNNING, heartbeat_at__lt=now - dt.timedelta(seconds=stale_after))
            )
            if force:
                free |= Q(state=Outcome.SUCCEEDED)
            taken = (
                SlotClaim.objects.filter(pk=row.pk)
                .filter(free)
                .update(
                    state=Outcome.RUNNING,
                    host=host,
                    pid=pid,
                    started_at=now,
                    heartbeat_at=now,
                )
            )
            if not taken:
                row.refresh_from_db()
                status = "done" if row.state == Outcome.SUCCEEDED else "busy"
                return ClaimResult(status=status, holder=row)
            if row.state == Outcome.RUNNING and row.run_id:
                abandoned = JobRun.objects.filter(pk=row.run_id, outcome=Outcome.RUNNING).first()
                if abandoned is not None:
                    abandoned.outcome = Outcome.ABANDONED
                    abandoned.finished_at = row.heartbeat_at
                    abandoned.note = (
                        f"process died (pid {row.pid} on {row.host}, last heartbeat "
                        f"{row.heartbeat_at:%Y-%m-%d %H:%M:%S %Z})"
                    )
                    abandoned.save(update_fields=["outcome", "finished_at", "note"])
        run = new_run(job, slot, host=host, pid=pid, now=now, command=command)
        SlotClaim.objects.filter(pk=row.pk).update(run=run)
    return ClaimResult(status="claimed", run=run, abandoned=abandoned)


def release(run: JobRun) -> None:
    """Put the run's final outcome on its claim (only if the claim is still ours)."""
    SlotClaim.objects.filter(job=run.job, slot=run.slot, run=run).update(state=run.outcome)


def heartbeat(run: JobRun, now: dt.datetime) -> int:
    return SlotClaim.objects.filter(job=run.job, slot=run.slot, run=run).update(heartbeat_at=now)


def first_slot_key(job: str) -> str | None:
    """The earliest slot this job ever claimed: catch-up never goes further back."""
    return SlotClaim.objects.filter(job=job).order_by("slot").values_list("slot", flat=True).first()


def succeeded_keys(job: str, keys: list[str]) -> set[str]:
    return set(
        SlotClaim.objects.filter(job=job, slot__in=keys, state=Outcome.SUCCEEDED).values_list(
            "slot", flat=True
        )
    )
