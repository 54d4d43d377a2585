from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ops import conf
from ops.control import actions, pauses


class Command(BaseCommand):
    help = (
        "Resume a paused job: its next fire runs, and its healthchecks.io check is resumed and "
        "armed (watched from now on). Exit 0 resumed (or not paused), 1 resumed but its check "
        "could not be resumed, 2 usage."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("name", metavar="NAME", help="the job")

    def handle(self, *args, **options):
        with pauses.command_database_errors():
            self.act(*args, **options)

    def act(self, *args, name, **options):
        try:
            conf.validate()
        except conf.SettingError as exc:
            raise CommandError(str(exc), returncode=2) from None
        tz, now = ZoneInfo(settings.TIME_ZONE), timezone.now()
        try:
            job = pauses.lookup(name)
        except pauses.UnknownJob as exc:
            raise CommandError(str(exc), returncode=2) from None
        write = pauses.patient_command_write(self.stderr)
        ended, check = pauses.resume(name, job, by=actions.cli_user(), now=now, tz=tz, write=write)
        if ended is None:
            self.stdout.write(f"{name} is not paused")
        else:
            self.stdout.write(f"resumed {name} (paused {pauses.describe(ended, tz)})")
        from ops.monitors.monitors import pause_notes

        for note in pause_notes(name, job, resumed=True) if ended is not None else []:
            self.stdout.write(note)
        if check is not None:
            line = f"healthchecks.io: {check.note}"
            if not check.ok:
                raise CommandError(line, returncode=1)
            self.stdout.write(line)
