"""Job status: per job, when it last succeeded, how late it started, and whether it needs a look.

`collect(now=...)` is the logic behind `manage.py job_status`; the clock is a parameter, never
read in here. Every lookup is per job and served by JobRun's indexes (`ops_run_job_started`,
`ops_run_job_outcome`) or SlotClaim's unique (job, slot), so the cost does not grow with the
size of the history; the lookups of all jobs go to the database together, a fixed number of
statements (the names, then at most four per 100 jobs) whatever the runs (`job_statuses`).

States, in order of precedence (the first that applies wins):

- ``never run``: the history has no attempt of the job (skips and runs taken over by another
  run do not count: the slot's outcome is the new holder's).
- ``running``: its latest attempt is still running and alive: its slot claim's heartbeat is
  fresh (or, for a run without a slot, its --timeout has not passed). A "running" row whose
  process died is treated as abandoned, i.e. a failure.
- ``failing``: its latest finished attempt failed, timed out, was terminated or abandoned, or
  was blocked by a failed upstream (--after). With --retries the latest attempt is the slot's
  last: a slot a retry fixed is ok.
- ``overdue``: the job has a schedule and its *due slot* has no success. The due slot is the
  most recent fire time S with ``S + grace <= now``; it counts as done when the slot's claim
  succeeded or the last success served S or a later slot (or, unslotted, started at or after S).
- ``ok``: otherwise.

A paused job (ops/control/pauses.py) is ``paused`` whatever the above says, unless a run is
still going (``running``, its reason naming the pause); a due slot whose fire time fell within
a pause is not overdue.

Grace is the job's ``--timeout`` when it has one, else ``OPS_DEFAULT_GRACE`` (default 1 hour),
and never less than 60 s: the same figure sync_healthchecks gives healthchecks.io.
"""

import datetime as dt
import os
import statistics
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.models import Count, Q

from .. import conf
from ..control import pauses
from ..models import JobPause, JobRun, Outcome, SlotClaim
from ..run import claims
from ..schedule.crontabd import Job, Schedule
from ..schedule.durations import human_duration
from ..schedule.slots import Slot, current_slot, next_fire, wall_clock
from .grace import grace_seconds

OK, RUNNING, FAILING, OVERDUE, NEVER_RUN = "ok", "running", "failing", "overdue", "never run"
PAUSED = "paused"
STATES = (OK, RUNNING, FAILING, OVERDUE, NEVER_RUN, PAUSED)
HEALTHY = {OK, RUNNING, PAUSED}
# A slot blocked by its failed upstream (--after) needs a look as much as a failure does.
FAILURES = (
    Outcome.FAILED,
    Outcome.TIMED_OUT,
    Outcome.TERMINATED,
    Outcome.ABANDONED,
    Outcome.BLOCKED,
)
# Not attempts of the job: a skip did nothing, and a run taken over (frozen or cut off from the
# database past 3 heartbeats) is not its slot's outcome: the run that took it over has that.
NOT_ATTEMPTS = (Outcome.SKIPPED, Outcome.TAKEN_OVER)
WINDOW = 20  # recent attempts read per job: medians and the failure streak come from these
CHUNK = 100  # jobs per statement: 300 compound terms, under SQLite's limit of 500

