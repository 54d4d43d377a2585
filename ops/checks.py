"""Django system checks for cronops configuration (ids ops.E0xx / ops.W0xx).

| id | level | what |
|---|---|---|
| ops.E001 | error | crontab.d has an error (the message names file:line) |
| ops.E003 | error | OPS_LOCK_DIR cannot be created or written |
| ops.E004 | error | OPS_LOG_DIR cannot be created or written |
| ops.E005 | error | `.env` is readable by other users (world-readable) |
| ops.E006 | error | a cronops setting has a value it cannot use (ops/conf.py) |
| ops.E007 | error | settings.BASE_DIR is not defined (the paths' defaults come from it) |
| ops.E008 | error | USE_TZ is off (slots and runs are stored as aware datetimes) |
| ops.E009 | error | TIME_ZONE is not a time zone Python knows |
| ops.E010 | error | `.env` has a line load_env could not load (not UTF-8, unparsable) |
| ops.E011 | error | `.env` is there but unreadable (a dangling link, a directory, no permission) |
| ops.E012 | error | cronops' migrations are not applied (only `check --database <alias>`) |
| ops.W001 | warning | healthchecks.io pings are not configured (a deployment check: `--deploy`) |
| ops.W002 | warning | `.env` is readable by its group (unless root owns it and the group is ours) |
| ops.W003 | warning | the system time zone differs from TIME_ZONE (install_crontab refuses) |
| ops.W004 | warning | OPS_CRONTAB_DIR does not exist: nothing is scheduled yet |
| ops.W005 | warning | BASE_DIR has no manage.py, which every installed cron line runs |
| ops.W006 | warning | a name in OPS_REDACT is neither a setting nor an environment variable |
| ops.W010 | warning | TIME_ZONE is a legacy tzdata name (`US/Eastern`: a link) |
| ops.W011 | warning | a job name is longer than Sentry's 50-character monitor slugs |
| ops.W012 | warning | SENTRY_DSN or SENTRY_ENVIRONMENT is one Sentry check-ins cannot use |

A check whose setting is broken (E006, E007) skips what depends on it instead of failing on it.
E012 is a database check: Django runs it only when asked for a database (`check --database
default`; also `migrate`, which runs the checks before it migrates, so there it stays silent);
run_job, job_status and install_crontab say so themselves.
"""

import os
import stat
import sys
import types
import zoneinfo
from pathlib import Path

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import DatabaseError

from . import checkgate, conf

# Registered by ops/checkgate.py, which imports this module only where the checks run (the
# commands in checkgate.CHECKING): what each check needs is imported when it runs.

SETTINGS_HINT = "see docs/settings.md for every cronops setting and its default"


def _or_none(getter):
    """The getter's value, or None when its setting is broken (reported by check_settings)."""
    try:
        return getter()
    except conf.SettingError:
        return None


def _time_zone() -> str | None:
    """TIME_ZONE when Python can load it, else None (reported by check_time_zone)."""
    name = getattr(settings, "TIME_ZONE", None)
    if not isinstance(name, str):
        return None  # what ZoneInfo's TypeError below said before
    try:
        zoneinfo.ZoneInfo(name)
    except (TypeError, ValueError, zoneinfo.ZoneInfoNotFoundError):
        return None
    return name


def check_settings(app_configs=None, **kwargs):
    messages = []
    for problem in conf.problems():
        if problem.name == "BASE_DIR":
            messages.append(
                Error(
                    "settings.BASE_DIR is not defined",
                    hint=f"{str(problem).split(': ', 2)[-1]}; or set OPS_CRONTAB_DIR, "
                    "OPS_LOCK_DIR and OPS_LOG_DIR to absolute paths (install_crontab still "
                    "needs BASE_DIR to find manage.py)",
                    id="ops.E007",
                )
            )
        elif isinstance(problem, conf.EnvFileError) and problem.whole_file:
            messages.append(
                Error(
                    str(problem),
                    hint="point the link at the real file, or make .env a file the jobs' user "
                    "can read, or remove it (no .env is fine); until then every process runs "
                    "without it, on the settings' defaults (their database), and run_job and "
                    "job_status refuse to run",
                    id="ops.E011",
                )
            )
        elif isinstance(problem, conf.EnvFileError):
            messages.append(
                Error(
                    str(problem),
                    hint="fix that line (UTF-8, NAME=value, quotes closed); run_job and "
                    "job_status refuse to run until then",
                    id="ops.E010",
                )
            )
        else:
            messages.append(Error(str(problem), hint=SETTINGS_HINT, id="ops.E006"))
    return messages


def check_time_zone(app_configs=None, **kwargs):
    messages = []
    if not getattr(settings, "USE_TZ", False):
        messages.append(
            Error(
                "USE_TZ is off: cronops stores every slot and run as an aware datetime",
                hint="set USE_TZ = True (Django's default since 5.0); TIME_ZONE says which zone "
                "the schedules are in",
                id="ops.E008",
            )
        )
    if _time_zone() is None:
        messages.append(
            Error(
                f"TIME_ZONE {getattr(settings, 'TIME_ZONE', None)!r} is not a time zone "
                "Python knows: schedules and logical dates are computed in it",
                hint="an IANA name such as UTC or Europe/Berlin (Debian: the tzdata package)",
                id="ops.E009",
            )
        )
    return messages


