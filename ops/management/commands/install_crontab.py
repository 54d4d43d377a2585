from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from ops import conf, schema
from ops.schedule.crontab_text import EXIT_CRONTABD, EXIT_WOULD_CHANGE, InstallError
from ops.schedule.installer import install_crontab


class Command(BaseCommand):
    help = (
        "Install crontab.d/ as this project's block in the user's crontab (every other line is "
        "kept byte for byte). Exit codes: 0 installed or up to date, 1 --check found a change, "
        "2 crontab.d error or cronops' migrations not applied, 3 time-zone mismatch, 4 the "
        "crontab could not be read or written."
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
                before_writing=self.refuse_unmigrated,
                dispatcher=options["dispatcher"],
            )
        except InstallError as exc:
            raise CommandError(str(exc), returncode=exc.returncode) from None
        except conf.SettingError as exc:
            raise CommandError(str(exc), returncode=EXIT_CRONTABD) from None
        if (options["dry_run"] or options["check"]) and not options["remove"]:
            # Read-only (the deploy's dry run comes before its migrate): said, not refused.
            pending = self.unapplied()
            if pending:
                self.stderr.write(
                    f"note: {pending}: install_crontab refuses to install until "
                    f"`{schema.migrate_command(schema.ops_alias())}`"
                )
        for line in result.lines[:-1]:
            self.stdout.write(line, ending="\n")
        last = result.lines[-1]
        if options["check"] and result.changed:
            raise CommandError(
                f"crontab not up to date: would have {result.message}",
                returncode=EXIT_WOULD_CHANGE,
            )
        self.stdout.write(self.style.SUCCESS(last) if result.changed else last)

    def unapplied(self) -> str:
        """'N of cronops' migrations are not applied to database X', or '' when they are (or
        when the database cannot be read: said on stderr, an install goes ahead, as one made
        where the database is not reachable yet, a container's build, did before)."""
        alias = schema.ops_alias()
        try:
            pending = schema.unapplied(alias)
        except DatabaseError as exc:
            self.stderr.write(
                f"warning: database {alias!r} cannot be read ({schema.first_line(exc)}): "
                "whether cronops' migrations are applied is unknown"
            )
            return ""
        if not pending:
            return ""
        return schema.not_applied(pending, alias)

    def refuse_unmigrated(self) -> None:
        """Every line installed before `migrate` would fail: refuse, changing nothing."""
        pending = self.unapplied()
        if pending:
            raise InstallError(
                f"{pending}: every installed line would fail; run "
                f"`{schema.migrate_command(schema.ops_alias())}` first",
                EXIT_CRONTABD,
            )
