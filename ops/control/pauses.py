"""Pausing a job: `job_pause NAME [--until=WHEN] [--reason=TEXT]`, `job_resume NAME`, the jobs page.

While a pause lasts, every run_job of the job (a cron fire, a run by hand, Run now) runs
nothing: it records its slot as a skip with the pause's reason (one row per slot, however many
fires, servers or retries meet it: a unique index, ops.models.JobRun `paused`), pings `/log` and
exits 0. A pause ends by `job_resume`, or by itself at `--until`: the job's first run_job after
that time ends it (cron is the only scheduler: nothing else runs then), writes the audit row and
resumes the job's healthchecks.io check (ops/monitors/hcpause.py) before the job runs.

Pauses are kept once ended: catch-up never replays a slot whose fire time fell inside a pause,
nor one whose fire was refused by a pause (`paused_keys`), and job_status does not call such a
due slot overdue.

--until's spellings: ops/control/until.py.
"""

import contextlib
import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar
from zoneinfo import ZoneInfo

from django.db import IntegrityError, transaction
from django.db.models import Q

from ..models import JobAction, JobPause, JobRun
from ..schedule.crontabd import Job
from ..schedule.slots import Slot
from . import actions

if TYPE_CHECKING:  # the healthchecks.io client (requests) is imported only when it is used
    from ..monitors.hcpause import CheckResult

T = TypeVar("T")
# How a write of this module is made: `direct`, or patiently (ops/run/patience.py).
Write = Callable[[Callable[[], T]], T]


def local(value: dt.datetime, tz: ZoneInfo) -> str:
    """`value` in `tz`, normalised (through UTC: a wall-clock time a DST gap skips, say
    02:30 in Berlin on 2027-03-28, shows as the instant it is, 03:30)."""
    return value.astimezone(dt.UTC).astimezone(tz).strftime("%Y-%m-%d %H:%M")


def describe(pause: JobPause, tz: ZoneInfo) -> str:
    """`by alice since 2026-12-01 10:00 until 2026-12-05 12:00 UTC: database migration`, or
    `by alice since 2026-12-01 10:00 UTC, until resumed: …`."""
    text = f"by {pause.paused_by} since {local(pause.since, tz)}"
    text += f" until {local(pause.until, tz)} {tz}" if pause.until else f" {tz}, until resumed"
    return text + (f": {pause.reason}" if pause.reason else "")


def is_active(pause: JobPause, now: dt.datetime) -> bool:
    return pause.ended_at is None and (pause.until is None or pause.until > now)


def end_of(pause: JobPause) -> dt.datetime | None:
    """When the pause ended or ends (None: not before job_resume)."""
    return pause.ended_at or pause.until


def open_pause(name: str) -> JobPause | None:
    return JobPause.objects.filter(job=name, ended_at__isnull=True).first()


def active_pauses(names: list[str], now: dt.datetime) -> dict[str, JobPause]:
    """{job: its pause} for the jobs of `names` paused at `now` (one query)."""
    rows = JobPause.objects.filter(job__in=names, ended_at__isnull=True)
    return {p.job: p for p in rows if is_active(p, now)}


def windows(name: str, since: dt.datetime) -> list[tuple[dt.datetime, dt.datetime | None]]:
    """The job's pauses that had not ended by `since`, as (start, end or None)."""
    rows = JobPause.objects.filter(job=name).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=since)
    )
    return [(p.since, end_of(p)) for p in rows.order_by("since")]


def within(at: dt.datetime | None, spans: list[tuple[dt.datetime, dt.datetime | None]]) -> bool:
    return at is not None and any(s <= at and (e is None or at < e) for s, e in spans)


