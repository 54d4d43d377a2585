"""The runner's options: one parser shared by `run_job` and the crontab.d reader."""

import argparse
import datetime as dt
import re
import urllib.parse
from dataclasses import dataclass, field

from .durations import parse_duration

JOB_NAME = re.compile(r"^[a-z0-9_-]{1,100}$")
PING_UUID = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


class OptionsError(ValueError):
    """A runner option or the command part is malformed (usage error, exit 2)."""


@dataclass
class RunOptions:
    command: str
    args: list[str] = field(default_factory=list)
    name: str | None = None
    timeout: float | None = None
    catch_up: int = 0
    wait: float | None = None
    logical_date: dt.date | None = None
    force: bool = False
    ping: str | None = None
    no_ping: bool = False
    no_output_in_ping: bool = False
    quiet: bool = False
    # Which options the command line set explicitly (the rest may come from crontab.d).
    given: set[str] = field(default_factory=set)

    @property
    def job_name(self) -> str:
        return self.name or self.command


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise OptionsError(message)


def _duration(text):
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _date(text):
    try:
        return dt.date.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad date {text!r}: use YYYY-MM-DD") from exc


def _count(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"bad count {text!r}: use a whole number ≥ 0")
    return int(text)


def _name(text):
    if not JOB_NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"bad job name {text!r}: use 1-100 of a-z, 0-9, '_' and '-'"
        )
    return text


def _ping(text):
    if PING_UUID.match(text):
        return text
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        parts = None
    if parts and parts.scheme in ("http", "https") and parts.hostname:
        return text
    raise argparse.ArgumentTypeError("bad --ping: use a check UUID or an http(s) ping URL")


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """The runner's own options (DESIGN.md, run_job); also used for `run_job --help`."""
    parser.add_argument("--name", type=_name, help="job name (default: the command name)")
    parser.add_argument("--timeout", type=_duration, help="end the job after DURATION (exit 124)")
    parser.add_argument(
        "--catch-up",
        type=_count,
        default=None,
        metavar="N",
        help="first run up to N earlier slots that have no success",
    )
    parser.add_argument(
        "--wait",
        type=_duration,
        metavar="DURATION",
        help="wait up to DURATION for the lock instead of skipping",
    )
    parser.add_argument(
        "--logical-date", type=_date, metavar="YYYY-MM-DD", help="run the slot of this date by hand"
    )
    parser.add_argument(
        "--force", action="store_true", default=None, help="run a slot that already succeeded again"
    )
    parser.add_argument("--ping", type=_ping, metavar="UUID|URL", help="ping this check instead")
    parser.add_argument("--no-ping", action="store_true", default=None, help="send no pings")
    parser.add_argument(
        "--no-output-in-ping",
        action="store_true",
        default=None,
        help="send pings without the output tail",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        default=None,
        help="print the job's output only when it fails",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="run_job", add_help=False, allow_abbrev=False)
    add_runner_options(parser)
    parser.add_argument("command")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser


_PARSER = _build_parser()
# Runner options as written on a crontab.d line (--logical-date and --force are by hand only).
SCHEDULE_OPTIONS = [
    a.option_strings[0]
    for a in _PARSER._actions
    if a.option_strings and a.dest not in ("logical_date", "force")
]
RUNNER_FIELDS = _FIELDS = [
    "name",
    "timeout",
    "catch_up",
    "wait",
    "logical_date",
    "force",
    "ping",
    "no_ping",
    "no_output_in_ping",
    "quiet",
]


def parse_run_args(argv: list[str]) -> RunOptions:
    """Parse `[runner options] <command> [args]`; OptionsError on anything malformed."""
    if not argv:
        raise OptionsError("no command given")
    ns = _PARSER.parse_args(argv)
    if ns.command.startswith("-"):
        raise OptionsError(f"unknown runner option {ns.command!r}")
    given = {f for f in _FIELDS if getattr(ns, f) is not None}
    values = {f: getattr(ns, f) for f in given}
    return RunOptions(command=ns.command, args=list(ns.args), given=given, **values)


def merge(declared: RunOptions, cli: RunOptions) -> RunOptions:
    """A declared job's options, overridden by what the command line says explicitly."""
    merged = RunOptions(command=declared.command, args=list(cli.args or declared.args))
    for f in _FIELDS:
        source = cli if f in cli.given else declared
        setattr(merged, f, getattr(source, f))
    merged.given = declared.given | cli.given
    return merged
