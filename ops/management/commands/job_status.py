import json
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone

from ops import status
from ops.crontabd import CrontabError, load_schedule


class Command(BaseCommand):
    help = (
        "One row per job (crontab.d and the run history): schedule, next fire time, last "
        "success, last outcome, durations, start lag, failure streak and state. Exit 0 when "
        "every job is ok or running, 1 otherwise."
    )

    # A monitoring probe reports the jobs even when a system check (time zone, pings) fails:
    # install_crontab and `manage.py check` are where those errors stop a deploy.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--job", metavar="NAME", help="only this job")
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="print JSON (see the README)"
        )

    def handle(self, *args, job=None, as_json=False, **options):
        try:
            status.default_grace()
        except ValueError as exc:
            raise CommandError(f"OPS_DEFAULT_GRACE: {exc}", returncode=2) from None
        try:
            schedule = load_schedule()
        except CrontabError as exc:
            raise CommandError(str(exc), returncode=2) from None
        try:
            report = status.collect(
                schedule, now=timezone.now(), tz=ZoneInfo(settings.TIME_ZONE), only=job
            )
        except status.UnknownJob as exc:
            raise CommandError(str(exc), returncode=2) from None
        except DatabaseError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CommandError(f"cannot read the run history: {first}", returncode=2) from None
        if as_json:
            self.stdout.write(json.dumps(status.to_json(report), indent=2))
        else:
            self.stdout.write(status.render_table(report))
        if not report.healthy:
            raise SystemExit(1)
