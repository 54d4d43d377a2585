"""Run now / Run again from the jobs page: `manage.py run_job` for one job (and logical date),
started as a process of its own, exactly as cron starts it.

The web request never runs job code. It looks at the slot first (paused, running or done: said,
nothing started), records the action (ops/control/actions.py; once per confirmation page, also
with --force: `record_once`), then starts `run_job
--log=OPS_LOG_DIR/<job>.log [--logical-date=D] [--force] <job>` through `/bin/sh -c '"$@" &'`:
the shell puts run_job in the background and exits at once, so run_job is nobody's child in the
web server (init reaps it; a worker that is recycled or a server that restarts does not end it),
in a session of its own (no signal to the server's process group reaches it), with `/dev/null`
for stdin and its own `--log` for stdout and stderr, as an installed cron line has. From there
it is a cron fire: lock, claim, pings, history; its runs say who started them (`started_by`).

The web server's user therefore needs what cron's user has: the same project (manage.py, the
virtualenv, `.env`), the same database and the same OPS_LOCK_DIR and OPS_LOG_DIR (README).
"""

import datetime as dt
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

from .. import conf
from ..models import JobAction, Outcome
from ..run import claims
from ..schedule.crontabd import Job
from ..schedule.slots import Slot, current_slot, date_slot, slot_on_date
from . import actions, pauses

FREE, RUNNING, DONE, PAUSED, INVALID = "free", "running", "done", "paused", "invalid"


@dataclass
class SlotState:
    kind: str  # FREE, RUNNING, DONE, PAUSED or INVALID
    message: str
    slot: Slot | None = None
    run_id: int | None = None  # the run that holds or served the slot


def slot_state(
    name: str, job: Job, logical_date: dt.date | None, *, now: dt.datetime, tz: ZoneInfo
) -> SlotState:
    """What a run_job of `job` (for `logical_date`) would find, as far as a look can tell."""
    pause = pauses.active_pauses([name], now).get(name)
    if pause is not None:
        return SlotState(PAUSED, f"{name} is paused {pauses.describe(pause, tz)}: resume it first")
    expr = job.cron_expr
    try:
        if logical_date is None:
            slot = current_slot(expr, now, tz) if expr else None
        else:
            slot = slot_on_date(expr, logical_date, tz) if expr else date_slot(logical_date)
    except ValueError as exc:
        return SlotState(INVALID, str(exc))
    if slot is None:
        return SlotState(FREE, f"{name} has no slot (@reboot): it runs unslotted")
    if logical_date is not None and (slot.at or now) > now:
        return SlotState(INVALID, f"{logical_date} is in the future: its slot {slot} has not come")
    claim = claims.peek_slot(name, slot)
    if claim is not None and claim.state == Outcome.RUNNING:
        stale = claims.STALE_HEARTBEATS * conf.heartbeat_seconds()
        if claims.holder_alive(claim, now, stale):
            since = pauses.local(claim.started_at, tz)
            return SlotState(
                RUNNING,
                f"{slot} is running since {since} on {claim.host} (pid {claim.pid})",
                slot,
                claim.run_id,
            )
    if claim is not None and claim.state == Outcome.SUCCEEDED:
        return SlotState(DONE, f"{slot} is done already", slot, claim.run_id)
    return SlotState(FREE, f"runs the slot {slot}", slot)


# --- a confirmation's POST starts one run: a double click, or two people, start it once -------

CONFIRMATION_SALT = "cronops.run-now.confirmation"
CONFIRMATION_AGE = 3600  # seconds a confirmation page may be used


class StaleConfirmation(ValueError):
    pass


def confirmation(name: str, day: dt.date | None, force: bool, shown: dt.datetime) -> str:
    """The signed token of a confirmation page: the job, date and --force its POST may start,
    and when the page was shown."""
    from django.core import signing

    data = {"job": name, "date": day.isoformat() if day else "", "force": force}
    return signing.dumps({**data, "shown": shown.isoformat()}, salt=CONFIRMATION_SALT)


def shown_at(token: str, name: str, day: dt.date | None, force: bool) -> dt.datetime:
    """When the confirmation page whose POST carries `token` was shown; StaleConfirmation when
    the token is missing, forged, for another job, date or --force, or too old."""
    from django.core import signing

    try:
        data = signing.loads(token, salt=CONFIRMATION_SALT, max_age=CONFIRMATION_AGE)
    except signing.BadSignature:
        data = None
    expected = {"job": name, "date": day.isoformat() if day else "", "force": force}
    if not isinstance(data, dict) or {k: data.get(k) for k in expected} != expected:
        raise StaleConfirmation(
            "this confirmation is not this page's, or is over an hour old: nothing was "
            "started; confirm again below"
        )
    return dt.datetime.fromisoformat(data["shown"])


def record_once(
    kind: str, name: str, user: str, now: dt.datetime, *, shown: dt.datetime, **fields
) -> "tuple[JobAction | None, JobAction | None]":
    """Record a Run now / Run again of `name` unless one of that job and date was recorded since
    the confirmation was `shown`: (the new action, None) or (None, the earlier one). One
    transaction that serialises on the job (a PostgreSQL advisory lock; SQLite's write lock,
    taken first), so that of two POSTs at once the second sees the first's action."""
    from django.db import connection, transaction

    from ..run import fencing

    with transaction.atomic():
        if connection.vendor == "sqlite":  # the write lock now, also without IMMEDIATE
            JobAction.objects.filter(pk__lt=0).update(note="")
        fencing.advisory_lock(f"cronops run now {name}")
        earlier = (
            JobAction.objects.filter(
                job=name,
                kind__in=[JobAction.Kind.RUN_NOW, JobAction.Kind.RUN_AGAIN],
                logical_date=fields.get("logical_date"),
                at__gte=shown,
            )
            .order_by("at", "pk")
            .first()
        )
        if earlier is not None:
            return None, earlier
        return actions.record(kind, name, user, now, **fields), None


def run_job_argv(name: str, logical_date: dt.date | None, force: bool) -> list[str]:
    argv = ["run_job", f"--log={conf.log_dir() / f'{name}.log'}"]
    if logical_date is not None:
        argv.append(f"--logical-date={logical_date.isoformat()}")
    if force:
        argv.append("--force")
    return [*argv, name]


def python() -> str:
    """This virtualenv's Python (a server such as uWSGI is not one: its sys.executable is not)."""
    if "python" in Path(sys.executable).name:
        return sys.executable
    return str(Path(sys.prefix) / "bin" / "python")


def spawn(argv: list[str], action_id: int) -> None:
    """Start `manage.py <argv>` detached (module docstring); returns once it is started."""
    base = conf.base_dir()
    command = [python(), str(base / "manage.py"), *argv]
    env = {**os.environ, actions.ENV_ACTION: str(action_id)}
    subprocess.run(
        ["/bin/sh", "-c", '"$@" &', "cronops-run-now", *command],
        cwd=base,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        check=True,
        timeout=30,
    )
