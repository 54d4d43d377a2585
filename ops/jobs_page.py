"""What the admin's jobs page draws: per job, its status (from `status.collect`, the code behind
`job_status`), a strip of its recent attempts, a sparkline of its recent durations, and a
calendar of its logical dates.

Everything is computed and drawn here, on the server, as plain HTML and inline SVG: no
JavaScript, nothing fetched from elsewhere (an admin on a box without internet works). Every
query is an index range scan of JobRun with a limit or a 90-day window, so the page costs the
same on a long history as on a short one (`bench/bench_jobs_page.py`).
"""

import datetime as dt
import statistics
from dataclasses import dataclass, field
from html import escape
from zoneinfo import ZoneInfo

from cronsim import CronSim
from django.db import connection
from django.db.models import Count, F
from django.db.models.functions import Coalesce, TruncDate
from django.urls import reverse
from django.utils import dateparse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from .control import pauses
from .models import JobRun, Outcome
from .monitors import status
from .monitors.status_render import success_words
from .schedule.crontabd import Job
from .schedule.durations import human_duration

STRIP = 30  # attempts in the strip
SPARK = 30  # successes in the sparkline
CALENDAR_DAYS = 90

# One colour per outcome and per state; the legend and the tests read the same table.
OUTCOME_COLOURS = {
    Outcome.SUCCEEDED: "#1a7f37",
    Outcome.FAILED: "#cf222e",
    Outcome.TIMED_OUT: "#bc4c00",
    Outcome.TERMINATED: "#8250df",
    Outcome.ABANDONED: "#82071e",
    Outcome.RUNNING: "#0969da",
    Outcome.SKIPPED: "#8c959f",
    Outcome.TAKEN_OVER: "#bf8700",  # not the slot's outcome: another run took it over
    Outcome.WAITING: "#54aeff",  # --after: its upstream had not succeeded yet
    Outcome.BLOCKED: "#a40e26",  # --after: its upstream failed for that date
}
STATE_COLOURS = {
    status.OK: "#1a7f37",
    status.RUNNING: "#0969da",
    status.FAILING: "#cf222e",
    status.OVERDUE: "#bc4c00",
    status.NEVER_RUN: "#6e7781",
    status.PAUSED: "#57606a",
}
# Calendar days
SERVED, FAILED, SKIPPED, MISSING, IN_PROGRESS, NOTHING_DUE, NO_HISTORY, PAUSED = (
    "served",
    "failed",
    "skipped",
    "missing",
    "in progress",
    "nothing due",
    "before history",
    "paused",
)
RUN_AGAIN = (FAILED, MISSING, SKIPPED)  # the days the page offers to run again
DAY_COLOURS = {
    SERVED: "#1a7f37",
    FAILED: "#cf222e",
    SKIPPED: "#8c959f",
    MISSING: "#fb8f44",
    IN_PROGRESS: "#0969da",
    NOTHING_DUE: "#eaeef2",
    NO_HISTORY: "#ffffff",
    PAUSED: "#afb8c1",
}


# The page's order: what needs a look first (job_status's order within each state).
PROBLEMS_FIRST = (
    status.FAILING,
    status.OVERDUE,
    status.NEVER_RUN,
    status.RUNNING,
    status.PAUSED,
    status.OK,
)


def problems_first(rows: list["JobRow"]) -> list["JobRow"]:
    return sorted(rows, key=lambda row: PROBLEMS_FIRST.index(row.status.state))


def summary(rows: list["JobRow"]) -> str:
    """How many jobs are in each state, problems first: "1 failing · 1 overdue · 4 ok"."""
    counts = {state: 0 for state in PROBLEMS_FIRST}
    for row in rows:
        counts[row.status.state] += 1
    return " · ".join(f"{n} {state}" for state, n in counts.items() if n)


def local_time(value: dt.datetime | None, tz: ZoneInfo) -> str:
    return value.astimezone(tz).strftime("%Y-%m-%d %H:%M") if value is not None else "-"


@dataclass
class JobRow:
    status: status.JobStatus
    colour: str
    next_fire: str
    last_success: str
    lag: str
    strip: str  # HTML: one mark per attempt, oldest first
    marks: int
    sparkline: str  # HTML: inline SVG, or "" without a success
    successes: int


