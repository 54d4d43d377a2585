"""What `manage.py job_status` prints of a status report (ops/monitors/status.py): the `--json`
document and the table.
"""

import datetime as dt
from zoneinfo import ZoneInfo

from ..models import JobRun
from ..schedule.durations import human_duration
from .status import JobStatus, Report, fmt_time

SCHEMA_VERSION = 1


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
        # how it was started (ops/run/origin.py): null on runs recorded before it was kept
        "trigger": run.trigger or None,
        "started_by": run.started_by,
        "started_how": run.started_how,
        **(_task_json(run) if run.task_result_id else {}),
    }


def _task_json(run: JobRun) -> dict:
    from ..run.tasks import status_of

    return {"task": {"id": run.task_result_id, "status": status_of(run)}}


def _pause_json(s: JobStatus, tz: ZoneInfo) -> dict | None:
    pause = s.pause
    if pause is None:
        return None
    return {
        "by": pause.paused_by,
        "since": _iso(pause.since, tz),
        "until": _iso(pause.until, tz),
        "reason": pause.reason,
    }


def to_json(report: Report) -> dict:
    """The `--json` document (schema: docs/operating.md; `schema` bumps when a field changes)."""
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
                "paused": _pause_json(s, tz),
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


def success_words(run: JobRun | None, grace: float | None, tz: ZoneInfo) -> str:
    """The last success as an operator reads it: the slot it served ("2026-11-29 03:00 slot",
    whose date is the logical date), and when it ran if that was later than the job's grace
    (a past date run by hand: "2026-01-15 03:00 slot, ran 2026-12-02 07:47"), so that a
    late by-hand run never reads as the job's latest day. A run without a slot: its start."""
    if run is None:
        return "-"
    ran = fmt_time(run.started_at, tz)
    if run.scheduled_at is not None:
        served = f"{fmt_time(run.scheduled_at, tz)} slot"
        late = (run.started_at - run.scheduled_at).total_seconds()
    elif run.logical_date is not None:
        served = f"{run.logical_date.isoformat()} slot"
        late = None  # an unscheduled command's date: no fire time to be late for
    else:
        return ran
    if late is None or late > (grace or 0):
        return f"{served}, ran {ran}"
    return served


def table_rows(report: Report) -> list[tuple[str, ...]]:
    tz = report.tz
    rows: list[tuple[str, ...]] = []
    for s in report.jobs:
        success = success_words(s.last_success, s.grace, tz)
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
                fmt_time(s.next_fire, tz) if s.next_fire else "-",
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
