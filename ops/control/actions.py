"""The audit trail (JobAction): every pause, resume, run now and run again, by whom and when; and
the link from a run started on the jobs page to that action (who started it).

The jobs page starts `run_job` with OPS_ACTION_ID=<the action's id> in its environment; that
run_job reads it once (and takes it out of its environment, so its job and anything the job
starts do not carry it), and each run it records gets the action's user as `started_by` and
becomes the action's run. Runs from cron and the shell pay nothing for it: no variable, no query.
"""

import datetime as dt
import getpass
import os

from django.db import transaction

from .. import conf
from ..models import JobAction, JobRun

ENV_ACTION = "OPS_ACTION_ID"
UNTIL = "cronops (--until)"  # the user of a pause that ended by itself


def cli_user() -> str:
    """Who runs a command line: `<unix user>@<OPS_HOST> (command line)`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{user}@{conf.host()} (command line)"[:150]


def record(kind: str, job: str, user: str, now: dt.datetime, **fields) -> JobAction:
    note = fields.pop("note", "")
    return JobAction.objects.create(
        kind=kind, job=job, username=user[:150], at=now, note=note[:500], **fields
    )


def from_environment() -> int | None:
    """The action this run_job was started for (the jobs page), taken out of the environment."""
    value = os.environ.pop(ENV_ACTION, "")
    return int(value) if value.isdigit() else None


def attach(action_id: int | None, run: JobRun) -> None:
    """`run` was started by the action `action_id`: the history says who, the action which run."""
    if action_id is None or run.pk is None:
        return
    user = JobAction.objects.filter(pk=action_id).values_list("username", flat=True).first()
    if user is None:
        return
    run.started_by = user
    with transaction.atomic():
        JobRun.objects.filter(pk=run.pk).update(started_by=user)
        JobAction.objects.filter(pk=action_id).update(run=run)