def paused_keys(name: str, slots: list[Slot]) -> set[str]:
    """The keys of `slots` that a pause covered: the fire time within one, or a fire of that
    slot refused by one. Catch-up never replays those (ops/run/plan.py)."""
    if not slots:
        return set()
    instants = [s.at for s in slots if s.at is not None]
    spans = windows(name, min(instants)) if instants else []
    keys = {s.key for s in slots if within(s.at, spans)}
    refused = JobRun.objects.filter(job=name, paused=True, slot__in=[s.key for s in slots])
    return keys | set(refused.values_list("slot", flat=True))


# --- pause and resume: job_pause, job_resume, the jobs page ---------------------------------


class UnknownJob(LookupError):
    pass


def lookup(name: str) -> Job | None:
    """The job `name` as crontab.d declares it (None: seen in the history only); UnknownJob when
    it is neither. A crontab.d with errors elsewhere still gives the jobs whose lines are valid."""
    from ..schedule.crontabd import CrontabError, load_jobs_leniently, load_schedule

    try:
        job = load_schedule().get(name)
    except CrontabError:
        job = load_jobs_leniently().get(name)
    if job is None and not (
        JobRun.objects.filter(job=name).exists() or JobPause.objects.filter(job=name).exists()
    ):
        raise UnknownJob(f"no job named {name!r} in crontab.d or in the run history")
    return job


def direct(write: "Callable[[], T]") -> T:
    """A write as it is (the web views); job_pause, job_resume and run_job pass a patient one
    (ops/run/patience.py): another writer's lock is waited for within a bound."""
    return write()


def patient_command_write(stderr) -> "Write":
    """job_pause's and job_resume's writes: another writer's lock (SQLite's one writer, a
    PostgreSQL lock) waited for up to LOCK_WAIT, said after a few seconds, not a 30 s error."""
    import time

    from ..run import patience
    from ..schedule.durations import human_duration

    def waiting(reason: str, bound: float) -> None:
        stderr.write(f"{reason}; waiting for it (at most {human_duration(bound)})\n")

    def write(fn):
        return patience.patiently(fn, sleep=time.sleep, waiting=waiting)

    return write


@contextlib.contextmanager
def command_database_errors():
    """job_pause's and job_resume's database errors as one line and exit 2: a writer that held
    the database past the bound, or a database that is down or not migrated."""
    from django.core.management.base import CommandError
    from django.db import DatabaseError

    from .. import schema
    from ..run import patience

    try:
        yield
    except patience.Locked as exc:
        raise CommandError(f"database unavailable: {exc}", returncode=2) from None
    except DatabaseError as exc:
        message = schema.explained(exc) or f"database unavailable: {schema.first_line(exc)}"
        raise CommandError(message, returncode=2) from None


def _begin() -> None:
    from ..run import patience

    patience.in_transaction()  # under patiently(): a lock wait ends and is tried again