def _schedule():
    from .schedule.crontabd import CrontabError, load_schedule

    try:
        return load_schedule(check_args=True), None
    except CrontabError as exc:
        return None, exc


# The commands whose system checks read crontab.d (parsing it, with each job's arguments through
# its command's parser, costs a command ~10 ms): `check` (the deploy runs it) and `runserver`.
# `migrate` and `test` skip it; run_job, install_crontab, job_status, sync_healthchecks and
# export_schedule read crontab.d themselves and refuse a bad line.
READS_CRONTABD = frozenset({"check", "runserver"})


def _reads_crontabd() -> bool:
    return checkgate.checking(READS_CRONTABD)


def check_crontabd(app_configs=None, **kwargs):
    if not _reads_crontabd():
        return []
    directory = _or_none(conf.crontab_dir)
    if directory is None:
        return []  # check_settings says why
    if not directory.is_dir():
        return [
            Warning(
                f"OPS_CRONTAB_DIR {directory} does not exist: no job is scheduled",
                hint="create it with a first *.cron file (README, 'Add cronops to your "
                "project'), or set OPS_CRONTAB_DIR; install_crontab refuses until it exists",
                id="ops.W004",
            )
        ]
    if not any(directory.glob("*.cron")):
        return []  # nothing scheduled yet: nothing to parse (and nothing to import for it)
    from .schedule.systemtz import tz_hint, tz_mismatch

    schedule, error = _schedule()
    messages: list[CheckMessage] = []
    if error is not None:
        messages.append(
            Error(
                f"crontab.d: {error}",  # redacted where it is made (CrontabError)
                hint="fix that line (format: docs/schedule.md); install_crontab refuses "
                "to install until it is valid",
                id="ops.E001",
            )
        )
    if schedule is not None and schedule.jobs:
        base = _or_none(conf.base_dir)
        if base is not None and not (base / "manage.py").is_file():
            messages.append(
                Warning(
                    f"{base / 'manage.py'} does not exist: every installed cron line runs "
                    "manage.py in BASE_DIR",
                    hint="set BASE_DIR to the directory of manage.py (startproject's settings do)",
                    id="ops.W005",
                )
            )
        problem = tz_mismatch(settings.TIME_ZONE) if _time_zone() else None
        if problem:
            # A warning, not an error: a laptop in another zone must still migrate and
            # runserver; install_crontab, where the mismatch does harm, refuses outright.
            messages.append(
                Warning(
                    f"{problem}: installed jobs would fire at the wrong hour",
                    hint=tz_hint(settings.TIME_ZONE),
                    id="ops.W003",
                )
            )
        if _or_none(conf.sentry_dsn):
            messages += _long_for_sentry(schedule.jobs)
    return messages


def _long_for_sentry(jobs) -> list[CheckMessage]:
    """ops.W011, with Sentry check-ins on: names Sentry would cut to another job's slug."""
    from .monitors.dsn import SLUG_MAX

    long = [j.name for j in jobs if len(j.name) > SLUG_MAX and not j.options.no_ping]
    if not long:
        return []
    return [
        Warning(
            f"{len(long)} job name(s) longer than {SLUG_MAX} characters "
            f"({', '.join(n[:20] + '…' for n in long[:3])}): Sentry cuts a monitor's "
            f"slug to {SLUG_MAX}, so their check-ins may land on another job's monitor",
            hint=f"give each a --name of at most {SLUG_MAX} characters in crontab.d",
            id="ops.W011",
        )
    ]


def check_pings(app_configs=None, **kwargs):
    """ops.W001, a deployment check (`check --deploy`): healthchecks.io is optional, so a
    project without it hears of it where Django users look for production warnings, not on
    every `check` and `runserver` start."""
    if not _reads_crontabd():
        return []
    directory = _or_none(conf.crontab_dir)
    if directory is None or not directory.is_dir() or not any(directory.glob("*.cron")):
        return []  # check_settings and check_crontabd say why
    if _or_none(conf.ping_key) or _or_none(conf.sentry_dsn):
        return []
    schedule, _ = _schedule()  # an error is check_crontabd's ops.E001
    if schedule is None:
        return []
    unpinged = [j.name for j in schedule.jobs if not (j.options.ping or j.options.no_ping)]
    if not unpinged:
        return []
    return [
        Warning(
            f"healthchecks.io pings are not configured: {len(unpinged)} scheduled "
            f"job(s) ({', '.join(unpinged[:5])}) run unmonitored",
            hint="set HEALTHCHECKS_PING_KEY in .env (healthchecks.io project Settings "
            "→ API Access), or give each job --ping=UUID or --no-ping in crontab.d",
            id="ops.W001",
        )
    ]


def check_sentry(app_configs=None, **kwargs):
    try:
        problem = conf.sentry_problem()
    except conf.SettingError:
        return []  # E006 says it
    if problem is None:
        return []
    return [
        Warning(
            problem,
            hint="fix it where the project sets it, or give cronops a DSN of its own in "
            "OPS_SENTRY_DSN (docs/sentry.md)",
            id="ops.W012",
        )
    ]


