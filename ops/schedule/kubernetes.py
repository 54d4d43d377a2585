"""crontab.d as Kubernetes CronJobs (`manage.py export_schedule --format=kubernetes`).

One `batch/v1` CronJob per job; its pod runs `python manage.py run_job <job name>`, so run_job
finds the job in the image's own crontab.d and keeps every promise it keeps under cron: the slot
claim (a second Job for the same schedule is a no-op), catch-up, pings, the run history.

A schedule is exported only when Kubernetes reads it exactly as Debian's cron does. The CronJob
controller and the API server's validation parse `spec.schedule` with robfig/cron v3
`cron.ParseStandard` (kubernetes/kubernetes: pkg/apis/batch/validation/validation.go
`validateScheduleFormat`, pkg/controller/cronjob/utils.go; the parser is
vendor/github.com/robfig/cron/v3/parser.go and spec.go). Where the two differ:

- day of week: robfig's range is 0-6 (`dow = bounds{0, 6, ...}` in spec.go), so Debian's 7
  (Sunday) is an error there;
- day of month and day of week: both crons AND the two fields when one of them is "a star" and
  OR them otherwise (spec.go `dayMatches`; Debian cron.c `find_jobs`), but they disagree on what
  a star is: Debian looks at the field's first character (entry.c: `if (ch == '*') e->flags |=
  DOM_STAR;`), robfig sets its star bit for a `*` or `?` item whose step is not above 1
  (parser.go `getRange`: `if step > 1 { extra = 0 }`), in any position of a list;
- `@reboot` does not exist there (parser.go `parseDescriptor` knows @yearly @annually @monthly
  @weekly @daily @midnight @hourly, each with the same fields and star flags as Debian's);
- names (jan-dec, sun-sat, any case), ranges, lists and `*/S`, `N-M/S` steps mean the same.
  (`N/S` and `?` differ too, but the crontab.d validator already refuses both.)
- DST: a fixed-time job (minute and hour not starting with `*`) due inside the wall-clock hour
  that a spring night skips runs right after the jump under Debian's cron and not at all under
  robfig's `Next`, which walks real hours: refused for the zone's changes of the next 28
  years from `today` (passed in), in which every date falls on every weekday. In the repeated
  autumn hour Kubernetes may start such a job twice; the second run finds the slot `already
  done`, so that one is only documented.

The YAML itself is written by ops/schedule/kubernetes_yaml.py.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import zoneinfo
from dataclasses import dataclass, field
from pathlib import Path

from .crontabd import SPECIALS, CrontabError, Job, Schedule, load_schedule
from .options import DEFAULT_KILL_AFTER

MANAGED_BY = "cronops"
LOCK_DIR = "/run/cronops"  # an emptyDir: run_job's lock needs a writable directory in the pod
CONTAINER = "run-job"

# Kubernetes names: a CronJob name is a DNS-1123 name of at most 52 characters (the controller
# appends "-<minutes since the epoch>", 11 characters, to name each Job, whose name goes into a
# 63-character label: validation.go `ValidateCronJobCreate`).
MAX_CRONJOB_NAME = 52
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# validation.go `validTimeZoneCharacters`, applied to each '/'-separated part of timeZone.
_TZ_PART = re.compile(r"^[A-Za-z.\-_0-9+]{1,14}$")
# resource.Quantity's own pattern (apimachinery pkg/api/resource/quantity.go).
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")

# What robfig/cron v3 ParseStandard accepts after an '@' (parser.go `parseDescriptor`).
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}
_WEEKDAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
# The longest each month gets (February: 29, in leap years).
_MONTH_DAYS = dict(enumerate([31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], 1))


class ExportError(ValueError):
    """Something that cannot become a CronJob, in one line (exit 2)."""


@dataclass(frozen=True)
class ExportOptions:
    image: str
    env_secrets: tuple[str, ...]
    namespace: str | None = None
    service_account: str | None = None
    starting_deadline: int = 3600
    deadline_margin: int = 300
    successful_history: int = 3
    failed_history: int = 3
    app: str = "cronops"
    python: str = "python"
    workdir: str | None = None
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        """ExportError for an option Kubernetes would reject."""
        if not self.image or any(c.isspace() for c in self.image):
            raise ExportError(f"--image {self.image!r}: give the image reference, no spaces")
        if self.namespace is not None and not _dns_label(self.namespace, 63):
            raise ExportError(
                f"--namespace {self.namespace!r}: a namespace is 1-63 of a-z, 0-9 and '-', "
                "starting and ending with a letter or digit"
            )
        if not self.env_secrets:
            raise ExportError("--env-secret: name the Secret that holds the pods' settings")
        for name, value in [("--env-secret", s) for s in self.env_secrets] + [
            ("--service-account", self.service_account)
        ]:
            if value is not None and not _dns_subdomain(value):
                raise ExportError(
                    f"{name} {value!r}: a Kubernetes name is 1-253 of a-z, 0-9, '-' and '.', "
                    "starting and ending with a letter or digit"
                )
        if len(self.app) > 63 or not _LABEL_VALUE.match(self.app) or not self.app:
            raise ExportError(
                f"--app {self.app!r}: a label value is 1-63 of letters, digits, '-', '_' and "
                "'.', starting and ending with a letter or digit"
            )
        if self.starting_deadline < 10:
            raise ExportError(
                "--starting-deadline: at least 10s (the CronJob controller looks every 10 "
                "seconds; a shorter deadline can miss every run)"
            )
        for flag, count in (
            ("--successful-history", self.successful_history),
            ("--failed-history", self.failed_history),
        ):
            if count < 0:
                raise ExportError(f"{flag}: a count ≥ 0, not {count}")
        if not self.python or any(c.isspace() for c in self.python):
            raise ExportError(f"--python {self.python!r}: one path or command name, no spaces")


def _dns_label(name: str, limit: int) -> bool:
    return len(name) <= limit and bool(_DNS_LABEL.match(name))


def _dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))


def parse_resources(text: str, flag: str) -> dict[str, str]:
    """`cpu=100m,memory=256Mi` → {"cpu": "100m", "memory": "256Mi"}; ExportError otherwise."""
    result: dict[str, str] = {}
    for item in text.split(","):
        name, sep, quantity = item.strip().partition("=")
        if not sep or name not in RESOURCE_NAMES or not _QUANTITY.match(quantity):
            raise ExportError(
                f"{flag} {text!r}: use NAME=QUANTITY[,...] with NAME one of "
                f"{', '.join(RESOURCE_NAMES)} and a Kubernetes quantity (100m, 0.5, 256Mi, 1Gi)"
            )
        result[name] = quantity
    return {name: result[name] for name in RESOURCE_NAMES if name in result}


# --- settings ---------------------------------------------------------------------------------


def check_database(databases: dict) -> None:
    """Pods on different nodes cannot share a SQLite file, and the claim needs one store."""
    engine = databases.get("default", {}).get("ENGINE", "")
    if "sqlite" in engine:
        raise ExportError(
            "DATABASE_URL is SQLite: the pods of a CronJob run on any node and need one shared "
            "claim store, so that a second Job for the same schedule does nothing; export with "
            "DATABASE_URL set to the PostgreSQL database the pods will use (it is not connected "
            "to, and never printed)"
        )


def check_time_zone(name: str) -> None:
    """ExportError unless Kubernetes (validation.go `validateTimeZone`) and Python both know
    `name`. Legacy names (US/Eastern) are links in tzdata's `backward` file, which Go's embedded
    database carries too, so they are kept as written: run_job reads the same name."""
    parts = name.split("/")
    if not name or any(
        p in (".", "..") or p.startswith("-") or not _TZ_PART.match(p) for p in parts
    ):
        raise ExportError(
            f"TIME_ZONE {name!r} is not a name Kubernetes accepts for timeZone: use an IANA "
            "name such as Europe/Berlin or UTC"
        )
    if name.lower() == "local":
        raise ExportError(
            "TIME_ZONE 'Local' means the node's zone to Kubernetes: use an explicit IANA name"
        )
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ExportError(
            f"TIME_ZONE {name!r} is not in the time-zone database: use an IANA name such as "
            "Europe/Berlin or UTC"
        ) from None


# --- schedules --------------------------------------------------------------------------------


def _where(job: Job) -> str:
    return f"{job.path}:{job.lineno}"


def _refuse(job: Job, message: str) -> ExportError:
    return ExportError(f"{_where(job)}: {job.name}: {message} (in: {job.schedule})")


def _value(word: str, names: dict[str, int]) -> int:
    return int(word) if word.isdigit() else names[word.lower()]


def _values(text: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    """The values of a field the crontab.d validator has accepted (Debian's reading)."""
    values: set[int] = set()
    for item in text.split(","):
        base, _, step = item.partition("/")
        if base == "*":
            lo, hi = low, high
        else:
            first, _, last = base.partition("-")
            lo = _value(first, names)
            hi = _value(last, names) if last else lo
        values.update(range(lo, hi + 1, int(step or 1)))
    return values


def _robfig_star(text: str) -> bool:
    """robfig/cron's star bit: some item is `*` or `?` with no step above 1 (parser.go)."""
    for item in text.split(","):
        base, _, step = item.partition("/")
        if base in ("*", "?") and (not step or int(step) <= 1):
            return True
    return False


def kubernetes_schedule(job: Job) -> str:
    """The job's schedule for `spec.schedule`; ExportError (file:line) when Kubernetes would
    read it differently from Debian's cron, or not at all."""
    if job.schedule == "@reboot":
        raise _refuse(
            job,
            "@reboot has no Kubernetes equivalent (a CronJob has no boot to run after): run "
            "the command from your deploy, e.g. a Job or an init container",
        )
    if job.schedule.startswith("@"):
        if job.schedule not in DESCRIPTORS:  # the validator knows no others; kept as a guard
            raise _refuse(job, f"Kubernetes does not know {job.schedule}")
        return job.schedule
    _minute, _hour, dom, month, dow = job.schedule.split()
    for item in dow.split(","):
        base = item.partition("/")[0]
        words = [] if base == "*" else base.split("-")
        if any(_value(w, _WEEKDAYS) == 7 for w in words):
            raise _refuse(
                job,
                f"day of week 7 in {dow!r} is Sunday to Debian's cron but out of range for "
                "Kubernetes (0-6): write 0 or sun for Sunday",
            )
    debian_and = dom.startswith("*") or dow.startswith("*")
    kubernetes_and = _robfig_star(dom) or _robfig_star(dow)
    if debian_and != kubernetes_and and _and_differs_from_or(dom, month, dow):
        debian, kubernetes = ("both", "either") if debian_and else ("either", "both")
        raise _refuse(
            job,
            f"day of month {dom!r} and day of week {dow!r}: Debian's cron runs it on days that "
            f"match {debian} (a day field starting with '*' makes it AND them), Kubernetes on "
            f"days that match {kubernetes} (its AND needs a plain '*' or '*/1' item); keep one "
            "day field a plain '*' and let the command skip the other days",
        )
    return job.schedule


DST_YEARS = 28  # the Gregorian calendar's cycle of dates and weekdays (within a century)


@functools.cache
def skipped_wall_minutes(
    time_zone: str, since: dt.date, years: int = DST_YEARS
) -> tuple[tuple[dt.datetime, ...], ...]:
    """The wall-clock minutes (naive datetimes) that `time_zone` skips on its spring nights in
    the `years` years from `since` (from the day before in UTC, so a zone east of UTC keeps
    the rest of its day), one tuple per night."""
    tz = zoneinfo.ZoneInfo(time_zone)

    def offset(instant: dt.datetime) -> dt.timedelta | None:
        return instant.astimezone(tz).utcoffset()

    start = dt.datetime(since.year, since.month, since.day, tzinfo=dt.UTC) - dt.timedelta(days=1)
    end = start + dt.timedelta(days=round(365.2425 * years) + 1)
    step = dt.timedelta(hours=6)  # a zone's changes are months apart
    nights = []
    at, before = start, offset(start)
    while at < end:
        after = offset(at + step)
        if after != before and after is not None and before is not None:
            minute = at  # the change lies within these six hours: find its minute
            while offset(minute) == before:
                minute += dt.timedelta(minutes=1)
            if after > before:
                wall = (minute + before).replace(tzinfo=None)
                gap = int((after - before).total_seconds() // 60)
                nights.append(tuple(wall + dt.timedelta(minutes=m) for m in range(gap)))
        at, before = at + step, after
    return tuple(nights)


def _fires_at(fields: list[str], wall: dt.datetime) -> bool:
    """Whether Debian's cron matches the wall-clock minute `wall` (entry.c, cron.c)."""
    minute, hour, dom, month, dow = fields
    if wall.minute not in _values(minute, 0, 59, {}) or wall.hour not in _values(hour, 0, 23, {}):
        return False
    if wall.month not in _values(month, 1, 12, _MONTHS):
        return False
    on_day = wall.day in _values(dom, 1, 31, {})
    on_weekday = (wall.isoweekday() % 7) in {d % 7 for d in _values(dow, 0, 7, _WEEKDAYS)}
    if dom.startswith("*") or dow.startswith("*"):
        return on_day and on_weekday
    return on_day or on_weekday


def check_dst(job: Job, time_zone: str, today: dt.date) -> None:
    """ExportError (file:line) for a fixed-time job due in a wall-clock minute that a spring
    night of `time_zone` skips: Debian's cron runs it right after the jump, Kubernetes never."""
    fields = (SPECIALS.get(job.schedule, job.schedule) or "").split()  # @reboot: none
    if len(fields) != 5 or fields[0].startswith("*") or fields[1].startswith("*"):
        return  # @reboot (refused elsewhere), or a wildcard job: it runs in real time on both
    for night in skipped_wall_minutes(time_zone, today):
        for wall in night:
            if _fires_at(fields, wall):
                raise _refuse(
                    job,
                    f"{wall:%H:%M} on {wall:%Y-%m-%d} does not exist in {time_zone} (the clock "
                    f"jumps from {night[0]:%H:%M} to {night[-1] + dt.timedelta(minutes=1):%H:%M}"
                    "): Debian's cron runs the job right after the jump, Kubernetes skips that "
                    "day's run; move it out of that hour, or use a TIME_ZONE without DST",
                )


def _and_differs_from_or(dom: str, month: str, dow: str) -> bool:
    """Whether some real date matches exactly one of the two day fields (then AND and OR give
    different days). Every (month, day, weekday) triple with a day that month has occurs in
    some year, so looking at the triples is exact."""
    days = _values(dom, 1, 31, {})
    weekdays = {d % 7 for d in _values(dow, 0, 7, _WEEKDAYS)}  # Debian: 7 is Sunday
    for m in _values(month, 1, 12, _MONTHS):
        for day in range(1, _MONTH_DAYS[m] + 1):
            for weekday in range(7):
                if (day in days) != (weekday in weekdays):
                    return True
    return False


def resource_name(job: Job) -> str:
    """The CronJob's name: the job name with '_' as '-' (Kubernetes names are DNS-1123)."""
    name = job.name.replace("_", "-").lower()
    if not _dns_label(name, MAX_CRONJOB_NAME):
        why = (
            f"is {len(name)} characters, Kubernetes allows {MAX_CRONJOB_NAME} for a CronJob"
            if len(name) > MAX_CRONJOB_NAME
            else "must start and end with a letter or digit"
        )
        raise ExportError(
            f"{_where(job)}: job name {job.name!r} cannot be a CronJob name: {name!r} {why} "
            "(names are a-z, 0-9 and '-'; '_' becomes '-'): give the job a --name="
        )
    return name


# --- manifests --------------------------------------------------------------------------------


def _labels(job: Job, options: ExportOptions) -> dict[str, str]:
    # Every exported job name is a valid label value: it maps to a DNS label of ≤ 52 characters
    # and differs from it only by '_'.
    return {
        "app.kubernetes.io/name": options.app,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "cronops/job": job.name,
    }


def active_deadline(job: Job, options: ExportOptions) -> int | None:
    """Seconds a Job may run: every slot it may run (the current one plus --catch-up) with its
    --timeout and --kill-after (a timed-out job's SIGKILL comes that much later), plus a
    margin for what comes before run_job's own clock starts (scheduling, image pull, Django's
    start), plus the standby's bound when the job stands by (its line's --standby, or
    OPS_STANDBY in these settings): a pod of a second Job for the slot may wait that long, then
    run it. With --retries, every attempt and the longest waits between them; with --after, its
    --after-wait. None without --timeout: the job may run as long as under cron."""
    timeout = job.options.timeout
    if not timeout:
        return None
    from ..run.retries import longest_run

    per_attempt = math.ceil(timeout) + math.ceil(job.options.kill_after or DEFAULT_KILL_AFTER)
    per_slot = math.ceil(longest_run(job.options, per_attempt))
    deadline = per_slot * (1 + (job.options.catch_up or 0)) + options.deadline_margin
    return deadline + math.ceil(_standby_bound(job))


def _standby_bound(job: Job) -> float:
    from .. import conf
    from ..run.standby import StandbySettingError, bound

    try:
        seconds = bound(job.options, heartbeat=conf.heartbeat_seconds(), default_grace=0.0)
    except StandbySettingError as exc:
        raise ExportError(str(exc)) from None
    return seconds or 0.0


def cronjob(job: Job, time_zone: str, options: ExportOptions) -> dict:
    """The CronJob for one job (plain dicts and lists, in the order they are written)."""
    name = resource_name(job)
    labels = _labels(job, options)
    metadata: dict = {"name": name}
    if options.namespace:
        metadata["namespace"] = options.namespace
    metadata["labels"] = labels
    annotations = {"cronops/source": f"{Path(job.path).name}:{job.lineno}"}
    if job.description:
        annotations["cronops/description"] = job.description
    metadata["annotations"] = annotations

    container: dict = {
        "name": CONTAINER,
        "image": options.image,
        # By name: run_job finds the job in the image's crontab.d, with its options and args.
        "command": [options.python, "manage.py", "run_job", job.name],
    }
    if options.workdir:
        container["workingDir"] = options.workdir
    container["envFrom"] = [{"secretRef": {"name": s}} for s in options.env_secrets]
    # `env` wins over `envFrom`, so a Secret made from a server's .env cannot undo these: the
    # pod computes slots in the zone the CronJob fires in, and each pod is its own host in the
    # claims. A run treats a running claim from its own host as dead (it holds the job's lock),
    # which is true on one server but not across pods that each have their own lock directory.
    container["env"] = [
        {"name": "TIME_ZONE", "value": time_zone},
        {"name": "OPS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "OPS_LOCK_DIR", "value": LOCK_DIR},
    ]
    if options.requests or options.limits:
        resources = {}
        if options.requests:
            resources["requests"] = dict(options.requests)
        if options.limits:
            resources["limits"] = dict(options.limits)
        container["resources"] = resources
    container["volumeMounts"] = [{"name": "cronops-lock", "mountPath": LOCK_DIR}]

    pod_spec: dict = {"restartPolicy": "Never"}
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = [{"name": "cronops-lock", "emptyDir": {}}]

    job_spec: dict = {"backoffLimit": 0}
    deadline = active_deadline(job, options)
    if deadline is not None:
        job_spec["activeDeadlineSeconds"] = deadline
    job_spec["template"] = {"metadata": {"labels": dict(labels)}, "spec": pod_spec}

    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": metadata,
        "spec": {
            "schedule": kubernetes_schedule(job),
            "timeZone": time_zone,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": options.starting_deadline,
            "successfulJobsHistoryLimit": options.successful_history,
            "failedJobsHistoryLimit": options.failed_history,
            "jobTemplate": {"metadata": {"labels": dict(labels)}, "spec": job_spec},
        },
    }


def export(
    options: ExportOptions,
    *,
    databases: dict,
    time_zone: str,
    today: dt.date,
    crontab_dir: Path | str | None = None,
) -> list[dict]:
    """The CronJobs for crontab.d (validated like install_crontab does, arguments included)
    under these settings; ExportError, one line, for the first problem."""
    options.check()
    check_database(databases)
    try:
        schedule = load_schedule(crontab_dir, check_args=True, second_opinion=True)
    except CrontabError as exc:
        raise ExportError(str(exc)) from None
    return cronjobs(schedule, time_zone, options, today=today)


def cronjobs(
    schedule: Schedule, time_zone: str, options: ExportOptions, *, today: dt.date
) -> list[dict]:
    """One CronJob per job, in crontab.d order; ExportError on the first that cannot be.
    `today`: where the DST check's years start."""
    check_time_zone(time_zone)
    if not schedule.jobs:
        raise ExportError("crontab.d has no jobs: nothing to export")
    taken: dict[str, Job] = {}
    documents = []
    for job in schedule.jobs:
        name = resource_name(job)
        if name in taken:
            first = taken[name]
            raise ExportError(
                f"{_where(job)}: job name {job.name!r} becomes the CronJob name {name!r}, "
                f"like {first.name!r} at {_where(first)} ('_' becomes '-'): rename one "
                "with --name="
            )
        taken[name] = job
        documents.append(cronjob(job, time_zone, options))
        check_dst(job, time_zone, today)  # after the schedule's own checks (`7` for Sunday)
    return documents
