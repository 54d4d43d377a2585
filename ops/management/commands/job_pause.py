from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ops import conf
from ops.control import actions, pauses
from ops.control.until import SPELLINGS, parse_until


class Command(BaseCommand):
    help = (
        "Pause a job: its fires run nothing (each slot is recorded once as a skip with the "
        "reason, exit 0, and catch-up never replays it) and its healthchecks.io check is paused, "
        "until job_resume or --until. Exit 0 paused, 1 paused but its check could not be paused, "
        "2 usage."
    )
    requires_system_checks = []  # like job_status: an operator's tool must work when checks fail

    def add_arguments(self, parser):
        parser.add_argument("name", metavar="NAME", help="the job (crontab.d or the history)")
        parser.add_argument(
            "--until",
            metavar="WHEN",
            help=f"end the pause by itself then: {SPELLINGS}, in TIME_ZONE",
        )
        parser.add_argument("--reason", default="", metavar="TEXT", help="why (shown everywhere)")

    def handle(self, *args, **options):
        with pauses.command_database_errors():
            self.act(*args, **options)

    def act(self, *args, name, until=None, reason="", **options):
        try:
            conf.validate()
        except conf.SettingError as exc:
            raise CommandError(str(exc), returncode=2) from None
        tz, now = ZoneInfo(settings.TIME_ZONE), timezone.now()
        try:
            job = pauses.lookup(name)
            end = parse_until(until, now, tz) if until is not None else None
        except (pauses.UnknownJob, ValueError) as exc:
            raise CommandError(str(exc), returncode=2) from None
        write = pauses.patient_command_write(self.stderr)
        pause, check = pauses.pause(
            name, job, by=actions.cli_user(), until=end, reason=reason, now=now, tz=tz, write=write
        )
        if pause.since != now:
            self.stdout.write(f"{name} was paused already; now paused {pauses.describe(pause, tz)}")
        else:
            self.stdout.write(f"paused {name} {pauses.describe(pause, tz)}")
        from ops.monitors.monitors import pause_notes

        for note in pause_notes(name, job):
            self.stdout.write(note)
        if check is not None:
            line = f"healthchecks.io: {check.note}"
            if not check.ok:
                raise CommandError(f"{line} (the job is paused)", returncode=1)
            self.stdout.write(line)
