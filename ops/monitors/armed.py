"""What job_status says healthchecks.io does about a scheduled job that never ran
(ops/monitors/status.py's `never run` reason)."""

import datetime as dt
from zoneinfo import ZoneInfo

from .. import conf
from ..schedule.crontabd import Job
from ..schedule.slots import next_fire
from .grace import grace_seconds
from .status import fmt_time


def armed_note(job: Job | None, now: dt.datetime, tz: ZoneInfo) -> str:
    """What healthchecks.io does about a job that never ran, when the job pings a check: an
    alert is promised only for the check sync_healthchecks arms, the one with the job's slug."""
    if job is None or not job.cron_expr or job.options.no_ping:
        return ""
    if not (job.options.ping or conf.ping_key()):
        return ""  # no pings: healthchecks.io hears nothing of the job
    if job.options.ping:
        from . import hcarm  # only here: it brings the API client (requests)

        why = hcarm.elsewhere(job, conf.ping_url(), conf.ping_key())
        if why is not None:
            # sync makes and arms no check for it, and the server never alerts on a check that
            # was never pinged (`new`).
            return (
                f"; it {why}: sync_healthchecks arms only the check with the job's slug, and "
                "healthchecks.io never alerts on a check before its first ping"
            )
        if hcarm.names_uuid(job.options.ping):
            # Whether the UUID is the slug's own check only the API can tell (sync arms it
            # then); job_status makes no request.
            return (
                "; it pings the check its --ping UUID names, which alerts on a slot that passes "
                "without a run only once armed: sync_healthchecks arms it when it is the check "
                "with the job's slug, and healthchecks.io never alerts on a check before its "
                "first ping"
            )
    # The server's rule once a check is armed (ops/monitors/hcarm.py): the first fire time
    # after its last ping, plus the grace, in UTC.
    first = next_fire(job.cron_expr, now, tz).astimezone(dt.UTC)
    alert = first + dt.timedelta(seconds=grace_seconds(job))
    return (
        "; once sync_healthchecks has armed its healthchecks.io check, a slot that passes "
        f"without a run alerts one grace later (the next: {fmt_time(alert, tz)})"
    )
