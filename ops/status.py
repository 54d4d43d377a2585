"""Job status: per job, when it last succeeded, how late it started, and whether it needs a look.

`collect(now=...)` is the logic behind `manage.py job_status`; the clock is a parameter, never
read in here. Every query is per job and served by JobRun's indexes (`ops_run_job_started`,
`ops_run_job_outcome`) or SlotClaim's unique (job, slot), so the cost does not grow with the
size of the history.

States, in order of precedence (the first that applies wins):

- ``never run``: the history has no attempt of the job (skips do not count).
- ``running``: its latest attempt is still running and alive: its slot claim's heartbeat is
  fresh (or, for a run without a slot, its --timeout has not passed). A "running" row whose
  process died is treated as abandoned, i.e. a failure.
- ``failing``: its latest finished attempt failed, timed out, was terminated or abandoned.
- ``overdue``: the job has a schedule and its *due slot* has no success. The due slot is the
  most recent fire time S with ``S + grace <= now``; it counts as done when the slot's claim
  succeeded or the last success served S or a later slot (or, unslotted, started at or after S).
- ``ok``: otherwise.

Grace is the job's ``--timeout`` when it has one, else ``OPS_DEFAULT_GRACE`` (default 1 hour),
and never less than 60 s: the same figure sync_healthchecks gives healthchecks.io.
"""

import datetime as dt
import os
import statistics
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from django.conf import settings

from . import claims
from .crontabd import Job, Schedule
from .durations import human_duration, parse_duration
from .models import JobRun, Outcome, SlotClaim
from .slots import current_slot, next_fire

OK, RUNNING, FAILING, OVERDUE, NEVER_RUN = "ok", "running", "failing", "overdue", "never run"
STATES = (OK, RUNNING, FAILING, OVERDUE, NEVER_RUN)
HEALTHY = {OK, RUNNING}
FAILURES = (Outcome.FAILED, Outcome.TIMED_OUT, Outcome.TERMINATED, Outcome.ABANDONED)
WINDOW = 20  # recent attempts read per job: medians and the failure streak come from these
MIN_GRACE = 60.0  # healthchecks.io's minimum grace
DEFAULT_GRACE = 3600.0
SCHEMA_VERSION = 1

_RUN_FIELDS = (
    "id",
    "job",
    "slot",
    "logical_date",
    "scheduled_at",
    "outcome",
    "note",
    "exit_code",
    "started_at",
    "finished_at",
    "duration",
    "lag",
    "host",
)


def default_grace() -> float:
    """OPS_DEFAULT_GRACE (settings, from the environment / .env), default one hour."""
    value = getattr(settings, "OPS_DEFAULT_GRACE", "")
    return parse_duration(str(value)) if value else DEFAULT_GRACE


def grace_seconds(job: Job | None) -> float:
    """How long after a slot its run may take before the job counts as overdue."""
    timeout = job.options.timeout if job is not None else None
    return max(MIN_GRACE, timeout if timeout else default_grace())


@dataclass
class JobStatus:
    job: str
    state: str
    reason: str
    declared: bool
    schedule: str | None = None
    description: str = ""
    grace: float | None = None
    next_fire: dt.datetime | None = None
    due_slot: str | None = None
    last_run: JobRun | None = None
    last_success: JobRun | None = None
    last_duration: float | None = None
    median_duration: float | None = None
    median_runs: int = 0
    last_lag: float | None = None
    consecutive_failures: int = 0
    running_since: dt.datetime | None = None

    @property
    def healthy(self) -> bool:
        return self.state in HEALTHY


@dataclass
class Report:
    now: dt.datetime
    tz: ZoneInfo
    jobs: list[JobStatus] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return all(j.healthy for j in self.jobs)


def history_job_names(model=JobRun) -> list[str]:
    """Distinct job names in `model` (JobRun or SlotClaim), by a loose index scan.

    One index seek per name instead of a `SELECT DISTINCT` over the whole history.
    """
    names: list[str] = []
    rows = model.objects.order_by("job").values_list("job", flat=True)
    name = rows.first()
    while name is not None:
        names.append(name)
        name = rows.filter(job__gt=name).first()
    return names


def _recent(name: str) -> list[JobRun]:
    return list(
        JobRun.objects.filter(job=name)
        .exclude(outcome=Outcome.SKIPPED)
        .only(*_RUN_FIELDS)
        .order_by("-started_at")[:WINDOW]
    )


def _last_success(name: str, recent: list[JobRun]) -> JobRun | None:
    found = next((r for r in recent if r.outcome == Outcome.SUCCEEDED), None)
    if found is not None:
        return found
    return (
        JobRun.objects.filter(job=name, outcome=Outcome.SUCCEEDED)
        .only(*_RUN_FIELDS)
        .order_by("-started_at")
        .first()
    )


