"""A made-up run history for the demo's jobs page (`seed_demo --history`), as the runner would
have recorded it: 90 days of the jobs in crontab.d, with a few things an operator should see.

- charge_daily: a missed day (the machine was down: no run at all), a failed day nobody ran
  again, a day that failed and was run again by hand, a day skipped (lock held), slower lately;
- clear-sessions: failing for the last two days;
- prune-runs: fine; metrics: every minute for the last two days, running now;
  summarise-charges and task-worker after charge_daily (--after): blocked, waiting, done;
  prune-metrics: never ran; an ad-hoc job run by hand now and then (`rebuild_search_index`).
"""

import datetime as dt
import random
from zoneinfo import ZoneInfo

from cronsim import CronSim
from django.db import transaction

from ops.models import JobRun, Outcome, SlotClaim
from ops.schedule.crontabd import Schedule
from ops.schedule.slots import Slot, current_slot

HOST = "web1"
NOTES = {
    ("charge_daily", Outcome.FAILED): "CommandError: payment gateway: 503",
    ("clear-sessions", Outcome.FAILED): "OperationalError: database is locked",
    ("charge_daily", Outcome.SKIPPED): "skipped: running since 03:00, pid 4242, host web1",
    ("summarise-charges", Outcome.BLOCKED): "blocked: charge_daily did not succeed; not run",
    ("summarise-charges", Outcome.WAITING): "waiting: charge_daily has not succeeded (waited 1h)",
    ("task-worker", Outcome.BLOCKED): "blocked: summarise-charges did not succeed; not run",
}
CODES = {Outcome.SUCCEEDED: 0, Outcome.FAILED: 1, Outcome.SKIPPED: 75, Outcome.WAITING: 75}
CODES[Outcome.BLOCKED] = 69


def _fires(expr: str, start: dt.datetime, end: dt.datetime, tz: ZoneInfo):
    for fire in CronSim(expr, start.astimezone(tz)):
        if fire > end:
            return
        yield fire


class History:
    def __init__(self, schedule: Schedule, now: dt.datetime):
        self.expr = {j.name: j.cron_expr for j in schedule.jobs if j.cron_expr}
        self.now = now
        self.rng = random.Random(13)
        self.runs: list[JobRun] = []
        self.claims: dict[tuple[str, str], tuple[JobRun, Slot]] = {}

    def add(self, job: str, fire: dt.datetime, outcome: str, duration: float, at=None) -> None:
        """One attempt of the slot at `fire`, started then (or at `at`: a later re-run); an
        ad-hoc job (no schedule) gets no slot."""
        expr = self.expr.get(job)
        slot = current_slot(expr, fire, fire.tzinfo) if expr else None
        started = (at or fire) + dt.timedelta(seconds=self.rng.uniform(0.3, 2.5))
        finished = None if outcome == Outcome.RUNNING else started + dt.timedelta(seconds=duration)
        run = JobRun(
            job=job,
            slot=slot.key if slot else "",
            logical_date=slot.logical_date if slot else None,
            scheduled_at=slot.at if slot else None,
            outcome=outcome,
            note=NOTES.get((job, outcome), ""),
            exit_code=CODES.get(outcome),
            started_at=started,
            finished_at=finished,
            duration=None if finished is None else duration,
            lag=(started - slot.at).total_seconds() if slot else None,
            host=HOST,
            pid=self.rng.randint(1000, 60000),
            command=job,
            output_tail=f"{job}: {outcome}\n",
        )
        self.runs.append(run)
        if slot and outcome != Outcome.SKIPPED:  # the latest attempt of a slot holds its claim
            self.claims[(job, slot.key)] = (run, slot)

    def save(self) -> int:
        self.runs.sort(key=lambda r: r.started_at)  # ids in start order, as the runner's
        with transaction.atomic():
            SlotClaim.objects.all().delete()
            JobRun.objects.all().delete()
            JobRun.objects.bulk_create(self.runs, batch_size=1000)
            SlotClaim.objects.bulk_create(
                [
                    SlotClaim(
                        job=run.job,
                        slot=slot.key,
                        logical_date=slot.logical_date,
                        state=run.outcome,
                        run=run,
                        host=HOST,
                        pid=run.pid,
                        started_at=run.started_at,
                        heartbeat_at=run.finished_at or self.now,
                    )
                    for run, slot in self.claims.values()
                ],
                batch_size=1000,
            )
        return len(self.runs)


