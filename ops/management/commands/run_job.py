import argparse
import functools
import gc

from django.core.management.base import BaseCommand, CommandError, handle_default_options

from ops.schedule.options import RUNNER_FIELDS, add_runner_options, split_common_options


@functools.cache
def common_options_parser(prog: str, subcommand: str) -> argparse.ArgumentParser:
    """Django's common options (kept: the warm dispatcher builds it once for its jobs)."""
    return BaseCommand().create_parser(prog, subcommand)


@functools.cache
def common_options(prog: str, subcommand: str) -> dict[str, bool]:
    """Django's common option strings: whether each takes a value."""
    return {
        option: action.nargs != 0
        for action in common_options_parser(prog, subcommand)._actions
        for option in action.option_strings
    }


class Command(BaseCommand):
    help = (
        "Run a management command as a cron job: per-job lock, slot claim, healthchecks "
        "pings and run history. Usage: run_job [runner options] <command> [its args]. "
        "Django's common options (--settings, --pythonpath, -v, --traceback, --no-color, "
        "--force-color, --skip-checks) go before the command name and never reach the job; "
        "from the command name on, every word is the job's."
    )
    requires_system_checks = []  # a cron run must not pay for (or fail on) the system checks

    def add_arguments(self, parser):
        add_runner_options(parser)
        parser.add_argument("command", help="management command (or job name in crontab.d)")
        parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")

    def run_from_argv(self, argv):
        # `manage.py run_job`: this process only supervises. What Django's start-up made is
        # never garbage (a full collection of it costs ~25 ms, and a fork would copy the pages
        # every collection touches), so the collector leaves it alone from here on.
        gc.freeze()
        from ops.run import runner

        # argv: manage.py run_job ...; the runner parses its own options (one parser for cron
        # lines and the command line). Django's common options before the command name are
        # taken out here: ManagementUtility has already applied --settings and --pythonpath.
        # Django's parser is built only for a word before the command name that is no
        # runner option (a cron line has none).
        run_argv, taken = split_common_options(argv[2:], lambda: common_options(*argv[:2]))
        if {"-h", "--help", "--version"} & {word.split("=", 1)[0] for word in taken}:
            return super().run_from_argv(argv)  # Django prints the help (or version)
        stderr = self.stderr._out
        if taken:
            try:
                handle_default_options(common_options_parser(*argv[:2]).parse_args(taken))
            except CommandError as exc:
                runner.say(f"error: {str(exc).removeprefix('Error: ')}", stderr)
                raise SystemExit(runner.EXIT_USAGE) from None
        code = runner.run(run_argv, stdout=self.stdout._out, stderr=stderr)
        runner.exit_now(code)  # manage.py's process ends here, without the slow shutdown

    def handle(self, *args, **options):
        from ops.run import runner

        # Reached through call_command() only; the shell goes through run_from_argv above.
        argv = []
        for name in RUNNER_FIELDS:
            value, flag = options[name], f"--{name.replace('_', '-')}"
            if name == "standby" and value is False:
                argv.append("--no-standby")
            elif value is True:
                argv.append(flag)
            elif isinstance(value, tuple):  # --retry-on's codes
                argv.append(f"{flag}={','.join(map(str, value))}")
            elif value not in (None, False, 0):
                argv.append(f"{flag}={value}")
        # call_command() moves the REMAINDER `args` out of the options into *args (Django's
        # legacy optparse mimicry): the command's own arguments arrive there.
        code = runner.run(
            [*argv, options["command"], *args, *(options.get("args") or [])],
            stdout=self.stdout._out,
            stderr=self.stderr._out,
        )
        if code:
            raise CommandError(f"run_job exited {code}", returncode=code)
