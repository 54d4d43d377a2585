from django.core.management.base import BaseCommand, CommandError

from ops import conf
from ops.schedule.crontab_text import EXIT_CRONTABD, EXIT_WOULD_CHANGE, InstallError
from ops.schedule.installer import install_crontab


class Command(BaseCommand):
    help = (
        "Install crontab.d/ as this project's block in the user's crontab (every other line is "
        "kept byte for byte). Exit codes: 0 installed or up to date, 1 --check found a change, "
        "2 crontab.d error, 3 time-zone mismatch, 4 the crontab could not be read or written."
    )
    requires_system_checks = []  # it validates what it needs and refuses on its own terms

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="print a unified diff only")
        parser.add_argument(
            "--check", action="store_true", help="change nothing; exit 1 if an install would"
        )
        parser.add_argument("--remove", action="store_true", help="take this project's block out")
        parser.add_argument("--user", metavar="NAME", help="install for this user (needs root)")
        parser.add_argument("--tabfile", metavar="PATH", help="work on a file, not a crontab")
        parser.add_argument(
            "--dispatcher",
            action="store_true",
            help="one line a minute (run_due_jobs) starts the due jobs, instead of a line per "
            "job; install without it to switch back",
        )
        parser.add_argument(
            "--allow-tz-mismatch",
            action="store_true",
            help="install although the system time zone differs from TIME_ZONE",
        )

    def handle(self, *args, **options):
        try:
            conf.validate()
            result = install_crontab(
                user=options["user"],
                tabfile=options["tabfile"],
                dry_run=options["dry_run"],
                check=options["check"],
                remove=options["remove"],
                allow_tz_mismatch=options["allow_tz_mismatch"],
                dispatcher=options["dispatcher"],
            )
        except InstallError as exc:
            raise CommandError(str(exc), returncode=exc.returncode) from None
        except conf.SettingError as exc:
            raise CommandError(str(exc), returncode=EXIT_CRONTABD) from None
        for line in result.lines[:-1]:
            self.stdout.write(line, ending="\n")
        last = result.lines[-1]
        if options["check"] and result.changed:
            raise CommandError(
                f"crontab not up to date: would have {result.message}",
                returncode=EXIT_WOULD_CHANGE,
            )
        self.stdout.write(self.style.SUCCESS(last) if result.changed else last)
