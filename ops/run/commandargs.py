"""A job's command, seen through its own argument parser: whether it takes --logical-date, and
whether the arguments it is given already carry one.

The runner owns the logical date: it passes each slot's date to a command that takes
--logical-date, and records the claim for that slot. A date among the command's own arguments
would be charged while the claim says another slot is done, so it is refused. Each command's
parser is built once per process and shared by the runner and the crontab.d checks.
"""

import argparse
import contextlib
import functools
import io

LOGICAL_DATE = "--logical-date"
_NOT_GIVEN = object()


class ArgsRefused(ValueError):
    """The command's arguments cannot be run through run_job (usage error, exit 2)."""


class ParserRefused(ArgsRefused):
    """The command's own parser refuses its arguments (`why`: the parser's message)."""

    def __init__(self, command: str, why: str):
        self.why = why
        super().__init__(
            f"{command}'s arguments are refused by its own parser: {why} "
            f"(`manage.py {command} --help` lists them)"
        )


class LogicalDateGiven(ArgsRefused):
    """The command's own arguments carry a --logical-date (`value`: as given, "" if none)."""

    WHY = "the runner owns the logical date (it passes each slot's date and claims that slot)"

    def __init__(self, command: str, value: str):
        self.value = value
        super().__init__(
            f"{command}'s own arguments carry {LOGICAL_DATE} {value or '(no value)'}: {self.WHY}"
        )


@functools.cache
def _command(command: str):
    """The management command's instance (imports it; ImportError etc. propagate)."""
    from django.core.management import get_commands, load_command_class

    app = get_commands()[command]
    return app if not isinstance(app, str) else load_command_class(app, command)


@functools.cache
def command_parser(command: str) -> argparse.ArgumentParser:
    """The management command's own parser (imports the command; ImportError etc. propagate)."""
    return _command(command).create_parser("manage.py", command)


def takes_no_arguments(command: str) -> bool:
    """Whether the command declares no argument of its own (BaseCommand's add_arguments and
    create_parser): then no --logical-date, and no argument list it could refuse but Django's
    common options. Building its parser, which would say the same, costs ~2.5 M instructions
    (a cron fire of `clearsessions`, each crontab.d line under `manage.py check`)."""
    from django.core.management.base import BaseCommand

    kind = type(_command(command))
    return all(
        getattr(kind, name, None) is getattr(BaseCommand, name, None)
        for name in ("add_arguments", "add_base_argument", "create_parser")
    )


def logical_date_action(parser: argparse.ArgumentParser) -> argparse.Action | None:
    return next((a for a in parser._actions if LOGICAL_DATE in a.option_strings), None)


def accepts_logical_date(command: str) -> bool:
    if takes_no_arguments(command):
        return False
    return logical_date_action(command_parser(command)) is not None