def pause(
    name: str,
    job: Job | None,
    *,
    by: str,
    until: dt.datetime | None,
    reason: str,
    now: dt.datetime,
    tz: ZoneInfo,
    write: "Write" = direct,
) -> "tuple[JobPause, CheckResult | None]":
    """Pause `name` (or change the until and reason of its pause): (the pause, what happened to
    its healthchecks.io check, None when this or an earlier pause holds it paused already). A
    pause whose check could not be paused tries again (pausing a paused check is no error)."""
    reason = " ".join(reason.split())[:300]
    shown = f"until {local(until, tz)} {tz}" if until else "until resumed"

    def change() -> tuple[JobPause, bool]:
        """(the pause, whether its check is to be paused now): one transaction."""
        with transaction.atomic():
            _begin()
            current = open_pause(name)
            if current is not None and not is_active(current, now):
                _end_now(current, now, "", tz)  # its --until passed and no fire has ended it
                current = None
            if current is not None:
                current.until, current.reason = until, reason or current.reason
                current.save(update_fields=["until", "reason"])
                actions.record(
                    JobAction.Kind.PAUSE, name, by, now, note=f"changed: {shown}: {reason}"
                )
                # Its check not paused (the server could not be reached, or there is no check
                # to pause): tried again. Pausing a paused check is no error there.
                return current, not current.check_paused
            row = JobPause.objects.create(
                job=name, paused_by=by[:150], since=now, until=until, reason=reason
            )
            actions.record(JobAction.Kind.PAUSE, name, by, now, note=f"{shown}: {reason}")
            owed = JobPause.objects.filter(job=name, check_paused=True).exclude(pk=row.pk)
            held = owed.first()
            if held is not None:  # its check is still paused from an earlier pause: so kept
                owed.update(check_paused=False)
                row.check_uuid, row.check_paused = held.check_uuid, True
                row.check_manual_resume, row.check_note = held.check_manual_resume, held.check_note
                row.save()
                return row, False
            return row, True

    try:
        row, to_pause = write(change)
    except IntegrityError:  # paused by someone else at this very moment: theirs stands
        current = open_pause(name)
        assert current is not None, "the pause that made ours a duplicate"
        return current, None
    if not to_pause:
        return row, None
    from ..monitors import hcpause

    result = hcpause.pause_check(name, job)
    row.check_uuid, row.check_paused = result.uuid or row.check_uuid, result.paused
    if result.manual_resume is not None:  # else kept: an earlier try set manual_resume already
        row.check_manual_resume = result.manual_resume
    row.check_note = result.note[:300]
    write(
        lambda: row.save(
            update_fields=["check_uuid", "check_paused", "check_manual_resume", "check_note"]
        )
    )
    return row, result


def _end(
    pause: JobPause, now: dt.datetime, by: str = "", *, tz: ZoneInfo, write: "Write" = direct
) -> bool:
    """End an open pause: at its --until when that has passed (`by` empty), else now."""

    def end() -> bool:
        with transaction.atomic():
            _begin()
            return _end_now(pause, now, by, tz)

    return write(end)


def _end_now(pause: JobPause, now: dt.datetime, by: str, tz: ZoneInfo) -> bool:
    expired = pause.until is not None and pause.until <= now
    ended_at, ended_by = (pause.until, actions.UNTIL) if expired or not by else (now, by)
    won = JobPause.objects.filter(pk=pause.pk, ended_at__isnull=True).update(
        ended_at=ended_at, ended_by=ended_by
    )
    if won:
        pause.ended_at, pause.ended_by = ended_at, ended_by
        what = "ended at its --until" if ended_by == actions.UNTIL else "resumed"
        note = f"the pause by {pause.paused_by} since {local(pause.since, tz)} {tz} {what}"
        actions.record(JobAction.Kind.RESUME, pause.job, ended_by, now, note=note)
    return bool(won)


def resume(
    name: str,
    job: Job | None,
    *,
    by: str,
    now: dt.datetime,
    tz: ZoneInfo,
    write: "Write" = direct,
) -> "tuple[JobPause | None, CheckResult | None]":
    """End the job's pause: (the pause it ended or None, what happened to its check or None)."""
    current = open_pause(name)
    ended = current if current is not None and _end(current, now, by, tz=tz, write=write) else None
    owed = JobPause.objects.filter(job=name, check_paused=True).order_by("-since").first()
    if owed is None and ended is not None and ended.check_manual_resume is False:
        owed = ended  # its check was never paused, but manual_resume was set: give it back
    if owed is None:
        return ended, None
    note = f"resumed by {by}" if by != actions.UNTIL else "resumed at the end of its pause"
    return ended, resume_check(owed, job, now=now, tz=tz, arming_note=note, write=write)


