from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ops import conf
from ops.monitors import hcapi, hcarm, hcsync
from ops.monitors.hcapi import ApiError, HealthchecksAPI
from ops.monitors.pings import PingConfig, Pinger
from ops.schedule.crontabd import CrontabError, load_schedule

EXIT_API = 1
EXIT_USAGE = 2


class Command(BaseCommand):
    help = (
        "Create or update one healthchecks.io check per job in crontab.d (Management API v3: "
        "HEALTHCHECKS_API_URL, HEALTHCHECKS_API_KEY), so a run that never starts alerts too."
    )
    requires_system_checks = []  # it checks what it needs; a broken .env mode must not block it

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="show what would change, change nothing"
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="delete this project's checks (created or adopted by sync_healthchecks) whose "
            "job is no longer in crontab.d",
        )

    def handle(self, *args, dry_run=False, prune=False, verbosity=1, **options):
        try:
            conf.validate()
        except conf.SettingError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from None
        if not conf.api_key():
            raise CommandError(
                "HEALTHCHECKS_API_KEY is not set: put the project's read-write API key "
                "(healthchecks.io → Project Settings → API Access) in .env",
                returncode=EXIT_USAGE,
            )
        tag = hcsync.project_tag(settings)
        problem = hcsync.validate_tag(tag)
        if problem:
            raise CommandError(problem, returncode=EXIT_USAGE)
        try:
            schedule = load_schedule()
        except CrontabError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from None
        if prune and not schedule.jobs:
            raise CommandError(
                "crontab.d has no jobs: refusing to --prune every check of the project",
                returncode=EXIT_USAGE,
            )
        api = HealthchecksAPI(conf.api_url(), conf.api_key())
        try:
            # Every check of the project, once: duplicates and untagged checks with a job's
            # slug must be seen too.
            checks = api.list_checks()
            if hcapi.read_only_listing(checks) or (not checks and not api.can_write()):
                # Refused before anything is written: with this key a listing looks fine and
                # every write answers 401.
                raise ApiError(hcapi.READ_ONLY)
            changes = hcsync.plan(
                schedule,
                checks,
                tag=tag,
                tz=settings.TIME_ZONE,
                channels=conf.channels(),
                prune=prune,
                ping_url=conf.ping_url(),
                ping_key=conf.ping_key(),
                now=timezone.now(),
            )
            for change in changes:
                warning = hcarm.filter_warning(change.check or {})
                if warning:
                    self.stderr.write(warning)
            arming = hcarm.Arming(conf.ping_url(), conf.ping_key(), ZoneInfo(settings.TIME_ZONE))
            refused: dict[str, list[str]] = {}
            if not dry_run:
                self._apply(api, changes, tag, arming, refused)
        except ApiError as exc:
            raise CommandError(f"healthchecks.io: {exc}", returncode=EXIT_API) from None
        for change in changes:
            if change.action == "unchanged":
                if verbosity > 1:
                    self.stdout.write(f"{'unchanged':<12} {change.slug}")
            elif change.action == "kept" and not dry_run and verbosity < 2:
                pass  # a copy made in the web UI: said by --dry-run and -v2, not on every run
            elif dry_run or change.action in ("stale", "duplicate", "kept"):
                self.stdout.write(hcsync.describe(change, tag, dry_run))
            if dry_run:
                self._arm(change, arming, refused, dry_run=True)
        for why, names in refused.items():
            self.stderr.write(not_armed(why, names))
        if note := hcsync.stored_tz_note(changes):
            self.stderr.write(note)  # stderr: stdout's "nothing to change" stays true
        self.stdout.write(hcsync.summary(changes, dry_run))
        shared = [c.slug for c in changes if c.action == "duplicate"]
        if shared:
            raise CommandError(
                f"healthchecks.io: several checks share the slug of job(s) {', '.join(shared)}: "
                "delete or rename the extra checks (nothing was changed for those jobs)",
                returncode=EXIT_API,
            )

    def _apply(self, api, changes, tag, arming, refused):
        """Write the changes one by one, printing each as it is done, and arm the checks."""
        for change in changes:
            if change.writes:
                hcsync.apply(api, [change])
                self.stdout.write(self.style.SUCCESS(hcsync.describe(change, tag, dry_run=False)))
            self._arm(change, arming, refused, dry_run=False)

    def _arm(self, change, arming, refused, *, dry_run):
        """Arm the job's `new` check (ops/monitors/hcarm.py): one success that is not a run."""
        job = change.job
        if job is None or change.action not in ("create", "update", "unchanged"):
            return
        why = arming.refusal(job, change.check)
        if why:
            refused.setdefault(why, []).append(job.name)
        if why is not None:
            return
        if not dry_run:
            pinger = Pinger(PingConfig.from_settings(), job.name, override=change.check["ping_url"])
            problem = pinger.arm(hcarm.arming_body(job, change.check) or b"")
            if problem:
                raise ApiError(f"arming check {job.name!r}: {problem}")
        change.armed = True
        when = arming.alerts_at(job, change.spec["grace"], timezone.now())
        self.stdout.write(hcsync.describe_arming(change, when, dry_run))


def not_armed(why: str, names: list[str]) -> str:
    """One warning for the jobs whose checks are not armed for one reason."""
    many = len(names) > 1
    if why == hcarm.NO_KEY:
        why = (
            f"HEALTHCHECKS_PING_KEY is not set, so {'their' if many else 'its'} runs send no "
            "pings (an armed check would go down after its first slot)"
        )
    elif many:
        why = why.replace("its ", "their ", 1)
    return f"warning: {', '.join(names)}: check{'s' if many else ''} not armed: {why}"
