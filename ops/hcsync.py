"""sync_healthchecks: one healthchecks.io check per scheduled job, so missed runs alert too.

The plan is computed from crontab.d and the checks the API lists, then applied with upserts
(`unique: ["slug"]`, slug = job name). What each check gets:

- `schedule` = the job's five cron fields (`@daily` and friends expanded), `tz` = TIME_ZONE;
  an `@reboot` job becomes a simple check with `timeout` = one year (it cannot be late, it
  can only fail);
- `grace` = the job's grace as job_status computes it (its --timeout, else OPS_DEFAULT_GRACE,
  at least 60 s, at most the API's one year);
- `desc` = the comment above the job; `tags` = the check's other tags plus the project tag
  (OPS_HC_TAG, default `cronops-<project directory name>`);
- `channels` = HEALTHCHECKS_CHANNELS (default `*`, all) when the check is created; an existing
  check's channels are never touched.

Checks carrying the project tag whose job is gone are reported, and deleted with `prune`.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

from .crontabd import Job, Schedule
from .durations import format_duration
from .hcapi import HealthchecksAPI, check_uuid
from .status import grace_seconds

MAX_SECONDS = 31_536_000  # the API's limit for timeout and grace
REBOOT_TIMEOUT = MAX_SECONDS
COMPARED = ("name", "tags", "desc", "grace", "schedule", "tz", "timeout")


def project_tag(settings) -> str:
    """The tag naming this project's checks: OPS_HC_TAG, else from the project directory."""
    explicit = getattr(settings, "OPS_HC_TAG", "")
    if explicit:
        return explicit
    name = re.sub(r"[^a-z0-9_-]+", "-", Path(settings.BASE_DIR).name.lower()).strip("-")
    return f"cronops-{name or 'project'}"


def validate_tag(tag: str) -> str | None:
    if not tag or any(c.isspace() for c in tag) or len(tag) > 100:
        return f"bad OPS_HC_TAG {tag!r}: one word (no spaces), 1-100 characters"
    return None


def desired_spec(job: Job, *, tz: str, tag: str) -> dict:
    spec = {
        "name": job.name,
        "slug": job.name,
        "tags": tag,
        "desc": job.description,
        "grace": int(min(MAX_SECONDS, grace_seconds(job))),
    }
    if job.cron_expr:
        spec["schedule"] = job.cron_expr
        spec["tz"] = tz
    else:
        spec["timeout"] = REBOOT_TIMEOUT
    return spec


@dataclass
class Change:
    action: str  # create, update, unchanged, delete, stale
    slug: str
    spec: dict = field(default_factory=dict)
    diff: list[str] = field(default_factory=list)
    uuid: str | None = None

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


def diff_check(spec: dict, check: dict) -> list[str]:
    """What an upsert of `spec` would change on `check`, as `key: old → new` lines."""
    changes = []
    for key in COMPARED:
        if key not in spec:
            continue
        old, new = check.get(key), spec[key]
        if old != new:
            changes.append(f"{key} {_show(key, old)} → {_show(key, new)}")
    return changes


def plan(
    schedule: Schedule,
    tagged: list[dict],
    others: list[dict] | None,
    *,
    tag: str,
    tz: str,
    channels: str,
    prune: bool,
) -> list[Change]:
    """The changes that make healthchecks.io match crontab.d.

    `tagged` are the checks listed with the project tag; `others` every check of the
    healthchecks project (only needed when a job has no tagged check yet: an untagged check
    with its slug, e.g. one auto-created by `?create=1`, is adopted and keeps its channels).
    """
    by_slug = {c.get("slug"): c for c in tagged if c.get("slug")}
    other_by_slug = {c.get("slug"): c for c in (others or []) if c.get("slug")}
    changes: list[Change] = []
    wanted = set()
    for job in schedule.jobs:
        wanted.add(job.name)
        spec = desired_spec(job, tz=tz, tag=tag)
        current = by_slug.get(job.name) or other_by_slug.get(job.name)
        if current is None:
            spec["channels"] = channels
            kind = f"cron {spec['schedule']!r} {tz}" if "schedule" in spec else "simple"
            changes.append(
                Change(
                    "create",
                    job.name,
                    spec,
                    [f"{kind}, grace {format_duration(spec['grace'])}, channels {channels!r}"],
                )
            )
            continue
        spec["tags"] = _merge_tags(current.get("tags") or "", tag)
        diff = diff_check(spec, current)
        action = "update" if diff else "unchanged"
        changes.append(Change(action, job.name, spec, diff, check_uuid(current)))
    for slug, check in sorted(by_slug.items()):
        if slug in wanted:
            continue
        action = "delete" if prune else "stale"
        changes.append(Change(action, slug, {}, [], check_uuid(check)))
    return changes


def needs_full_list(schedule: Schedule, tagged: list[dict]) -> bool:
    slugs = {c.get("slug") for c in tagged}
    return any(job.name not in slugs for job in schedule.jobs)


def apply(api: HealthchecksAPI, changes: list[Change]) -> None:
    """Perform the writes; raises ApiError on the first failure (earlier writes stay done)."""
    for change in changes:
        if change.action in ("create", "update"):
            created, stored = api.upsert(change.spec)
            change.uuid = check_uuid(stored) or change.uuid
            if created and change.action == "update":
                change.action = "create"
        elif change.action == "delete":
            api.delete(change.uuid, change.slug)


def describe(change: Change, tag: str, dry_run: bool) -> str:
    verbs = {
        "create": "would create" if dry_run else "created",
        "update": "would update" if dry_run else "updated",
        "delete": "would delete" if dry_run else "deleted",
    }
    if change.action == "stale":
        return f"{'stale':<12} {change.slug}: tagged {tag!r}, not in crontab.d (--prune deletes it)"
    if change.action == "delete":
        return f"{verbs['delete']:<12} {change.slug}: tagged {tag!r}, no such job in crontab.d"
    return f"{verbs[change.action]:<12} {change.slug}: {'; '.join(change.diff)}"


def summary(changes: list[Change], dry_run: bool) -> str:
    count = {a: sum(1 for c in changes if c.action == a) for a in ("create", "update", "delete")}
    unchanged = sum(1 for c in changes if c.action == "unchanged")
    if not any(count.values()):
        return f"healthchecks.io: nothing to change ({unchanged} checks up to date)"
    parts = [
        f"{n} {word}"
        for n, word in (
            (count["create"], "to create" if dry_run else "created"),
            (count["update"], "to update" if dry_run else "updated"),
            (count["delete"], "to delete" if dry_run else "deleted"),
        )
        if n
    ]
    text = "healthchecks.io: " + ", ".join(parts) + f", {unchanged} unchanged"
    return text + (" (dry run: nothing was changed)" if dry_run else "")