def resume_check(
    pause: JobPause,
    job: Job | None,
    *,
    now: dt.datetime,
    tz: ZoneInfo,
    arming_note: str,
    write: "Write" = direct,
) -> "CheckResult | None":
    """Resume the check `pause` holds paused on healthchecks.io (once, whoever asks first)."""
    from ..monitors import hcpause

    if not write(
        lambda: (
            JobPause.objects.filter(pk=pause.pk)
            .filter(Q(check_paused=True) | Q(check_manual_resume=False))
            .update(check_paused=False, check_manual_resume=None)
        )
    ):
        return None  # another process resumed it first
    result = hcpause.resume_check(
        pause.job,
        job,
        uuid=pause.check_uuid,
        paused=pause.check_paused,
        manual_resume=pause.check_manual_resume,
        tz=tz,
        now=now,
        arming_note=arming_note,
    )
    fields: dict = {"check_note": result.note[:300]}
    if not result.ok:  # still owed: the next resume (or fire) tries again
        fields |= {"check_paused": result.paused, "check_manual_resume": result.manual_resume}
    write(lambda: JobPause.objects.filter(pk=pause.pk).update(**fields))
    return result


# --- run_job's side (ops/run/runner.py) -------------------------------------------------------


def at_fire(runner, now: dt.datetime) -> int | None:
    """Before a run_job takes its lock: its exit code when the job is paused (the fire is
    recorded as a skip of its slot), else None (run; a pause whose --until has passed is ended
    first, and its healthchecks.io check resumed). One query when the job is not paused."""
    from django.conf import settings

    name = runner.plan.name
    if not _held(name):
        return None
    row = (
        JobPause.objects.filter(job=name)
        .filter(Q(ended_at__isnull=True) | Q(check_paused=True))
        .order_by("-since")
        .first()
    )
    if row is None:
        return None
    tz = ZoneInfo(settings.TIME_ZONE)

    def write(fn):  # run_job's patient writes: a SIGTERM ends the wait (Interrupted)
        return runner.write(fn, interruptible=True)

    if is_active(row, now):
        return _refuse(runner, row, now, tz, write)
    from ..run.plan import say

    if row.ended_at is None and _end(row, now, tz=tz, write=write):
        say(f"job {name}: the pause {describe(row, tz)} has ended", runner.stdout)
    if row.check_paused:
        result = resume_check(
            row,
            runner.plan.job,
            now=now,
            tz=tz,
            arming_note="resumed at the end of its pause",
            write=write,
        )
        if result is not None:
            stream = runner.stdout if result.ok else runner.stderr
            say(f"job {name}: healthchecks.io: {result.note}", stream)
    return None


def _held(name: str) -> bool:
    """Whether job `name` has a pause that is open or still holds its check paused: the question
    of every fire, asked in one written statement (~0.3 M instructions; the ORM's query for the
    row, ~3.5 M, only when there is one)."""
    from django.db import connections, router

    from ..schema import quoted

    connection = connections[router.db_for_read(JobPause)]
    table, job, ended, check = quoted(connection, JobPause, "job", "ended_at", "check_paused")
    sql = (
        f"SELECT 1 FROM {table} WHERE {job} = %s AND ({ended} IS NULL OR {check} = %s) "  # noqa: S608
        "LIMIT 1"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [name, True])
        return cursor.fetchone() is not None


def _refuse(runner, pause: JobPause, now: dt.datetime, tz: ZoneInfo, write: "Write") -> int:
    """The paused job's fire: its slot recorded once as a skip, a /log ping, exit 0."""
    from ..run import claims
    from ..run.plan import plan_slots, say

    name = runner.plan.name
    slot = plan_slots(runner.plan, now, tz)[-1]  # its current slot (validated as any fire's)
    note = f"paused {describe(pause, tz)}"[:300]

    def record() -> JobRun:
        with transaction.atomic():
            _begin()
            return claims.new_skip(runner, slot, note, 0, now, paused=True)

    try:
        run = write(record)
    except IntegrityError:  # another fire of this slot recorded it: one row per slot
        if not runner.opts.quiet:
            say(f"job {name}: {note} ({slot} is recorded as paused already)", runner.stdout)
        return 0
    write(lambda: actions.attach(runner.action, run))
    if not runner.opts.quiet:
        say(f"job {name}: {note}", runner.stdout)
    runner.monitors().log(note)
    return 0
