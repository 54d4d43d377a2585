"""A paused job's healthchecks.io check: paused with it, resumed with it (job_pause, job_resume).

The server's rules (hc/api/models.py `Check.ping`, hc/api/views.py `pause` and `resume`):

- `POST /api/v3/checks/<uuid>/pause`: status `paused`, no alerts; its `last_start` is cleared.
- A ping to a paused check resumes it (a success makes it `up`, a failure `down`, alerting),
  unless the check has `manual_resume`: then every ping is ignored while it is paused. A `/log`
  never changes the status.
- `POST .../resume` (409 unless paused): status `new`, `last_ping` cleared. A `new` check is
  evaluated against its schedule only once a success or failure reaches it: until then it
  never goes down (ops/monitors/hcarm.py).

So a pause sets `manual_resume` on the check (remembering what it was) before pausing it: while
the job is paused nothing it sends can page anyone, the `/fail` of a run_job that cannot reach
the database (it cannot tell that its job is paused) included. When the pause ends, the check's
own `manual_resume` comes back, the check is resumed and then armed (one success ping that is
not a run, as sync_healthchecks arms a new check), so it is watched at once: a slot that then
passes without a run alerts one grace later.
"""

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from .. import conf
from ..schedule.crontabd import Job
from .hcapi import ApiError, HealthchecksAPI, check_uuid, read_only_listing
from .hcarm import UUID, Arming, base_of, job_target

# A pause is a person's command, and a lifted --until delays a job's start: short timeouts.
TIMEOUT = (3.0, 8.0)


@dataclass
class CheckResult:
    note: str  # one line: what happened on healthchecks.io, or why nothing did
    ok: bool = True  # False: a call failed (the server may still page)
    uuid: str = ""
    paused: bool = False  # the check is paused by this pause on the server now
    manual_resume: bool | None = None  # the check's own, before the pause set it


def api() -> HealthchecksAPI | None:
    key = conf.api_key()
    return HealthchecksAPI(conf.api_url(), key, timeout=TIMEOUT) if key else None


class NotPaused(Exception):
    """The job pings a check here, but it cannot be paused: the message says why (exit 1)."""


READ_ONLY = (
    "HEALTHCHECKS_API_KEY is the project's read-only API key: pausing needs its read-write key "
    "(Project Settings → API Access)"
)


def locate(client: HealthchecksAPI, name: str, job: Job | None) -> tuple[dict | None, str]:
    """The check the job's runs ping, through the API; else (None, why the job pings none that
    could be paused here). NotPaused when it pings one that this key cannot pause."""
    if job is not None:
        target = job_target(job, conf.ping_url(), conf.ping_key())
        if target is None:
            if job.options.no_ping:
                return None, "the job sends no pings (--no-ping): no check to pause"
            return None, "HEALTHCHECKS_PING_KEY is not set: the job pings no check"
        override = job.options.ping or ""
        last = override.rstrip("/").rsplit("/", 1)[-1]
        if UUID.match(last):
            check = client.get_check(last.lower())
            if read_only_listing([check]):
                raise NotPaused(READ_ONLY)
            return check, ""
        if target.key and target.key != conf.ping_key():
            return None, "its --ping URL holds another ping key: pause its check in that project"
        if target.key and target.base != base_of(conf.ping_url()):
            return None, "its --ping URL is on another server: pause its check there"
        slug = last if override else name
    elif not conf.ping_key():
        return None, "HEALTHCHECKS_PING_KEY is not set: the job pings no check"
    else:
        slug = name
    found = client.checks_with_slug(slug)
    if read_only_listing(found) or (not found and not client.can_write()):
        raise NotPaused(READ_ONLY)
    if not found:
        raise NotPaused(
            f"no check with the slug {slug!r} on healthchecks.io (run sync_healthchecks)"
        )
    if len(found) > 1:
        raise NotPaused(
            f"{len(found)} checks share the slug {slug!r} (its pings get 409): delete or rename "
            "all but one in the web UI"
        )
    return found[0], ""


def pause_check(name: str, job: Job | None) -> CheckResult:
    client = api()
    if client is None:
        return CheckResult("HEALTHCHECKS_API_KEY is not set: its check (if any) is not paused")
    result = CheckResult("")
    try:
        check, why = locate(client, name, job)
        if check is None:
            return CheckResult(why)
        result.uuid = check_uuid(check) or ""
        slug = check.get("slug") or name
        if not check.get("manual_resume"):
            # First: from here on no ping of the job can resume (and so page) the check.
            client.update(result.uuid, {"manual_resume": True}, slug)
            result.manual_resume = False
        client.pause(result.uuid, slug)
    except NotPaused as exc:
        result.ok, result.note = False, f"its check was not paused: {exc}"
        return result
    except ApiError as exc:
        result.ok, result.note = False, f"could not pause its check: {exc}"
        return result
    result.paused = True
    result.note = f"paused its check {slug!r}; its pings are ignored while paused (manual_resume)"
    return result


def resume_check(
    name: str,
    job: Job | None,
    *,
    uuid: str,
    paused: bool,
    manual_resume: bool | None,
    tz: ZoneInfo,
    now: dt.datetime,
    arming_note: str,
) -> CheckResult:
    """Give the check its own manual_resume back, resume it and arm it (a success that is not a
    run: a resumed check is `new`, which the server never evaluates until it is pinged)."""
    from .pings import PingConfig, Pinger  # only here: run_job's start-up stays lean

    client = api()
    if client is None:
        return CheckResult(
            "HEALTHCHECKS_API_KEY is not set: its check stays paused (resume it in the web UI)",
            ok=False,
            uuid=uuid,
            paused=paused,
            manual_resume=manual_resume,
        )
    try:
        if manual_resume is False:
            # First: should the resume fail, the job's next ping resumes it (the server's rule).
            client.update(uuid, {"manual_resume": False}, name)
        check = client.resume(uuid, name) if paused else None
        if check is None:
            check = client.get_check(uuid)
    except ApiError as exc:
        return CheckResult(
            f"could not resume its check: {exc}",
            ok=False,
            uuid=uuid,
            paused=paused,
            manual_resume=manual_resume,
        )
    note = f"resumed its check {check.get('slug') or name!r}"
    if job is None or check.get("status") != "new":
        return CheckResult(note, uuid=uuid)
    arming = Arming(conf.ping_url(), conf.ping_key(), tz)
    if arming.refusal(job, check) is not None:
        return CheckResult(note + " (not armed: it is `new` until the job's next run pings it)")
    body = f"cronops: {arming_note}, not a run of {job.name}"
    problem = Pinger(PingConfig.from_settings(), name, override=check["ping_url"]).arm(
        body.encode()
    )
    if problem:
        return CheckResult(f"{note}, but could not arm it ({problem})", ok=False, uuid=uuid)
    when = arming.alerts_at(job, int(check.get("grace") or 0), now)
    return CheckResult(f"{note} and armed it: alerts at {when} if no run has pinged by then")
