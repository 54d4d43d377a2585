import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone


class Command(BaseCommand):
    help = (
        "The dispatcher (install_crontab --dispatcher runs it every minute): start a run_job "
        "for each crontab.d job Debian's cron would start in this minute, from this process "
        "set up once, and exit without waiting for them."
    )
    requires_system_checks = []  # a fire path: install_crontab and `check` ran them

    def add_arguments(self, parser):
        parser.add_argument("--log", metavar="PATH", help="append this command's output to PATH")
        parser.add_argument(
            "--dry-run", action="store_true", help="print the run_job lines due, start nothing"
        )
        parser.add_argument(
            "--at",
            metavar="'YYYY-MM-DD HH:MM'",
            help="the minute to dispatch for, in TIME_ZONE (default: now), as a first run "
            "would (the dispatcher's state is neither read nor written); with --dry-run, which "
            "jobs cron starts then (a DST night, say)",
        )

    def run_from_argv(self, argv):
        # `manage.py run_due_jobs`: the process ends without the interpreter's slow shutdown
        # (as run_job's), so that it overlaps its first runs as briefly as possible.
        from ops.run.runner import exit_now

        try:
            super().run_from_argv(argv)
        except SystemExit as exc:
            exit_now(exc.code if isinstance(exc.code, int) else 1)
        exit_now(0)

    def handle(self, *args, **options):
        from ops.run import dispatch
        from ops.run.output import JobLog

        now = _minute(options["at"]) if options["at"] else None
        log = JobLog(options["log"])
        try:
            if log.problem:
                self.stderr.write(f"cronops: error: {log.problem}")
            stderr = self.stderr._out
            # cron's virtual minute, kept between minutes; `--at` asks about a minute as a
            # first run would, without it
            memory = None if now else dispatch.memory_here(stderr)
            started = dispatch.dispatch(
                now,
                stdout=self.stdout._out,
                stderr=stderr,
                dry_run=options["dry_run"],
                memory=memory,
            )
        finally:
            log.close()
        if any(not s.pid for s in started) and not options["dry_run"]:
            raise CommandError("could not start every due job", returncode=1)


def _minute(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"--at {text!r}: give 'YYYY-MM-DD HH:MM'", returncode=2) from None
    if value.tzinfo is None:
        # The first of two equal wall clocks (fold=0); give an offset for the second
        # (`2027-10-31 02:30+01:00`).
        value = timezone.make_aware(value)
    return value