_RUN_FIELDS = (
    "id",
    "command",
    "task_result_id",
    "task_status",
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
    "attempt",
    "trigger",
    "started_by",
)


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
    due_slot: str | None = None  # the due slot's wall-clock time, "2026-11-29 03:00"
    last_run: JobRun | None = None
    last_success: JobRun | None = None
    last_duration: float | None = None
    median_duration: float | None = None
    median_runs: int = 0
    last_lag: float | None = None
    consecutive_failures: int = 0
    running_since: dt.datetime | None = None
    due_slot_key: str | None = None  # its claim key ("2026-11-29", "2026-11-29 03:15+01:00")
    due_at: dt.datetime | None = None  # its instant
    pause: JobPause | None = None  # the job's pause, while it lasts

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

    One statement: a recursive query that seeks the next name on the (job, ...) index, once
    per name, instead of a `SELECT DISTINCT` over the whole history (or one round trip per
    name, which on PostgreSQL costs a millisecond of driver and ORM work each).
    """
    q = connection.ops.quote_name
    table, job = q(model._meta.db_table), q("job")
    # Quoted names only, no value.
    sql = (
        f"WITH RECURSIVE names(name) AS ("  # noqa: S608
        f"SELECT (SELECT {job} FROM {table} ORDER BY {job} LIMIT 1) "
        f"UNION ALL SELECT (SELECT {job} FROM {table} WHERE {job} > names.name "
        f"ORDER BY {job} LIMIT 1) FROM names WHERE names.name IS NOT NULL) "
        "SELECT name FROM names WHERE name IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [row[0] for row in cursor.fetchall()]


def _chunks(items: list, size: int = CHUNK):
    for first in range(0, len(items), size):
        yield items[first : first + size]


Window = tuple[str, str, list]  # (kind, SQL condition and ORDER BY/LIMIT, its parameters)


def per_job_windows(
    names: list[str], columns: list[str], windows: list[Window]
) -> list[tuple[str, list]]:
    """The statements that read, for every job in `names`, each window of its runs: rows of
    `kind, *columns`, one statement (per CHUNK jobs on SQLite).

    Each window is one index range scan with its own LIMIT. On PostgreSQL a LATERAL join over
    the names; SQLite has no LATERAL: a UNION ALL of per-job subqueries. The ORM cannot say
    either. Each subquery's order is its own: the caller sorts again.
    """
    q = connection.ops.quote_name
    table, job = q(JobRun._meta.db_table), q("job")
    # Quoted names and the callers' constant conditions only; every value is a parameter.
    # Qualified: SQLite would read an unqualified "trigger" that is no column (a database not
    # migrated) as a string; qualified, both databases name the missing ops_ column.
    rows = f"{', '.join(f'{table}.{q(c)}' for c in columns)} FROM {table} WHERE {job} ="
    if connection.vendor == "postgresql":
        lateral = (
            "SELECT '{kind}' AS kind, t.* FROM unnest(%s::text[]) AS j(name) "  # noqa: S608
            f"CROSS JOIN LATERAL (SELECT {rows} j.name AND {{where}}) AS t"
        )
        sql = " UNION ALL ".join(lateral.format(kind=k, where=w) for k, w, _ in windows)
        return [(sql, [p for _, _, params in windows for p in (names, *params)])]
    statements = []
    for chunk in _chunks(names):
        parts, values = [], []
        for i, name in enumerate(chunk):
            for kind, where, params in windows:
                parts.append(
                    f"SELECT * FROM (SELECT '{kind}' AS kind, {rows} %s AND {where}) AS {kind}{i}"  # noqa: S608
                )
                values += [name, *params]
        statements.append((" UNION ALL ".join(parts), values))
    return statements


Latest = tuple[list[JobRun], JobRun | None, JobRun | None]


def _latest_runs(names: list[str]) -> dict[str, Latest]:
    """{job: (its last WINDOW attempts newest first, its last success to start, its success of
    the latest slot)} for every job in `names`: (job, -started_at), (job, outcome, -started_at)
    and (job, outcome, -scheduled_at) scans (`per_job_windows`), through `raw()`, which still
    converts the rows by the model's fields."""
    q = connection.ops.quote_name
    outcome, started, slot_at = q("outcome"), q("started_at"), q("scheduled_at")
    statements = per_job_windows(
        names,
        [*_RUN_FIELDS, "pid"],
        [
            (
                "r",
                f"{outcome} NOT IN (%s, %s) ORDER BY {started} DESC LIMIT {WINDOW}",
                [*NOT_ATTEMPTS],
            ),
            ("s", f"{outcome} = %s ORDER BY {started} DESC LIMIT 1", [Outcome.SUCCEEDED]),
            (
                "t",
                f"{outcome} = %s AND {slot_at} IS NOT NULL "
                f"ORDER BY {slot_at} DESC, {started} DESC LIMIT 1",  # the slot's latest success
                [Outcome.SUCCEEDED],
            ),
        ],
    )
    result: dict[str, Latest] = {n: ([], None, None) for n in names}
    for sql, params in statements:
        for run in JobRun.objects.raw(sql, params):
            runs, by_start, by_slot = result[run.job]
            if run.kind == "r":
                runs.append(run)
            elif run.kind == "s":
                result[run.job] = (runs, run, by_slot)
            else:
                result[run.job] = (runs, by_start, run)
    for runs, _, _ in result.values():  # each subquery's order is its own: sort again
        runs.sort(key=lambda r: (r.started_at, r.pk), reverse=True)
    return result


def latest_slot(by_start: JobRun | None, by_slot: JobRun | None) -> JobRun | None:
    """The last success as job_status shows it: the one that served the latest slot, whenever
    it ran (a past date run by hand after today's slot is not it); a run without a slot counts
    for its start."""
    if by_start is None or by_slot is None:
        return by_start or by_slot
    assert by_slot.scheduled_at is not None
    served = by_start.scheduled_at or by_start.started_at
    return by_start if served >= by_slot.scheduled_at else by_slot


def _failure_streak(recent: list[JobRun]) -> int | None:
    """Failed attempts in a row at the head of `recent`; None when every one of a full window
    failed (the whole streak is then counted on the index: `_long_streaks`)."""
    streak = 0
    for run in recent:
        if run.outcome == Outcome.RUNNING:
            continue
        if run.outcome not in FAILURES:
            return streak
        streak += 1
    return streak if len(recent) < WINDOW else None


