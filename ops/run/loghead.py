"""The header line of each run in a `--log` file (installed lines log to var/log/<job>.log):

    === 2026-12-03 03:00:02 MSK  charge_daily  slot 2026-12-03  run #412  cron ===

the run's start in TIME_ZONE, the job, the slot's key (`-` without one), the history row's id
and how it was started (JobRun.started_how), so that one run's output is told from the next's
and found with grep. It goes to the log only (never on a terminal, never in the output tail or
a ping), before what the run prints: at the start of each attempt, of each catch-up slot and
before a skip's line; under --quiet, only before what a failure prints.
"""

from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from django.conf import settings

from ..models import JobRun
from .output import write_fd

if TYPE_CHECKING:
    from .runner import Runner


def header(run: JobRun, tz: ZoneInfo) -> str:
    started = run.started_at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z")
    return (
        f"=== {started}  {run.job}  slot {run.slot or '-'}  run #{run.pk}  {run.started_how} ===\n"
    )


def write(runner: "Runner", run: JobRun | None, printed: bool = False) -> None:
    """The header of `run`, when run_job's output is its --log file: at its start, or under
    --quiet once something of it is `printed` (a failure's output, a skip's line)."""
    if not (printed or not runner.opts.quiet):
        return
    if runner.logged and run is not None and run.pk is not None:
        write_fd(1, header(run, ZoneInfo(settings.TIME_ZONE)))