def _failure_streak(name: str, recent: list[JobRun], last_success: JobRun | None) -> int:
    streak = 0
    for run in recent:
        if run.outcome == Outcome.RUNNING:
            continue
        if run.outcome not in FAILURES:
            return streak
        streak += 1
    if len(recent) < WINDOW:
        return streak
    # Every recent attempt failed: count the whole streak on the (job, outcome) index.
    failures = JobRun.objects.filter(job=name, outcome__in=FAILURES)
    if last_success is not None:
        failures = failures.filter(started_at__gt=last_success.started_at)
    return failures.count()


def _last_lag(recent: list[JobRun], expr: str | None, tz: ZoneInfo) -> float | None:
    """Start lag of the latest run that served the slot current at its start.

    Catch-up and `--logical-date` runs serve an older slot: late by design, not a signal.
    """
    for run in recent:
        if run.lag is None:
            continue
        if expr is None or current_slot(expr, run.started_at, tz).key == run.slot:
            return run.lag
    return None


def _alive(run: JobRun, job: Job | None, now: dt.datetime, heartbeat: float) -> bool:
    """Whether a run recorded as running still has a live process behind it."""
    if run.host == settings.OPS_HOST and not _pid_alive(run.pid):
        return False  # on this host the process table knows (a killed ad-hoc run, say)
    if run.slot:
        claim = SlotClaim.objects.filter(job=run.job, slot=run.slot, run_id=run.pk).first()
        if claim is not None:
            stale_after = dt.timedelta(seconds=claims.STALE_HEARTBEATS * heartbeat)
            return now - claim.heartbeat_at <= stale_after
    timeout = job.options.timeout if job is not None else None
    if timeout:
        limit = timeout + claims.STALE_HEARTBEATS * heartbeat
        return now - run.started_at <= dt.timedelta(seconds=limit)
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, under another user
    return True


def _slot_done(name: str, slot_key: str, slot_at: dt.datetime, last_success: JobRun | None):
    if last_success is not None:
        if last_success.scheduled_at is not None and last_success.scheduled_at >= slot_at:
            return True
        if not last_success.slot and last_success.started_at >= slot_at:
            return True
    return SlotClaim.objects.filter(job=name, slot=slot_key, state=Outcome.SUCCEEDED).exists()


def _fmt_time(value: dt.datetime, tz: ZoneInfo) -> str:
    return value.astimezone(tz).strftime("%Y-%m-%d %H:%M")


def job_status(
    name: str, job: Job | None, *, now: dt.datetime, tz: ZoneInfo, heartbeat: float
) -> JobStatus:
    status = JobStatus(
        job=name,
        state=OK,
        reason="",
        declared=job is not None,
        schedule=job.schedule if job else None,
        description=job.description if job else "",
    )
    expr = job.cron_expr if job else None
    if job is not None:
        status.grace = grace_seconds(job)
    if expr:
        status.next_fire = next_fire(expr, now, tz)

    recent = _recent(name)
    last_success = _last_success(name, recent)
    status.last_success = last_success
    status.last_run = recent[0] if recent else None
    finished = [r for r in recent if r.outcome != Outcome.RUNNING and r.duration is not None]
    if finished:
        status.last_duration = finished[0].duration
        status.median_duration = statistics.median(r.duration for r in finished)
        status.median_runs = len(finished)
    status.last_lag = _last_lag(recent, expr, tz)
    status.consecutive_failures = _failure_streak(name, recent, last_success)

    if expr:
        due = current_slot(expr, now - dt.timedelta(seconds=status.grace), tz)
        status.due_slot = due.key
        due_done = _slot_done(name, due.key, due.at, last_success)
    else:
        due_done = True

    latest = status.last_run
    if latest is None:
        status.state, status.reason = NEVER_RUN, "no run in the history"
        return status
    if latest.outcome == Outcome.RUNNING:
        if _alive(latest, job, now, heartbeat):
            status.state = RUNNING
            status.running_since = latest.started_at
            status.reason = f"running since {_fmt_time(latest.started_at, tz)} on {latest.host}"
            return status
        status.consecutive_failures += 1
        status.state = FAILING
        status.reason = (
            f"the run started {_fmt_time(latest.started_at, tz)} on {latest.host} "
            "stopped reporting (process died?)"
        )
        return status
    if latest.outcome in FAILURES:
        code = "" if latest.exit_code is None else f" (exit {latest.exit_code})"
        status.state = FAILING
        status.reason = f"last run {latest.outcome.replace('_', ' ')}{code}"
        if status.consecutive_failures > 1:
            status.reason += f", {status.consecutive_failures} failures in a row"
        if latest.note:
            status.reason += f": {latest.note}"
        return status
    if not due_done:
        status.state = OVERDUE
        status.reason = (
            f"no success for the slot {status.due_slot} after its grace of "
            f"{human_duration(status.grace)}"
        )
        return status
    status.state, status.reason = OK, ""
    return status


