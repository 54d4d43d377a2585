"""Django system checks for cronops configuration (ids ops.E0xx / ops.W0xx).

| id | level | what |
|---|---|---|
| ops.E001 | error | crontab.d has an error (the message names file:line) |
| ops.E003 | error | OPS_LOCK_DIR cannot be created or written |
| ops.E004 | error | OPS_LOG_DIR cannot be created or written |
| ops.E005 | error | `.env` is readable by other users (world-readable) |
| ops.W001 | warning | healthchecks.io pings are not configured for scheduled jobs |
| ops.W002 | warning | `.env` is readable by its group |
| ops.W003 | warning | the system time zone differs from TIME_ZONE (install_crontab refuses) |
"""

import os
import stat
from pathlib import Path

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from .crontab import redact, secrets_of, tz_hint, tz_mismatch
from .crontabd import CrontabError, load_schedule


def _schedule():
    try:
        return load_schedule(check_args=True), None
    except CrontabError as exc:
        return None, exc


@register(Tags.compatibility, deploy=False)
def check_crontabd(app_configs=None, **kwargs):
    schedule, error = _schedule()
    messages = []
    if error is not None:
        messages.append(
            Error(
                redact(f"crontab.d: {error}", secrets_of(settings)),
                hint="fix that line (format: README, 'The schedule'); install_crontab refuses "
                "to install until it is valid",
                id="ops.E001",
            )
        )
    if schedule is not None and schedule.jobs:
        problem = tz_mismatch(settings.TIME_ZONE)
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
        unpinged = [j.name for j in schedule.jobs if not (j.options.ping or j.options.no_ping)]
        if unpinged and not settings.HEALTHCHECKS_PING_KEY:
            messages.append(
                Warning(
                    f"healthchecks.io pings are not configured: {len(unpinged)} scheduled "
                    f"job(s) ({', '.join(unpinged[:5])}) run unmonitored",
                    hint="set HEALTHCHECKS_PING_KEY in .env (healthchecks.io project Settings "
                    "→ API Access), or give each job --ping=UUID or --no-ping in crontab.d",
                    id="ops.W001",
                )
            )
    return messages


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


@register(Tags.compatibility, deploy=False)
def check_directories(app_configs=None, **kwargs):
    messages = []
    for setting, error_id, why in (
        ("OPS_LOCK_DIR", "ops.E003", "run_job takes each job's lock there"),
        ("OPS_LOG_DIR", "ops.E004", "installed cron lines append each job's output there"),
    ):
        problem = _writable_dir_problem(getattr(settings, setting))
        if problem:
            messages.append(
                Error(
                    f"{setting}: {problem} ({why})",
                    hint=f"create it for the user that runs the jobs, or set {setting} in .env",
                    id=error_id,
                )
            )
    return messages


@register(Tags.security, deploy=False)
def check_env_file(app_configs=None, **kwargs):
    path = Path(settings.BASE_DIR) / ".env"
    try:
        mode = path.stat().st_mode
    except OSError:
        return []
    hint = f"chmod 600 {path} (it holds SECRET_KEY, the database URL and the healthchecks keys)"
    if mode & stat.S_IROTH:
        return [
            Error(f"{path} is readable by every user on this machine", hint=hint, id="ops.E005")
        ]
    if mode & stat.S_IRGRP:
        return [Warning(f"{path} is readable by its group", hint=hint, id="ops.W002")]
    return []
