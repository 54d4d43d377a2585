"""sync_healthchecks: one healthchecks.io check per scheduled job, so missed runs alert too.

The plan is computed from crontab.d and the checks the API lists, then applied with upserts
(`unique: ["slug"]`, slug = job name). What each check gets:

- `schedule` = the job's five cron fields (`@daily` and friends expanded), `tz` = TIME_ZONE;
  an `@reboot` job becomes a simple check with `timeout` = one year (it cannot be late, it
  can only fail);
- `grace` = the job's grace as job_status computes it (its --timeout, else OPS_DEFAULT_GRACE;
  with --retries and --after, every attempt and wait; at least 60 s, at most the API's year);
- `desc` = the comment above the job, then the marker line `cronops job: <slug>`; `tags` =
  the check's other tags plus the project tag (OPS_HC_TAG, default
  `cronops-<project directory name>`); `methods` = `POST` (cronops pings with POST, so a link
  preview or a crawler fetching a ping URL is not a success);
- `name` = the job name and `channels` = HEALTHCHECKS_CHANNELS (default `*`, all; `""`
  none) when the check is created; an existing check's name and channels are never touched
  (a rename in the web UI stays).

A check is "this project's" when it carries the project tag and its desc's marker names its own
slug: sync created it, or adopted it by slug. The web UI's "Create a Copy" keeps tags and desc
but gives the copy another slug (`<slug>-copy`), so a copy is never this project's. Only this
project's checks whose job is gone are reported stale, and deleted with `prune`.

A job with `--no-ping`, or a `--ping` naming another check (another slug or UUID, or its slug
under another project's ping key or on another server), never pings its slug's check here: it
gets none (a check this project made for it earlier is stale). Made, such a check would stay
`new` for ever (never armed, never alerting), or armed, go down after every slot.

Two checks sharing a job's slug are reported (the API's upsert would update the first, pings
get 409); nothing is changed for that slug.
"""

import datetime as dt
import re
import urllib.parse
from dataclasses import dataclass, field

from .. import conf
from ..schedule.crontabd import Job, Schedule
from ..schedule.durations import format_duration
from ..schedule.tznames import same_rules
from .grace import grace_seconds
from .hcapi import ApiError, HealthchecksAPI, check_uuid
from .hcarm import elsewhere, names_uuid

MAX_SECONDS = 31_536_000  # the API's limit for timeout and grace
REBOOT_TIMEOUT = MAX_SECONDS
COMPARED = ("tags", "desc", "grace", "schedule", "tz", "timeout", "methods")
MARKER = "cronops job: "


def project_tag(settings) -> str:
    """The tag naming this project's checks: OPS_HC_TAG, else from the project directory."""
    explicit = conf.hc_tag(settings)
    if explicit:
        return explicit
    name = re.sub(r"[^a-z0-9_-]+", "-", conf.base_dir(settings).name.lower()).strip("-")
    return f"cronops-{name or 'project'}"


def validate_tag(tag: str) -> str | None:
    if not tag or any(c.isspace() for c in tag) or len(tag) > 100:
        return f"bad OPS_HC_TAG {tag!r}: one word (no spaces), 1-100 characters"
    return None


def with_marker(description: str, slug: str) -> str:
    return (description + "\n\n" if description else "") + MARKER + slug


def marked_slug(desc: str | None) -> str | None:
    """The slug named by the marker line at the end of a check's desc, if any."""
    last = (desc or "").rstrip().rsplit("\n", 1)[-1].strip()
    return last.removeprefix(MARKER).strip() if last.startswith(MARKER) else None


def is_ours(check: dict, tag: str) -> bool:
    """Created or adopted by this project: the tag, and a marker naming the check's own slug."""
    return tag in (check.get("tags") or "").split() and marked_slug(check.get("desc")) == check.get(
        "slug"
    )


def stored_tz_note(changes: list["Change"]) -> str | None:
    """What the server did with TIME_ZONE, once a write showed it stores another name for it
    (its own table: `CET` as `Europe/Brussels`), or None."""
    for change in changes:
        sent, stored = change.spec.get("tz"), (change.check or {}).get("tz")
        if change.action in ("create", "update") and sent and stored and stored != sent:
            return (
                f"note: healthchecks.io stores TIME_ZONE {sent!r} as {stored!r}, a zone with "
                "the same rules: later syncs leave it as it is"
            )
    return None


