"""What the healthchecks server will make of a job's pings, as sync_healthchecks sees its check.

- "Filter by HTTP body" (`filter_http_body` in the API's listing): the server then decides
  every ping by keywords in its body, whatever its URL says (hc/api/views.py, `ping`): a
  failure keyword → failure, else a success keyword → success, else a start keyword → start,
  else a failure with `filter_default_fail`, else ignored. Keywords are comma-separated and
  matched as substrings. cronops sends the end of the output (the server keeps the first
  `Ping-Body-Limit` bytes of a body, so cronops cuts it itself) and an empty `/start`.
- Arming: the server evaluates a check's schedule only once it has had a success or failure
  ping (hc/api/models.py: `get_grace_start` is None for a `new` check, so it never goes down,
  and a `/start` would make it due one grace after the sync, not after a slot). A success
  makes it `up`, due at the schedule's first fire time after that ping, down one grace later,
  with no alert for new → up. So sync sends one success to each `new` cron check it keeps,
  by the check's own UUID ping URL, saying in its body that it is not a run. It leaves alone
  a check that has been pinged (up, late or down: a success would hide a real failure), a
  paused one (a ping would resume it), an @reboot job's (no slot to miss), and one its job
  does not ping: no ping key, or pings that go to another server or project (armed, it would
  go down after every slot).
"""

import datetime as dt
import re
import urllib.parse
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from cronsim import CronSim

from ..schedule.crontabd import Job
from .hcapi import check_uuid

UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
NO_KEY = "no ping key"  # the reason shared by every job: said once, naming them all


def keywords(value: str | None) -> list[str]:
    """The server's keyword list: comma-separated, blanks dropped."""
    return [k.strip() for k in (value or "").split(",") if k.strip()]


def filter_warning(check: dict) -> str | None:
    """One line saying what the check's body filter does to the job's pings, or None."""
    if not check.get("filter_http_body"):
        return None
    failure, success, start = (
        ", ".join(map(repr, keywords(check.get(k))))
        for k in ("failure_kw", "success_kw", "start_kw")
    )
    default_fail = bool(check.get("filter_default_fail"))
    rules = [
        f"{kw} → {what}"
        for kw, what in ((failure, "failure"), (success, "success"), (start, "start"))
        if kw
    ]
    other = "failure" if default_fail else "ignored"
    rules.append(
        f"anything else → {other}" if rules else f"no keyword is set: every ping → {other}"
    )
    effects = []
    if success:
        effects.append(f"a failed run whose output has {success} counts as a success")
    if default_fail:
        effects.append("the empty /start is a failure, so every run alerts")
    else:
        effects.append(
            "a run whose output has no keyword changes nothing (a failure never alerts, a "
            "success never counts)"
        )
        effects.append("the empty /start is ignored (no duration)")
    if failure or success:
        effects.append(
            "only the end of the output is sent: a keyword printed before it is cut away"
        )
    slug = check.get("slug") or ""
    return (
        f"warning: check {check.get('name') or slug!r} ({slug}) filters by HTTP body: a ping's "
        f"body decides what it is, not its exit status ({'; '.join(rules)}): "
        f"{'; '.join(effects)}. Turn keyword filtering of HTTP bodies off in the check's "
        "Filtering Rules (or set filter_http_body to false through the API) to keep the exit "
        "status authoritative"
    )