def parse_quietly(parser: argparse.ArgumentParser, args: list[str], namespace=None, known=True):
    """parse_known_args (`known=False`: parse_args) without printing: (namespace, None), or
    (None, why it stopped) when the parser refuses the arguments or would exit (--help,
    --version) instead of running."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if not known:
                return parser.parse_args(args, namespace), None
            return parser.parse_known_args(args, namespace)[0], None
    except SystemExit:
        return None, "exit"
    except Exception as exc:  # CommandError, or a type= converter's own error
        return None, str(exc).removeprefix("Error: ") or type(exc).__name__


def check_args(command: str, args: list[str]) -> None:
    """ArgsRefused when `args` carry a --logical-date (in any spelling the command's parser
    accepts), ask the command for its --help or --version (it would end without running, and
    its slot would count as done), or are refused by the command's own parser (as
    `manage.py <command> <args>` refuses them: a usage error, not a failed run)."""
    try:
        if not args and takes_no_arguments(command):
            return  # nothing to refuse, nor a --logical-date to ask for
        parser = command_parser(command)
    except Exception:
        parser = None  # the command cannot load: the run records that; look at the words only
    if any(word.startswith("-") for word in args):
        _check_options(command, args, parser)
    if parser is not None:
        action = logical_date_action(parser)
        full = list(args)
        if action is not None and action.required:  # the runner passes the slot's date
            full.append(f"{action.option_strings[0]}=1970-01-01")
        parsed, stopped = parse_quietly(parser, full, known=False)
        if parsed is None:
            raise ParserRefused(command, _cut("it exited" if stopped == "exit" else stopped))


def _cut(text: str, limit: int = 200) -> str:
    from ..monitors.redact import redacted  # only on an error's path: redacted, then cut

    text = redacted(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _check_options(command: str, args: list[str], parser) -> None:
    action = logical_date_action(parser) if parser is not None else None
    if parser is not None:
        namespace = argparse.Namespace(**({action.dest: _NOT_GIVEN} if action else {}))
        parsed, stopped = parse_quietly(parser, args, namespace)
        if stopped == "exit":
            raise ArgsRefused(
                f"{command}'s arguments ({' '.join(args)}) end it before it runs (--help, "
                "--version), yet its slot would count as done: run "
                f"`manage.py {command} {' '.join(args)}` directly"
            )
        if parsed is not None and action is not None:
            value = getattr(parsed, action.dest)
            if value is not _NOT_GIVEN:
                raise LogicalDateGiven(command, "" if value is None else str(value))
            return
    # The parser could not tell (it refuses the arguments, or the command has no such option
    # and may read its words its own way): any word spelled --logical-date counts, even after --.
    for i, word in enumerate(args):
        if word == LOGICAL_DATE or word.startswith(LOGICAL_DATE + "="):
            value = word.partition("=")[2] or (args[i + 1] if i + 1 < len(args) else "")
            raise LogicalDateGiven(command, value)


class ArgsChecker:
    """Checks a job's command arguments with the command's own parser (built once per command,
    shared with the runner): what the parser refuses, and a --logical-date or --help among them.
    It is the `check_args` of the crontab.d parser (ops/schedule/crontabd.py): its messages speak
    of the job's line."""

    def __init__(self):
        self._seen: dict[tuple, str | None] = {}

    def __call__(self, command: str, args: list[str], options=None) -> str | None:
        enqueue = bool(options and options.enqueue)
        wait_result = bool(options and options.wait_result)
        key = (command, enqueue, wait_result, *args)
        if key not in self._seen:
            self._seen[key] = self._check(command, args, enqueue, wait_result)
        return self._seen[key]

    def _check(
        self, command: str, args: list[str], enqueue: bool = False, wait_result: bool = False
    ) -> str | None:
        from ..schedule.options import is_task_path

        if is_task_path(command):
            from .tasks import TaskRefused, check

            try:
                check(command, args, enqueue=enqueue, wait_result=wait_result)
            except TaskRefused as exc:
                return str(exc)
            return None
        try:
            check_args(command, args)
        except LogicalDateGiven as exc:
            return (
                f"--logical-date {exc.value} among them: {exc.WHY}; remove it from the line, "
                "each run gets its slot's date (a past day, by hand: run_job "
                f"--logical-date={exc.value or 'YYYY-MM-DD'} {command})"
            )
        except ParserRefused as exc:
            return exc.why
        except ArgsRefused as exc:
            return str(exc)
        return None


def history_command(name: str, command: str) -> str | None:
    """The other command that made job `name`'s history (its runs, or the runs its slot claims
    point to), or None when every recorded run of `name` ran `command`.

    An ad hoc `--name` has no declaration to tie it to its command: its history does. A slot
    that another command made "done" must never read as done for this one (a lost run).
    One statement, written out: it runs before every ad hoc run, and the ORM's two queries
    cost a fire ~11 M instructions (bench/RESULTS.md, P9 issue 33), this one ~0.3 M.
    """
    from django.db import connections, router

    from ..models import JobRun, SlotClaim
    from ..schema import quoted

    connection = connections[router.db_for_read(JobRun)]
    runs, job, cmd, pk = quoted(connection, JobRun, "job", "command", "pk")
    claims, claim_job, run_id = quoted(connection, SlotClaim, "job", "run")
    # A run's `command` is its command line ("sleep_demo --seconds=0"): the first word counts.
    # SUBSTR, not LIKE: no wildcard to escape, and case-sensitive on SQLite too.
    sql = (
        f"SELECT r.{cmd} FROM {runs} r WHERE (r.{job} = %s OR r.{pk} IN "  # noqa: S608
        f"(SELECT c.{run_id} FROM {claims} c WHERE c.{claim_job} = %s)) AND r.{cmd} <> %s "
        f"AND r.{cmd} <> '' AND SUBSTR(r.{cmd}, 1, %s) <> %s LIMIT 1"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [name, name, command, len(command) + 1, command + " "])
        row = cursor.fetchone()
    return row[0].split(" ", 1)[0] if row is not None else None