def desired_spec(job: Job, *, tz: str, tag: str) -> dict:
    spec = {
        "name": job.name,
        "slug": job.name,
        "tags": tag,
        "desc": with_marker(job.description, job.name),
        "grace": int(min(MAX_SECONDS, grace_seconds(job))),
        "methods": "POST",
    }
    if job.cron_expr:
        spec["schedule"] = job.cron_expr
        # As written: the server may store another name for it (its own table), and
        # `diff_check` compares zones by their rules, so nothing is sent twice.
        spec["tz"] = tz
    else:
        spec["timeout"] = REBOOT_TIMEOUT
    return spec


@dataclass
class Change:
    action: str  # create, update, unchanged, delete, stale, duplicate, kept
    slug: str
    spec: dict = field(default_factory=dict)
    diff: list[str] = field(default_factory=list)
    uuid: str | None = None
    check: dict | None = None  # the job's check as listed, then as the API stored it
    job: Job | None = None
    armed: bool = False  # sent (or, in a dry run, would send) the arming ping

    @property
    def writes(self) -> bool:
        return self.action in ("create", "update", "delete")


def _show(key: str, value) -> str:
    if value is None:
        return "-"
    if key in ("grace", "timeout") and isinstance(value, int | float):
        return format_duration(value)
    if key == "desc":
        return repr(value if len(value) <= 40 else value[:37] + "...")
    return repr(value) if isinstance(value, str) else str(value)


def _merge_tags(existing: str, tag: str) -> str:
    words = existing.split()
    return " ".join(words if tag in words else [*words, tag])


def diff_check(spec: dict, check: dict, *, now: dt.datetime) -> list[str]:
    """What an upsert of `spec` would change on `check`, as `key: old → new` lines."""
    changes = []
    for key in COMPARED:
        if key not in spec:
            continue
        old, new = check.get(key), spec[key]
        if key == "tz" and same_rules(old, new, now=now):
            continue  # `CET` here, `Europe/Brussels` on the server: alerts at the same times
        if old != new:
            changes.append(f"{key} {_show(key, old)} → {_show(key, new)}")
    return changes


def pings_elsewhere(job: Job, matches: list[dict], *, ping_url: str, ping_key: str) -> str | None:
    """Why the job's pings never reach its slug's check (`its job pings another check
    (--ping)`), or None: no --no-ping, and no --ping, or one naming that very check (its UUID,
    or its slug with this project's ping key on HEALTHCHECKS_PING_URL's server)."""
    why = elsewhere(job, ping_url, ping_key)
    override = job.options.ping
    if why is None and override and names_uuid(override):
        path = urllib.parse.urlsplit(override).path if "://" in override else override
        last = path.rstrip("/").rsplit("/", 1)[-1].lower()
        if not any(last == (check_uuid(c) or "").lower() for c in matches):
            why = "pings another check (--ping)"
    return f"its job {why}" if why else None