def _parse_time(value) -> dt.datetime:
    """A datetime from a raw cursor: PostgreSQL gives it aware; SQLite gives the text Django
    stored (UTC, naive) because a UNION's columns have no declared type to convert by."""
    if isinstance(value, str):
        value = dateparse.parse_datetime(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def latest_runs(names: list[str]) -> dict[str, tuple[list[tuple], list[float]]]:
    """{job: (last STRIP attempts newest first as (id, slot, outcome, exit code, duration,
    started, attempt number), last SPARK success durations newest first)} for every job in `names`.

    Two small index range scans per job ((job, -started_at) and (job, outcome, -started_at)),
    sent together (`status.per_job_windows`): one ORM query per job and picture would cost more
    in Python than in the database.
    """
    q = connection.ops.quote_name
    outcome, started, duration = q("outcome"), q("started_at"), q("duration")
    statements = status.per_job_windows(
        names,
        ["job", "id", "slot", "outcome", "exit_code", "duration", "started_at", "attempt"],
        [
            ("s", f"{outcome} <> %s ORDER BY {started} DESC LIMIT {STRIP}", [Outcome.SKIPPED]),
            (
                "d",
                f"{outcome} = %s AND {duration} IS NOT NULL ORDER BY {started} DESC LIMIT {SPARK}",
                [Outcome.SUCCEEDED],
            ),
        ],
    )
    result: dict[str, tuple[list[tuple], list[float]]] = {n: ([], []) for n in names}
    for sql, params in statements:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        for kind, name, pk, slot, out, code, took, started_at, attempt in rows:
            attempts, durations = result[name]
            if kind == "s":
                attempts.append((pk, slot, out, code, took, _parse_time(started_at), attempt))
            else:
                durations.append(took)
    for attempts, _ in result.values():  # each subquery's order is its own: sort again
        attempts.sort(key=lambda a: (a[5], a[0]), reverse=True)
    return result


def strip_html(attempts: list[tuple], tz: ZoneInfo, run_url: str) -> str:
    """One mark per attempt, oldest first: a link to the run, its colour its outcome, its
    title (shown on hover) the slot, outcome, exit code and duration, and which attempt it was
    when the slot was retried (--retries).

    Plain string building with html.escape: 1,500 marks through format_html cost more than
    every query of the page together."""
    marks = []
    for pk, slot, outcome, code, duration, started_at, attempt in reversed(attempts):
        title = f"slot {slot}" if slot else f"started {local_time(started_at, tz)}"
        if attempt and attempt > 1:
            title += f" · attempt {attempt}"
        title += " · " + outcome.replace("_", " ")
        if code is not None:
            title += f" · exit {code}"
        if duration is not None:
            title += " · " + human_duration(duration)
        colour = OUTCOME_COLOURS.get(outcome, OUTCOME_COLOURS[Outcome.FAILED])
        marks.append(
            f'<a class="cronops-mark" data-outcome="{escape(outcome)}" '
            f'style="background-color:{colour}" title="{escape(title)}" '
            f'href="{run_url}{int(pk)}/change/"></a>'
        )
    return mark_safe("".join(marks))  # noqa: S308 (every value above is escaped or an int)


def sparkline(durations: list[float], width: int = 120, height: int = 28) -> str:
    """Inline SVG: a polyline of `durations` (oldest first) scaled to the box, the median as a
    dashed line, the latest as a dot; "" without durations.

    The page stretches it to the width of the attempt bars above it (_style.html): the line
    and the median are drawn in a `width` x `height` box scaled to fit (their strokes keep their
    width), the dot is placed in percent of the width (it stays round)."""
    if not durations:
        return ""
    pad = 3.0
    top = max(durations) or 1.0
    span_x = width - 2 * pad
    span_y = height - 2 * pad

    def y(value: float) -> float:
        return round(height - pad - value / top * span_y, 1)

    if len(durations) == 1:
        xs = [width / 2]
    else:
        xs = [round(pad + i * span_x / (len(durations) - 1), 1) for i in range(len(durations))]
    points = [(x, y(d)) for x, d in zip(xs, durations, strict=True)]
    median = statistics.median(durations)
    title = (
        f"last {len(durations)} successes: {human_duration(min(durations))} to "
        f"{human_duration(max(durations))}, median {human_duration(median)}"
    )
    return format_html(
        '<svg class="cronops-spark" width="{w}" height="{h}" role="img" aria-label="{t}" '
        'data-count="{n}"><title>{t}</title>'
        '<svg width="100%" height="100%" viewBox="0 0 {w} {h}" preserveAspectRatio="none">'
        '<line class="cronops-median" x1="0" x2="{w}" y1="{m}" y2="{m}" '
        'vector-effect="non-scaling-stroke"></line>'
        '<polyline points="{p}" vector-effect="non-scaling-stroke"></polyline></svg>'
        '<circle cx="{lx}%" cy="{ly}" r="2"></circle></svg>',
        w=width,
        h=height,
        t=title,
        n=len(durations),
        m=y(median),
        p=" ".join(f"{x},{yy}" for x, yy in points),
        lx=round(points[-1][0] / width * 100, 2),
        ly=points[-1][1],
    )


def job_rows(report: status.Report) -> list[JobRow]:
    """One row per job of the report (its order: crontab.d, then ad-hoc jobs)."""
    tz = report.tz
    run_url = reverse("admin:ops_jobrun_changelist")
    latest = latest_runs([s.job for s in report.jobs])
    rows = []
    for s in report.jobs:
        attempts, durations = latest[s.job]
        if attempts and attempts[0][2] == Outcome.RUNNING and s.state != status.RUNNING:
            # job_status found the newest "running" one dead: the strip says so too.
            attempts = [(*attempts[0][:2], Outcome.ABANDONED, *attempts[0][3:]), *attempts[1:]]
        success = success_words(s.last_success, s.grace, tz)
        rows.append(
            JobRow(
                status=s,
                colour=STATE_COLOURS[s.state],
                next_fire=local_time(s.next_fire, tz) if s.next_fire else "-",
                last_success=success,
                lag=human_duration(s.last_lag) if s.last_lag is not None else "-",
                strip=strip_html(attempts, tz, run_url),
                marks=len(attempts),
                sparkline=sparkline(list(reversed(durations))),
                successes=len(durations),
            )
        )
    return rows


# --- the calendar ---------------------------------------------------------------------------


@dataclass
class Day:
    date: dt.date
    state: str
    colour: str
    title: str
    due: int = 0
    served: int = 0
    url: str = ""  # its runs in the history (the JobRun admin, filtered)


@dataclass
class DayCounts:
    runs: dict[str, int] = field(default_factory=dict)  # outcome -> attempts
    served_slots: int = 0


def _local_midnight(day: dt.date, tz: ZoneInfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(0, 0), tzinfo=tz)


def _enumerate_fires(expr: str, start: dt.datetime, end: dt.datetime, tz: ZoneInfo) -> int:
    """Fire times of `expr` in [start, end) (cronsim: Debian cron's DST rules)."""
    count = 0
    for fire in CronSim(expr, start.astimezone(tz) - dt.timedelta(minutes=1)):
        if fire >= end:
            return count
        if fire >= start:
            count += 1
    return count


def due_slots(expr: str, day: dt.date, start: dt.datetime, end: dt.datetime, tz: ZoneInfo) -> int:
    """How many slots of `expr` fall on `day` within [start, end).

    A whole ordinary day is counted from the fields (minutes times hours when the day matches), so
    a minutely job's 90 days cost 90 sums, not 129,600 fire times; a day cut by `start`/`end`
    or with a DST change is counted fire by fire.
    """
    midnight = _local_midnight(day, tz)
    next_midnight = _local_midnight(day + dt.timedelta(days=1), tz)
    lo, hi = max(start, midnight), min(end, next_midnight)
    if lo >= hi:
        return 0
    whole = lo == midnight and hi == next_midnight
    same_offset = midnight.utcoffset() == (next_midnight - dt.timedelta(seconds=1)).utcoffset()
    if not (whole and same_offset):
        return _enumerate_fires(expr, lo, hi, tz)
    sim = CronSim(expr, midnight)
    if day.month not in sim.months or not sim.match_day(day):
        return 0
    return len(sim.minutes) * len(sim.hours) * len(sim.seconds)


def _day_counts(name: str, first_day: dt.date, since: dt.datetime, tz: ZoneInfo) -> dict:
    """{date: DayCounts}: attempts per outcome and served slots, per logical date.

    Runs without a logical date (ad-hoc runs) count on the day they started, in TIME_ZONE.
    One grouped query over the job's runs of the window, on the (job, -started_at) index.
    """
    rows = (
        JobRun.objects.filter(job=name, started_at__gte=since)
        .annotate(day=Coalesce(F("logical_date"), TruncDate("started_at", tzinfo=tz)))
        .filter(day__gte=first_day)
        .values("day", "outcome")
        .annotate(runs=Count("id"), slots=Count("slot", distinct=True))
        .order_by()
    )
    days: dict[dt.date, DayCounts] = {}
    for row in rows:
        counts = days.setdefault(row["day"], DayCounts())
        counts.runs[row["outcome"]] = row["runs"]
        if row["outcome"] == Outcome.SUCCEEDED:
            counts.served_slots = row["slots"]
    return days


def calendar(
    s: status.JobStatus, job: Job | None, *, now: dt.datetime, tz: ZoneInfo, days: int = 90
) -> list[Day]:
    """The last `days` logical dates of the job, oldest first, each with its state.

    served: every due slot of the day has a success; failed / skipped: some due slot has none
    and the day saw a failed attempt / only skips; missing: a due slot with no success and no
    attempt at all; in progress: the job's live run serves that day; paused: a fire time of the
    day without success fell within a pause; nothing due: no slot that day (or not yet due: a
    slot counts once its grace has passed, as for `overdue`); before history: before the job's
    first recorded run.
    """
    today = now.astimezone(tz).date()
    first_day = today - dt.timedelta(days=days - 1)
    since = _local_midnight(first_day, tz)
    counts = _day_counts(s.job, first_day, since, tz)
    expr = job.cron_expr if job is not None else None
    first_run = (
        JobRun.objects.filter(job=s.job).order_by("started_at").values_list("started_at", flat=True)
    ).first()
    history_from = first_run if first_run is not None else now
    # Slots count once due, like `overdue`: a slot S is due when S + grace <= now.
    due_until = now - dt.timedelta(seconds=s.grace or 0)
    spans = pauses.windows(s.job, since)
    live_day = None
    if s.state == status.RUNNING and s.last_run is not None:
        live_day = s.last_run.logical_date or s.last_run.started_at.astimezone(tz).date()

    result = []
    for offset in range(days):
        day = first_day + dt.timedelta(days=offset)
        c = counts.get(day, DayCounts())
        due = 0
        if expr:
            start = max(_local_midnight(day, tz), history_from.replace(second=0, microsecond=0))
            due = due_slots(expr, day, start, due_until, tz)
        attempts = sum(n for o, n in c.runs.items() if o not in status.NOT_ATTEMPTS)
        failures = attempts - c.runs.get(Outcome.SUCCEEDED, 0)  # a dead "running" one counts
        if day == live_day:
            state = IN_PROGRESS
        elif due and c.served_slots >= due:
            state = SERVED
        elif due:
            if failures > 0:
                state = FAILED
            elif spans and _paused_fire(expr, day, spans, tz):
                state = PAUSED
            elif c.runs.get(Outcome.SKIPPED):
                state = SKIPPED
            else:
                state = MISSING
        elif c.served_slots:
            state = SERVED
        elif failures > 0:
            state = FAILED
        elif c.runs.get(Outcome.SKIPPED):
            state = SKIPPED
        elif _local_midnight(day + dt.timedelta(days=1), tz) <= history_from:
            state = NO_HISTORY
        else:
            state = NOTHING_DUE
        title = f"{day.isoformat()}: {state}"
        if due:
            title += f", {min(c.served_slots, due)} of {due} slots served"
        if c.runs:
            title += ", " + ", ".join(
                f"{n} {o.replace('_', ' ')}" for o, n in sorted(c.runs.items()) if n
            )
        result.append(
            Day(
                date=day,
                state=state,
                colour=DAY_COLOURS[state],
                title=title,
                due=due,
                served=c.served_slots,
            )
        )
    return result


def _paused_fire(expr, day: dt.date, spans: list, tz: ZoneInfo) -> bool:
    """Whether a fire time of `expr` on `day` fell within a pause (`spans`: (start, end))."""
    start, end = _local_midnight(day, tz), _local_midnight(day + dt.timedelta(days=1), tz)
    if not any(s < end and (e is None or e > start) for s, e in spans):
        return False
    for fire in CronSim(expr, start.astimezone(tz) - dt.timedelta(minutes=1)):
        if fire >= end:
            return False
        if fire >= start and pauses.within(fire, spans):
            return True
    return False


def weeks(days: list[Day]) -> list[dict]:
    """The days laid out Monday to Sunday: [{"start": first date, "days": 7 cells}], a cell
    None before the first day and after the last."""
    if not days:
        return []
    cells: list[Day | None] = [None] * days[0].date.weekday() + list(days)
    cells += [None] * (-len(cells) % 7)
    rows = []
    for i in range(0, len(cells), 7):
        week = cells[i : i + 7]
        rows.append({"start": next(d.date for d in week if d is not None), "days": week})
    return rows