def check_redact_names(app_configs=None, **kwargs):
    try:
        names = conf.redact_names(settings)
    except conf.SettingError:
        return []  # E006 says it
    # neither a setting nor an environment variable: a typo would silently protect nothing
    unknown = [n for n in names if getattr(settings, n, None) is None and n not in os.environ]
    return [
        Warning(
            f"OPS_REDACT names {name}, which is neither a Django setting nor an environment "
            "variable: nothing is redacted for it",
            hint="check the spelling; the value is read from settings, else from .env",
            id="ops.W006",
        )
        for name in unknown
    ]


def check_time_zone_name(app_configs=None, **kwargs):
    from .schedule.tznames import current_name

    if _time_zone() is None:
        return []
    current = current_name(settings.TIME_ZONE)
    if current is None:
        return []
    return [
        Warning(
            f"TIME_ZONE {settings.TIME_ZONE!r} is a legacy tzdata name of {current!r}",
            hint=f"set TIME_ZONE = {current!r} in your settings (or .env if they read it from "
            f"there): tzdata keeps {settings.TIME_ZONE!r} only as a link, and may drop it",
            id="ops.W010",
        )
    ]


def _writable_dir_problem(path: Path) -> str | None:
    """None if `path` is (or can be created as) a directory this process can write."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            return f"{path} is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{path} is not writable by this user"
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{path} cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{path} does not exist and {parent} is not writable by this user"
    return None


def check_directories(app_configs=None, **kwargs):
    messages = []
    for setting, getter, error_id, why in (
        ("OPS_LOCK_DIR", conf.lock_dir, "ops.E003", "run_job takes each job's lock there"),
        (
            "OPS_LOG_DIR",
            conf.log_dir,
            "ops.E004",
            "installed cron lines log each job's output there",
        ),
    ):
        directory = _or_none(getter)
        problem = _writable_dir_problem(directory) if directory is not None else None
        if problem:
            messages.append(
                Error(
                    f"{setting}: {problem} ({why})",
                    hint=f"create it for the user that runs the jobs, or set {setting} in .env",
                    id=error_id,
                )
            )
    return messages


def check_env_file(app_configs=None, **kwargs):
    base = _or_none(conf.base_dir)
    if base is None:
        return []
    path = base / ".env"
    try:
        info = path.stat()
    except OSError:
        return []
    hint = (
        f"chmod 600 {path}, or chown root:<the app's group> and chmod 640 as the Ansible deploy "
        "does (it holds SECRET_KEY, the database URL and the healthchecks keys)"
    )
    if info.st_mode & stat.S_IROTH:
        return [
            Error(f"{path} is readable by every user on this machine", hint=hint, id="ops.E005")
        ]
    if info.st_mode & stat.S_IRGRP and not _root_owned_for_us(info):
        return [
            Warning(
                f"{path} is readable by its group {_group_name(info.st_gid)}",
                hint=hint,
                id="ops.W002",
            )
        ]
    return []


def _root_owned_for_us(info: os.stat_result) -> bool:
    """The deploy's layout: root owns `.env`, its group is this process's, so the app can read
    its configuration but not rewrite it."""
    return info.st_uid == 0 and (info.st_gid == os.getegid() or info.st_gid in os.getgroups())


def _group_name(gid: int) -> str:
    try:
        import grp  # only for a .env readable by its group

        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def check_migrations(app_configs=None, databases=None, **kwargs):
    """ops.E012: cronops' migrations not applied to a database it migrates into. A database
    check (Tags.database): Django runs it only for `check --database <alias>` (and `migrate`,
    the test runner), never for an ordinary command, so it costs them no query."""
    if not databases or _migrating():
        return []
    if app_configs is not None and not any(c.name == "ops" for c in app_configs):
        return []
    from django.db import router

    from . import schema
    from .models import SlotClaim

    messages = []
    for alias in databases:
        if not router.allow_migrate_model(alias, SlotClaim):
            continue
        hint = (
            f"run `{schema.migrate_command(alias)}`; until then run_job, job_status and the "
            "admin's Cron operations fail, and install_crontab refuses"
        )
        try:
            pending = schema.unapplied(alias)
        except DatabaseError as exc:
            messages.append(
                Error(
                    f"database {alias!r} cannot be read ({schema.first_line(exc)}): whether "
                    "cronops' migrations are applied is unknown",
                    hint=hint,
                    id="ops.E012",
                )
            )
            continue
        if pending:
            messages.append(
                Error(
                    f"{schema.not_applied(pending, alias)} ({schema.spelled(pending)})",
                    hint=hint,
                    id="ops.E012",
                )
            )
    return messages


def _migrating() -> bool:
    """Whether these checks run inside `migrate` (which runs the database checks just before it
    migrates): reporting there what it is about to fix would stop it. Its command object is on
    the stack, however it was started (manage.py, django-admin, call_command, a subclass)."""
    from django.core.management.commands.migrate import Command as Migrate

    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back
    return False