def plan(
    schedule: Schedule,
    checks: list[dict],
    *,
    tag: str,
    tz: str,
    channels: str,
    prune: bool,
    ping_url: str,
    ping_key: str,
    now: dt.datetime,
) -> list[Change]:
    """The changes that make healthchecks.io match crontab.d (zones compared as of `now`).

    `checks` are every check of the healthchecks project: a job's slug may belong to an
    untagged check (e.g. one auto-created by `?create=1`), which is adopted and keeps its name
    and channels, or to several checks, which is reported and left alone.
    """
    by_slug: dict[str, list[dict]] = {}
    for check in checks:
        if check.get("slug"):
            by_slug.setdefault(check["slug"], []).append(check)
    changes: list[Change] = []
    wanted = set()
    stale_why: dict[str, str] = {}  # job: why its check is stale although the job is there
    for job in schedule.jobs:
        matches = by_slug.get(job.name, [])
        why = pings_elsewhere(job, matches, ping_url=ping_url, ping_key=ping_key)
        if why:
            # Never pings its slug's check here: such a check would stay `new` (unarmed, it
            # never alerts) or, armed, go down after every slot.
            stale_why[job.name] = why
            continue
        wanted.add(job.name)
        spec = desired_spec(job, tz=tz, tag=tag)
        if len(matches) > 1:
            shared = ", ".join(f"{check_uuid(c)} {c.get('name')!r}" for c in matches)
            changes.append(Change("duplicate", job.name, {}, [shared]))
            continue
        if not matches:
            spec["channels"] = channels
            kind = f"cron {spec['schedule']!r} {spec['tz']}" if "schedule" in spec else "simple"
            shown = f"channels {channels!r}" if channels else "no channels"
            changes.append(
                Change(
                    "create",
                    job.name,
                    spec,
                    [f"{kind}, grace {format_duration(spec['grace'])}, {shown}"],
                    job=job,
                )
            )
            continue
        current = matches[0]
        del spec["name"]  # set on create only: a rename in the web UI stays
        spec["tags"] = _merge_tags(current.get("tags") or "", tag)
        diff = diff_check(spec, current, now=now)
        action = "update" if diff else "unchanged"
        changes.append(Change(action, job.name, spec, diff, check_uuid(current), current, job))
    for slug in sorted(by_slug):
        if slug in wanted:
            continue
        for check in by_slug[slug]:
            if is_ours(check, tag):
                action = "delete" if prune else "stale"
                reasons = [stale_why[slug]] if slug in stale_why else []
                changes.append(Change(action, slug, {}, reasons, check_uuid(check)))
            elif prune and tag in (check.get("tags") or "").split():
                changes.append(Change("kept", slug, {}, [], check_uuid(check)))
    return changes


def apply(api: HealthchecksAPI, changes: list[Change]) -> None:
    """Perform the writes; raises ApiError on the first failure (earlier writes stay done)."""
    for change in changes:
        if change.action in ("create", "update"):
            created, stored = api.upsert(change.spec)
            change.uuid = check_uuid(stored) or change.uuid
            change.check = stored
            if created and change.action == "update":
                change.action = "create"
        elif change.action == "delete":
            if change.uuid is None:  # never `checks/None`: the command refuses such listings
                raise ApiError(f"deleting check {change.slug!r}: the listing gave no UUID")
            api.delete(change.uuid, change.slug)


def describe(change: Change, tag: str, dry_run: bool) -> str:
    verbs = {
        "create": "would create" if dry_run else "created",
        "update": "would update" if dry_run else "updated",
        "delete": "would delete" if dry_run else "deleted",
    }
    if change.action == "stale":
        why = change.diff[0] if change.diff else "not in crontab.d"
        return f"{'stale':<12} {change.slug}: tagged {tag!r}, {why} (--prune deletes it)"
    if change.action == "duplicate":
        return (
            f"{'duplicate':<12} {change.slug}: checks {change.diff[0]} share this slug (pings get "
            "409): delete or rename all but one in the web UI; nothing was changed for it"
        )
    if change.action == "kept":
        return (
            f"{'kept':<12} {change.slug}: tagged {tag!r} but not created by this project (a copy "
            "made in the web UI?): --prune leaves it alone"
        )
    if change.action == "delete":
        why = change.diff[0] if change.diff else "no such job in crontab.d"
        return f"{verbs['delete']:<12} {change.slug}: tagged {tag!r}, {why}"
    return f"{verbs[change.action]:<12} {change.slug}: {'; '.join(change.diff)}"


def describe_arming(change: Change, when: str, dry_run: bool) -> str:
    verb = "would arm" if dry_run else "armed"
    return f"{verb:<12} {change.slug}: alerts at {when} if no run has pinged by then"


def summary(changes: list[Change], dry_run: bool) -> str:
    count = {a: sum(1 for c in changes if c.action == a) for a in ("create", "update", "delete")}
    armed = sum(1 for c in changes if c.armed)
    unchanged = sum(1 for c in changes if c.action == "unchanged" and not c.armed)
    if not any(count.values()) and not armed:
        return f"healthchecks.io: nothing to change ({unchanged} checks up to date)"
    parts = [
        f"{n} {word}"
        for n, word in (
            (count["create"], "to create" if dry_run else "created"),
            (count["update"], "to update" if dry_run else "updated"),
            (count["delete"], "to delete" if dry_run else "deleted"),
            (armed, "to arm" if dry_run else "armed"),
        )
        if n
    ]
    text = "healthchecks.io: " + ", ".join(parts) + f", {unchanged} unchanged"
    return text + (" (dry run: nothing was changed)" if dry_run else "")