def base_of(url: str) -> str:
    """Where a ping URL's last parts sit, comparable across spellings: `host[:port]/path/`."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    default = {"http": 80, "https": 443}.get(parts.scheme)
    netloc = host if parts.port in (None, default) else f"{host}:{parts.port}"
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return netloc + path


@dataclass(frozen=True)
class Target:
    """Where a job's pings go: the base URL (`base_of`), and the project's ping key in a slug
    URL (None for a UUID URL)."""

    base: str
    key: str | None


def job_target(job: Job, ping_url: str, ping_key: str) -> Target | None:
    """Where run_job sends the job's pings (ops/monitors/pings.py, `check_url`); None when its
    runs send none."""
    override = job.options.ping
    if job.options.no_ping:
        return None
    if not override:
        return Target(base_of(ping_url), ping_key) if ping_key else None
    if "://" not in override:  # a UUID, under HEALTHCHECKS_PING_URL
        return Target(base_of(ping_url), None)
    parts = urllib.parse.urlsplit(override)
    path = parts.path.rstrip("/").split("/")
    if UUID.match(path[-1]):
        return Target(base_of(parts._replace(path="/".join(path[:-1])).geturl()), None)
    return Target(base_of(parts._replace(path="/".join(path[:-2])).geturl()), path[-2])


def names_uuid(override: str) -> bool:
    """Whether a --ping value names a check by its UUID (a bare UUID, or a URL ending in one)."""
    path = urllib.parse.urlsplit(override).path if "://" in override else override
    return bool(UUID.match(path.rstrip("/").rsplit("/", 1)[-1]))


def elsewhere(job: Job, ping_url: str, ping_key: str) -> str | None:
    """Why the job's pings never reach the check with its slug in this project, told from its
    options (`pings another check (--ping)`); None when they may. A `--ping` UUID gives None:
    only the API's listing tells whether it is the check with the job's slug."""
    if job.options.no_ping:
        return "pings no check (--no-ping)"
    override = job.options.ping
    if not override:
        return None
    if names_uuid(override):
        return None
    # A slug ping URL (crontabd accepts a UUID or an http(s) URL): .../<ping key>/<slug>
    target = job_target(job, ping_url, ping_key)
    assert target is not None  # a --ping URL, and pings on
    if urllib.parse.urlsplit(override).path.rstrip("/").rsplit("/", 1)[-1] != job.name:
        return "pings another check (--ping)"
    if target.base != base_of(ping_url):
        return f"pings another server (its --ping URL is not under {base_of(ping_url)})"
    if ping_key and target.key != ping_key:
        return "pings a check of another project (its --ping URL holds another ping key)"
    return None


def server_base(check: dict | None) -> str | None:
    """The base of the server's own ping URLs, from a listed check's `ping_url`."""
    url, code = (check or {}).get("ping_url") or "", check_uuid(check or {})
    return base_of(url.removesuffix(code)) if code and url.endswith(code) else None


def arming_body(job: Job, check: dict | None) -> bytes | None:
    """The arming ping's body; None when a body filter would not take it as a success."""
    text = (
        f"cronops: armed by sync_healthchecks, not a run of {job.name}: from now on a slot "
        "that passes without a run alerts one grace later"
    )
    if check and check.get("filter_http_body"):
        success = keywords(check.get("success_kw"))
        if not success:
            return None
        text += f"\n{success[0]}"
        failures = keywords(check.get("failure_kw"))
        if any(k.lower() in text.lower() for k in failures):
            return None
    return text.encode()


@dataclass
class Arming:
    """Which of the jobs' checks sync arms, and when each then alerts."""

    ping_url: str
    ping_key: str
    tz: ZoneInfo

    def refusal(self, job: Job, check: dict | None) -> str | None:
        """None: arm the job's check (`check`: as listed or stored; None: to be created).
        Else why not: "" when nothing needs saying (armed already, paused, @reboot)."""
        if not job.cron_expr:
            return ""  # an @reboot job: no slot to miss
        if check is not None and check.get("status") != "new":
            return ""  # pinged already (its own pings decide), or paused on purpose
        if check is not None and not check.get("ping_url"):
            return "the API gave no ping URL for its check"
        target = job_target(job, self.ping_url, self.ping_key)
        if target is None:
            return NO_KEY
        server = server_base(check)
        if server is not None and target.base != server:
            host, theirs = target.base.split("/", 1)[0], server.split("/", 1)[0]
            if host == theirs:
                return f"its pings go to {target.base}, not to {server} where its check is"
            return f"its pings go to {host}, not to this API's server ({theirs})"
        if target.key and self.ping_key and target.key != self.ping_key:
            return "its --ping URL holds another ping key than HEALTHCHECKS_PING_KEY"
        if arming_body(job, check) is None:
            return (
                "its check filters by HTTP body without a success keyword that an arming "
                "ping could carry"
            )
        return None

    def alerts_at(self, job: Job, grace: int, now: dt.datetime) -> str:
        """When an armed check alerts if no run pings it: the first fire time after `now`, plus
        the grace (the server's `going_down_after`), in TIME_ZONE."""
        assert job.cron_expr is not None, "only cron checks are armed"
        first = next(CronSim(job.cron_expr, now.astimezone(self.tz))).astimezone(dt.UTC)
        alert = (first + dt.timedelta(seconds=grace)).astimezone(self.tz)  # in UTC, as it does
        return alert.strftime("%Y-%m-%d %H:%M")
