"""A job's grace: how long after its slot its run may take before it counts as overdue.

job_status, healthchecks.io's check (sync_healthchecks) and Sentry's monitor all derive their
limits from it. A module of its own, light to import: run_job reads it for each run with
Sentry on, and job_status's module is not light.
"""

from .. import conf

MIN_GRACE = 60.0  # healthchecks.io's minimum grace
DEFAULT_GRACE = 3600.0


def default_grace() -> float:
    """OPS_DEFAULT_GRACE (settings, from the environment / .env), default one hour."""
    grace = conf.default_grace()  # at most 365 days, like --timeout (ops/conf.py)
    return DEFAULT_GRACE if grace is None else grace


def grace_seconds(job) -> float:
    """How long after a slot its run may take before the job counts as overdue: its --timeout
    for each attempt (--retries) plus the waits between them and --after's, else
    OPS_DEFAULT_GRACE for the whole run plus those waits (`job`: a crontab.d Job, or None)."""
    if job is None:
        return max(MIN_GRACE, default_grace())
    from ..run.retries import longest_run  # only for a declared job: job_status stays lean

    timeout = job.options.timeout
    if timeout:
        return max(MIN_GRACE, longest_run(job.options, timeout))
    return max(MIN_GRACE, default_grace() + longest_run(job.options, 0.0))
