"""Retention for the run history: `prune_runs --older-than=90d`.

Deletes JobRun rows that started before `now - older_than`, job by job on the
(job, -started_at) index, in short batches (each its own transaction, so cron jobs writing
their history are never blocked for long). Two rows per job are always kept, whatever their
age: its latest attempt and its latest success, so job_status still knows when a monthly or
yearly job last ran and last succeeded.

SlotClaim rows are kept (their `run` link becomes empty). A claim is the record that a slot is
done: catch-up and a by-hand `--logical-date` run consult it to skip a slot that already
succeeded, and catch-up never reaches before a job's first claim. One small row per slot, no
output: the history's bulk is JobRun's output tail, which is what this removes.
"""

import datetime as dt
from dataclasses import dataclass, field

from django.db import transaction

from .models import JobRun, Outcome, SlotClaim
from .status import history_job_names

BATCH = 2000


@dataclass
class PruneResult:
    cutoff: dt.datetime
    deleted: int = 0
    per_job: dict[str, int] = field(default_factory=dict)


def _kept(job: str) -> list[int]:
    runs = JobRun.objects.filter(job=job).order_by("-started_at", "-id")
    keep = [
        runs.exclude(outcome=Outcome.SKIPPED).values_list("pk", flat=True).first(),
        runs.filter(outcome=Outcome.SUCCEEDED).values_list("pk", flat=True).first(),
    ]
    return [pk for pk in keep if pk is not None]


def prune_runs(
    *, now: dt.datetime, older_than: float, dry_run: bool = False, batch: int = BATCH
) -> PruneResult:
    """Delete (or with dry_run count) the runs started more than `older_than` seconds ago."""
    result = PruneResult(cutoff=now - dt.timedelta(seconds=older_than))
    for job in history_job_names():
        old = JobRun.objects.filter(job=job, started_at__lt=result.cutoff).exclude(
            pk__in=_kept(job)
        )
        if dry_run:
            count = old.count()
        else:
            count = 0
            while True:
                with transaction.atomic():
                    ids = list(old.order_by("started_at").values_list("pk", flat=True)[:batch])
                    if not ids:
                        break
                    SlotClaim.objects.filter(run_id__in=ids).update(run=None)
                    JobRun.objects.filter(pk__in=ids).delete()
                count += len(ids)
        if count:
            result.per_job[job] = count
            result.deleted += count
    return result