class UnknownJob(LookupError):
    pass


def collect(
    schedule: Schedule,
    *,
    now: dt.datetime,
    tz: ZoneInfo,
    only: str | None = None,
    heartbeat: float | None = None,
) -> Report:
    """The status of every job declared in `schedule` and every other job in the history."""
    if heartbeat is None:
        heartbeat = float(settings.OPS_HEARTBEAT_SECONDS)
    declared = {job.name: job for job in schedule.jobs}
    if only is not None:
        if only in declared:
            names = [only]
        elif JobRun.objects.filter(job=only).exists():
            names = [only]
        else:
            raise UnknownJob(f"no job named {only!r} in crontab.d or in the run history")
    else:
        names = list(declared) + sorted(set(history_job_names()) - set(declared))
    report = Report(now=now, tz=tz)
    for name in names:
        report.jobs.append(
            job_status(name, declared.get(name), now=now, tz=tz, heartbeat=heartbeat)
        )
    return report


# --- output ---------------------------------------------------------------------------------


def _iso(value: dt.datetime | None, tz: ZoneInfo) -> str | None:
    return value.astimezone(tz).isoformat() if value is not None else None


def _run_json(run: JobRun | None, tz: ZoneInfo) -> dict | None:
    if run is None:
        return None
    return {
        "id": run.pk,
        "slot": run.slot or None,
        "logical_date": run.logical_date.isoformat() if run.logical_date else None,
        "started_at": _iso(run.started_at, tz),
        "finished_at": _iso(run.finished_at, tz),
        "outcome": run.outcome,
        "exit_code": run.exit_code,
        "duration": run.duration,
        "lag": run.lag,
        "host": run.host,
        "note": run.note,
    }


def to_json(report: Report) -> dict:
    """The `--json` document (schema in the README; `schema` bumps on incompatible changes)."""
    tz = report.tz
    return {
        "schema": SCHEMA_VERSION,
        "now": _iso(report.now, tz),
        "time_zone": str(tz),
        "healthy": report.healthy,
        "jobs": [
            {
                "job": s.job,
                "state": s.state,
                "reason": s.reason,
                "declared": s.declared,
                "schedule": s.schedule,
                "description": s.description,
                "next_fire": _iso(s.next_fire, tz),
                "grace_seconds": s.grace,
                "due_slot": s.due_slot,
                "last_success": _run_json(s.last_success, tz),
                "last_run": _run_json(s.last_run, tz),
                "last_duration": s.last_duration,
                "median_duration": s.median_duration,
                "median_of_runs": s.median_runs,
                "last_lag": s.last_lag,
                "consecutive_failures": s.consecutive_failures,
            }
            for s in report.jobs
        ],
    }


COLUMNS = (
    "JOB",
    "STATE",
    "SCHEDULE",
    "NEXT",
    "LAST SUCCESS",
    "LAST RUN",
    "DUR/MED",
    "LAG",
    "FAILS",
)


def table_rows(report: Report) -> list[tuple[str, ...]]:
    tz = report.tz
    rows = []
    for s in report.jobs:
        success = "-"
        if s.last_success is not None:
            success = _fmt_time(s.last_success.started_at, tz)
            if s.last_success.logical_date:
                success += f" ({s.last_success.logical_date.isoformat()})"
        last = "-"
        if s.last_run is not None:
            last = s.last_run.outcome.replace("_", " ")
            if s.last_run.exit_code is not None:
                last += f" ({s.last_run.exit_code})"
        duration = "-"
        if s.last_duration is not None:
            duration = f"{human_duration(s.last_duration)}/{human_duration(s.median_duration)}"
        rows.append(
            (
                s.job,
                s.state,
                s.schedule or "(ad hoc)",
                _fmt_time(s.next_fire, tz) if s.next_fire else "-",
                success,
                last,
                duration,
                human_duration(s.last_lag) if s.last_lag is not None else "-",
                str(s.consecutive_failures),
            )
        )
    return rows


def render_table(report: Report) -> str:
    rows = [COLUMNS, *table_rows(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    for s in report.jobs:
        if s.reason:
            lines.append(f"{s.job}: {s.state}: {s.reason}")
    return "\n".join(lines)