def _long_streaks(since: dict[str, dt.datetime | None]) -> dict[str, int]:
    """{job: failures after `since[job]` (its last success, or ever)}: per job a count over the
    (job, outcome, -started_at) index, sent together as a UNION ALL, CHUNK jobs per statement.
    (One query ORing the jobs' ranges made SQLite scan the whole table.)"""
    counts = dict.fromkeys(since, 0)
    for chunk in _chunks(list(since)):
        parts = []
        for name in chunk:
            runs = JobRun.objects.filter(job=name, outcome__in=FAILURES)
            if since[name] is not None:
                runs = runs.filter(started_at__gt=since[name])
            parts.append(runs.values("job").annotate(n=Count("id")).order_by())
        # The combined query needs its own empty ordering: Django 6.1 applies the model's
        # Meta.ordering to it, which a values() union cannot sort by.
        rows = parts[0].union(*parts[1:], all=True).order_by() if len(parts) > 1 else parts[0]
        counts.update({row["job"]: row["n"] for row in rows})
    return counts


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


def _running_claims(runs: list[JobRun]) -> dict[int, SlotClaim]:
    """{run id: its slot's claim} for the runs recorded as running (one query)."""
    wanted = {run.pk: run for run in runs if run.outcome == Outcome.RUNNING and run.slot}
    if not wanted:
        return {}
    found = SlotClaim.objects.filter(run_id__in=list(wanted))
    return {
        c.run_id: c
        for c in found
        if c.run_id is not None
        and c.job == wanted[c.run_id].job
        and c.slot == wanted[c.run_id].slot
    }


def _alive(
    run: JobRun, claim: SlotClaim | None, job: Job | None, now: dt.datetime, heartbeat: float
) -> bool:
    """Whether a run recorded as running still has a live process behind it (`claim`: its
    slot's claim, from `_running_claims`)."""
    if run.slot:
        if claim is not None:
            # The claim's holder identity: this machine's process table, else the heartbeat.
            return claims.holder_alive(claim, now, claims.STALE_HEARTBEATS * heartbeat)
    if run.host == conf.host() and not _pid_alive(run.pid):
        return False  # an ad-hoc run (no claim) on a host of this name: the pid is gone
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


def _covered(slot: Slot, last_success: JobRun | None) -> bool:
    """Whether the last success served `slot` or a later one (no query)."""
    if last_success is None:
        return False
    assert slot.at is not None, "a slot of a schedule"
    if last_success.scheduled_at is not None and last_success.scheduled_at >= slot.at:
        return True
    return not last_success.slot and last_success.started_at >= slot.at


def _done_slots(due: dict[str, Slot]) -> set[str]:
    """The jobs of `due` ({job: its due slot}) whose slot's claim succeeded (a slot keyed by
    date also under another key of its logical date), in one query per CHUNK jobs."""
    done: set[str] = set()
    for chunk in _chunks(list(due)):
        which = Q()
        for name in chunk:
            slot = due[name]
            which |= Q(job=name, slot=slot.key)
            if slot.by_date:
                which |= Q(job=name, logical_date=slot.logical_date)
        rows = SlotClaim.objects.filter(which, state=Outcome.SUCCEEDED).values_list(
            "job", "slot", "logical_date"
        )
        for name, key, logical_date in rows:
            slot = due[name]
            if key == slot.key or (slot.by_date and logical_date == slot.logical_date):
                done.add(name)
    return done


def fmt_time(value: dt.datetime, tz: ZoneInfo) -> str:
    return value.astimezone(tz).strftime("%Y-%m-%d %H:%M")


def _due_slot(job: Job | None, now: dt.datetime, tz: ZoneInfo) -> Slot | None:
    """The most recent slot S of the job's schedule with S + grace <= now."""
    if job is None or not job.cron_expr:
        return None
    return current_slot(job.cron_expr, now - dt.timedelta(seconds=grace_seconds(job)), tz)