def seed_history(schedule: Schedule, *, now: dt.datetime, tz: ZoneInfo, days: int = 90) -> int:
    """Replace the history with the demo's; returns the number of runs written."""
    h = History(schedule, now)
    rng = h.rng
    start = now - dt.timedelta(days=days)
    today = now.astimezone(tz).date()

    def fires(job: str, since: dt.datetime = start, until: dt.datetime = now):
        return list(_fires(h.expr[job], since, until, tz)) if job in h.expr else []

    for fire in fires("charge_daily"):
        age = (today - fire.date()).days
        duration = rng.uniform(38, 47) if age > 10 else rng.uniform(55, 70)
        if age == 23:
            continue  # the machine was down: no run at all that day
        if age == 41:
            h.add("charge_daily", fire, Outcome.FAILED, 12.5)  # and nobody ran it again
        elif age == 12:
            h.add("charge_daily", fire, Outcome.FAILED, 8.0)
            h.add("charge_daily", fire, Outcome.SUCCEEDED, duration, fire + dt.timedelta(hours=2))
        elif age == 57:
            h.add("charge_daily", fire, Outcome.SKIPPED, 0.0)
        else:
            h.add("charge_daily", fire, Outcome.SUCCEEDED, duration)

    # The task enqueued after charge_daily, and the worker after it (--after): nothing on the
    # day the machine was down, blocked on the day the charge failed for good, waiting on the
    # day it failed and was run again by hand (then done once it succeeded).
    for fire in fires("summarise-charges"):
        age = (today - fire.date()).days
        if age == 23:
            continue
        if age == 41:
            h.add("summarise-charges", fire, Outcome.BLOCKED, 0.0)
        elif age == 12:
            h.add("summarise-charges", fire, Outcome.WAITING, 3600.0)
            h.add("summarise-charges", fire, Outcome.SUCCEEDED, 0.02, fire + dt.timedelta(hours=2))
        else:
            h.add("summarise-charges", fire, Outcome.SUCCEEDED, rng.uniform(0.01, 0.03))
    for fire in fires("task-worker"):
        age = (today - fire.date()).days
        if age == 23:
            continue
        outcome = Outcome.BLOCKED if age == 41 else Outcome.SUCCEEDED
        at = fire + dt.timedelta(hours=2) if age == 12 else None
        h.add("task-worker", fire, outcome, 0.0 if age == 41 else rng.uniform(1.0, 1.6), at)

    for fire in fires("clear-sessions"):
        age = (today - fire.date()).days
        outcome = Outcome.FAILED if age <= 1 else Outcome.SUCCEEDED
        h.add("clear-sessions", fire, outcome, rng.uniform(0.3, 0.6))

    for fire in fires("prune-runs"):
        h.add("prune-runs", fire, Outcome.SUCCEEDED, rng.uniform(2, 4))

    minutely = fires("metrics", now - dt.timedelta(days=2), now - dt.timedelta(seconds=5))
    for i, fire in enumerate(minutely):
        running = i == len(minutely) - 1  # the latest is running as the page is drawn
        slow = 2.0 if i % 97 == 0 else 0.0
        h.add(
            "metrics",
            fire,
            Outcome.RUNNING if running else Outcome.SUCCEEDED,
            rng.uniform(0.3, 0.5) + slow,
        )

    for age in (80, 52, 33, 9, 2):
        at = (now - dt.timedelta(days=age)).replace(hour=9, minute=12, second=0, microsecond=0)
        h.add("rebuild_search_index", at.astimezone(tz), Outcome.SUCCEEDED, 95.0)
    return h.save()
