import argparse

from django.core.management.base import BaseCommand, CommandError

from ops import runner
from ops.options import RUNNER_FIELDS, add_runner_options


class Command(BaseCommand):
    help = (
        "Run a management command as a cron job: per-job lock, slot claim, healthchecks "
        "pings and run history. Usage: run_job [runner options] <command> [its args]"
    )
    requires_system_checks = []  # a cron run must not pay for (or fail on) the system checks

    def add_arguments(self, parser):
        add_runner_options(parser)
        parser.add_argument("command", help="management command (or job name in crontab.d)")
        parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")

    def run_from_argv(self, argv):
        # argv: manage.py run_job ...; the runner parses its own options (one parser for cron
        # lines and the command line), Django's only handles --help.
        if any(a in ("-h", "--help") for a in argv[2:3]):
            return super().run_from_argv(argv)
        raise SystemExit(runner.run(argv[2:], stdout=self.stdout._out, stderr=self.stderr._out))

    def handle(self, *args, **options):
        # Reached through call_command() only; the shell goes through run_from_argv above.
        argv = []
        for name in RUNNER_FIELDS:
            value, flag = options[name], f"--{name.replace('_', '-')}"
            if value is True:
                argv.append(flag)
            elif value not in (None, False, 0):
                argv.append(f"{flag}={value}")
        code = runner.run(
            [*argv, options["command"], *(options.get("args") or [])],
            stdout=self.stdout._out,
            stderr=self.stderr._out,
        )
        if code:
            raise CommandError(f"run_job exited {code}", returncode=code)
