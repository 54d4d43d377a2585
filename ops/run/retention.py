"""Retention for the run history and the slot claims: `prune_runs --older-than=90d`.

Deletes JobRun rows that started before `now - older_than`, job by job on the
(job, -started_at) index, in short batches (each its own transaction, so cron jobs writing
their history are never blocked for long). Two rows per job are always kept, whatever their
age: its latest attempt and its latest success, so job_status still knows when a monthly or
yearly job last ran and last succeeded.

SlotClaim rows whose slot is older than the cut-off (`scheduled_at`, or `started_at` for a
by-hand date slot of an unscheduled command) go too, the same way: a minutely job adds
~525,000 a year. Kept whatever their age: each job's first claim and latest succeeded claim (by
slot instant), and every claim still `running`. That is all catch-up and job_status need:
catch-up never runs a slot at or before the latest succeeded one nor before the first claim
(docs/run_job.md, "the catch-up floor"), so pruning never changes what it runs; job_status looks
at the due slot (younger than any sensible cut-off) and at the latest success. What goes: the
record that an older slot was done, so a by-hand `--logical-date` run of a date older than the
cut-off runs again (the command's own idempotency, like charge_daily's unique charge per day,
still applies).

The effects marked by `ops.once(key)` go by the same cut-off, by when they were marked, except
those of a slot whose claim is kept: while the claim says "done", `--force` must still find its
effects done. A by-hand run of a slot whose claim went may do its effects again, as it may run
again.
"""

import datetime as dt
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Q

from ..models import Effect, JobRun, Outcome, SlotClaim
from ..monitors.status import NOT_ATTEMPTS, history_job_names
from . import claims

BATCH = 2000


@dataclass
class PruneResult:
    cutoff: dt.datetime
    deleted: int = 0
    per_job: dict[str, int] = field(default_factory=dict)
    claims_deleted: int = 0
    claims_per_job: dict[str, int] = field(default_factory=dict)
    effects_deleted: int = 0
    effects_per_job: dict[str, int] = field(default_factory=dict)


def _kept(job: str) -> list[int]:
    runs = JobRun.objects.filter(job=job).order_by("-started_at", "-id")
    keep = [
        runs.exclude(outcome__in=NOT_ATTEMPTS).values_list("pk", flat=True).first(),
        runs.filter(outcome=Outcome.SUCCEEDED).values_list("pk", flat=True).first(),
    ]
    return [pk for pk in keep if pk is not None]


def _kept_claims(job: str) -> list[int]:
    """What catch-up's floor is made of (the job's first claim and latest succeeded slot), and
    a by-hand date slot's success when the job has no scheduled one."""
    first, latest = claims.floor_claims(job)
    if latest is None:
        done = SlotClaim.objects.filter(job=job, state=Outcome.SUCCEEDED)
        latest = done.order_by("-started_at").only("pk").first()
    return [c.pk for c in (first, latest) if c is not None]


def _delete_in_batches(rows, model, batch: int, before=None) -> int:
    count = 0
    while True:
        with transaction.atomic():
            ids = list(rows.values_list("pk", flat=True)[:batch])
            if not ids:
                return count
            if before is not None:
                before(ids)
            model.objects.filter(pk__in=ids).delete()
        count += len(ids)


def _old_claims(job: str, cutoff: dt.datetime):
    """The claims of `job` that a prune at `cutoff` deletes."""
    return (
        SlotClaim.objects.filter(job=job)
        .filter(Q(scheduled_at__lt=cutoff) | Q(scheduled_at__isnull=True, started_at__lt=cutoff))
        .exclude(state=Outcome.RUNNING)
        .exclude(pk__in=_kept_claims(job))
    )


def prune_claims(
    result: "PruneResult", *, dry_run: bool, batch: int, job: str | None = None
) -> None:
    """Delete (or count) the claims of slots older than the cut-off, of every job or only of
    `job`; see the module's doc."""
    for name in [job] if job is not None else history_job_names(SlotClaim):
        old = _old_claims(name, result.cutoff)
        count = old.count() if dry_run else _delete_in_batches(old, SlotClaim, batch)
        if count:
            result.claims_per_job[name] = count
            result.claims_deleted += count


def prune_effects(
    result: "PruneResult", *, dry_run: bool, batch: int, job: str | None = None
) -> None:
    """Delete (or count) the effects `ops.once` marked before the cut-off, but not those of a
    slot that still has its claim (prune_claims runs first)."""
    for name in [job] if job is not None else history_job_names(Effect):
        old_claims = _old_claims(name, result.cutoff).values("pk")
        claimed = SlotClaim.objects.filter(job=name).exclude(pk__in=old_claims).values("slot")
        old = Effect.objects.filter(job=name, created_at__lt=result.cutoff).exclude(
            slot__in=claimed
        )
        count = old.count() if dry_run else _delete_in_batches(old, Effect, batch)
        if count:
            result.effects_per_job[name] = count
            result.effects_deleted += count


def prune_runs(
    *,
    now: dt.datetime,
    older_than: float,
    dry_run: bool = False,
    batch: int = BATCH,
    job: str | None = None,
) -> PruneResult:
    """Delete (or with dry_run count) the runs started more than `older_than` seconds ago,
    of every job or only of `job` (a shorter retention for a chatty job, e.g. the metrics), and
    the claims of slots that old and the effects marked that long ago."""
    result = PruneResult(cutoff=now - dt.timedelta(seconds=older_than))
    for name in [job] if job is not None else history_job_names():
        old = JobRun.objects.filter(job=name, started_at__lt=result.cutoff).exclude(
            pk__in=_kept(name)
        )
        if dry_run:
            count = old.count()
        else:
            count = _delete_in_batches(
                old.order_by("started_at"),
                JobRun,
                batch,
                before=lambda ids: SlotClaim.objects.filter(run_id__in=ids).update(run=None),
            )
        if count:
            result.per_job[name] = count
            result.deleted += count
    prune_claims(result, dry_run=dry_run, batch=batch, job=job)
    prune_effects(result, dry_run=dry_run, batch=batch, job=job)
    return result