def job_statuses(
    jobs: list[tuple[str, Job | None]], *, now: dt.datetime, tz: ZoneInfo, heartbeat: float
) -> list[JobStatus]:
    """The status of each (name, declared job or None) of `jobs`, in that order.

    A fixed number of statements whatever the number of jobs (up to CHUNK) and of runs: the
    recent attempts and last success of every job together (`_latest_runs`), then, only for
    the jobs that need them, the full count of a failure streak longer than the window and
    the claims of due slots the last success does not cover, and the claims of the runs
    recorded as running (whose heartbeat says whether they are alive).
    """
    latest = _latest_runs([name for name, _ in jobs])
    window = {name: _failure_streak(latest[name][0]) for name, _ in jobs}
    long = _long_streaks(
        {
            name: (success.started_at if success is not None else None)
            for name, (_, success, _) in latest.items()
            if window[name] is None
        }
    )
    success = {name: latest_slot(s, t) for name, (_, s, t) in latest.items()}
    streaks = {name: long[name] if count is None else count for name, count in window.items()}
    due = {name: _due_slot(job, now, tz) for name, job in jobs}
    unsure = {
        name: slot
        for name, slot in due.items()
        if slot is not None and not _covered(slot, success[name])
    }
    done = _done_slots(unsure) if unsure else set()
    running = _running_claims([recent[0] for recent, _, _ in latest.values() if recent])
    return [
        _job_status(
            name,
            job,
            recent=latest[name][0],
            last_success=success[name],
            streak=streaks[name],
            due=due[name],
            due_done=due[name] is None or name in done or name not in unsure,
            claim=running.get(latest[name][0][0].pk) if latest[name][0] else None,
            now=now,
            tz=tz,
            heartbeat=heartbeat,
        )
        for name, job in jobs
    ]


def job_status(
    name: str, job: Job | None, *, now: dt.datetime, tz: ZoneInfo, heartbeat: float
) -> JobStatus:
    """The status of one job (`job_statuses` for one)."""
    return job_statuses([(name, job)], now=now, tz=tz, heartbeat=heartbeat)[0]


def _job_status(
    name: str,
    job: Job | None,
    *,
    recent: list[JobRun],
    last_success: JobRun | None,
    streak: int,
    due: Slot | None,
    due_done: bool,
    claim: SlotClaim | None,
    now: dt.datetime,
    tz: ZoneInfo,
    heartbeat: float,
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

    status.last_success = last_success
    status.last_run = recent[0] if recent else None
    durations = [
        r.duration for r in recent if r.outcome != Outcome.RUNNING and r.duration is not None
    ]
    if durations:
        status.last_duration = durations[0]
        status.median_duration = statistics.median(durations)
        status.median_runs = len(durations)
    status.last_lag = _last_lag(recent, expr, tz)
    status.consecutive_failures = streak

    if due is not None:
        status.due_slot = wall_clock(due, tz)
        status.due_slot_key, status.due_at = due.key, due.at
    latest = status.last_run
    if latest is None:
        from .armed import armed_note  # only for a job that never ran

        status.state, status.reason = NEVER_RUN, "no run in the history" + armed_note(job, now, tz)
        return status
    if latest.outcome == Outcome.RUNNING:
        if _alive(latest, claim, job, now, heartbeat):
            status.state = RUNNING
            status.running_since = latest.started_at
            status.reason = f"running since {fmt_time(latest.started_at, tz)} on {latest.host}"
            return status
        status.consecutive_failures += 1
        status.state = FAILING
        status.reason = (
            f"the run started {fmt_time(latest.started_at, tz)} on {latest.host} "
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
    if status.last_run is not None and status.last_run.task_result_id:
        from ..run.tasks import status_of  # only for an enqueued task: job_status stays lean

        task_status = status_of(status.last_run)
        status.reason = f"its last enqueued task: {task_status}"
        if task_status in ("FAILED", "gone"):  # enqueued once per slot: nothing retries it
            status.state = FAILING
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
        heartbeat = conf.heartbeat_seconds()
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
    for chunk in _chunks(names):
        report.jobs += job_statuses(
            [(name, declared.get(name)) for name in chunk], now=now, tz=tz, heartbeat=heartbeat
        )
    _paused(report)
    return report


def _paused(report: Report) -> None:
    """Pauses, in one query: a paused job is `paused` (a run still going stays `running`, its
    reason naming the pause); an overdue job whose due slot fell within a pause is `ok`."""
    late = [s.due_at for s in report.jobs if s.state == OVERDUE and s.due_at is not None]
    found = JobPause.objects.filter(job__in=[s.job for s in report.jobs])
    found = found.filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=min(late)) if late else Q(ended_at__isnull=True)
    )
    spans: dict[str, list] = {}
    for pause in found.order_by("since"):
        spans.setdefault(pause.job, []).append(pause)
    for s in report.jobs:
        mine = spans.get(s.job, [])
        current = next((p for p in mine if pauses.is_active(p, report.now)), None)
        if current is not None:
            s.pause = current
            text = pauses.describe(current, report.tz)
            if s.state == RUNNING:
                s.reason += f"; paused {text}"
            else:
                s.state, s.reason = PAUSED, text
        elif s.state == OVERDUE and pauses.within(
            s.due_at, [(p.since, pauses.end_of(p)) for p in mine]
        ):
            s.state, s.reason = OK, f"its due slot {s.due_slot} was paused"
