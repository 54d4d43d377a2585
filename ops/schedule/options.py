"""The runner's options: one parser shared by `run_job` and the crontab.d reader."""

import argparse
import datetime as dt
import functools
import re
import urllib.parse
from collections.abc import Callable

from ..values import Value, field
from .durations import parse_duration

# A job name starts with a letter or digit: `run_job -x` would read a name "-x" as an option.
JOB_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")
JOB_NAME_RULE = "1-100 of a-z, 0-9, '_' and '-', starting with a letter or digit"
# The longest value an error message echoes (a 10,000-character --name is not repeated whole).
SHOWN_MAX = 60
# A Django task's dotted path (module.function): a management command's name has no dot.
# (This one and the patterns below are compiled at their first use, by re's own cache: most
# runs never need them, and compiling costs each importer ~0.3 M instructions a pattern.)
TASK_PATH = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$"


def is_task_path(command: str) -> bool:
    """Whether a job's command word names a task (ops/run/tasks.py), not a command."""
    return "." in command and re.match(TASK_PATH, command) is not None


def task_options_problem(options: "RunOptions") -> str | None:
    """Why --enqueue / --wait-result cannot go with `options`' command, or None."""
    if (options.enqueue or options.wait_result) and not options.is_task:
        return (
            "--enqueue and --wait-result are for a task (module.function), not a management "
            f"command ({options.command!r})"
        )
    if options.wait_result and not options.enqueue:
        return "--wait-result follows an enqueued task: give --enqueue too"
    return None


PING_UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


# --catch-up runs at most this many earlier slots in one run: enough for three months of a daily
# job, and a bound on what one cron fire can do (100,000 once ran 52,417 slots of a */5 job).
MAX_CATCH_UP = 100
# --timeout and --wait: at most 365 days, the largest grace healthchecks.io accepts (the grace
# sync_healthchecks derives from the timeout).
MAX_DURATION = 365 * 86400
# --kill-after's default: seconds between the SIGTERM that stops a job (its --timeout, a signal
# passed on, a lost claim) and the SIGKILL of its process group.
DEFAULT_KILL_AFTER = 10.0
EARLIEST_LOGICAL_DATE = dt.date(1970, 1, 1)
# --retries: at most this many attempts after the first (ops/run/retries.py bounds each wait).
MAX_RETRIES = 10
DEFAULT_RETRY_DELAY = 60.0
# --after-wait's default: how long a dependent slot waits for its upstream's success.
DEFAULT_AFTER_WAIT = 1800.0
# A bare `--standby` as the parser sees it. The option's value must be joined with `=`
# (`--standby=30m`): `--standby charge_daily` would otherwise read the command as its value.
# parse_run_args rewrites the bare word to this; a NUL never occurs in a real argument.
_BARE_STANDBY = "\0"
_ISO_DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"


def shown(text: str, limit: int = SHOWN_MAX) -> str:
    """`text` quoted as an error message echoes it: its known secrets redacted first (a secret
    cut in two would not be recognised afterwards), then cut to `limit` characters, the cut
    said."""
    from ..monitors.redact import redacted  # only on an error's path

    text = redacted(text)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


class OptionsError(ValueError):
    """A runner option or the command part is malformed (usage error, exit 2). `suggested`: the
    runner option a misspelled one was close to (the message says "did you mean" it)."""

    suggested: str | None = None


def close_match(word: str, candidates) -> str | None:
    """The candidate `word` is most likely a misspelling of, as Django's ManagementUtility
    picks one for an unknown command (difflib.get_close_matches, its default cutoff)."""
    import difflib  # only on an error's path

    found = difflib.get_close_matches(word, list(candidates), n=1)
    return found[0] if found else None


class RunOptions(Value):
    command: str
    args: list[str] = field(default_factory=list)
    name: str | None = None
    timeout: float | None = None
    kill_after: float | None = None
    catch_up: int = 0
    wait: float | None = None
    logical_date: dt.date | None = None
    force: bool = False
    ping: str | None = None
    no_ping: bool = False
    no_output_in_ping: bool = False
    quiet: bool = False
    log: str | None = None
    # None: not said (OPS_STANDBY decides); False: --no-standby; True: --standby (bounded by
    # the job's --timeout, ops/run/standby.py); a number: --standby=DURATION, in seconds.
    standby: bool | float | None = None
    # Failed attempts tried again (ops/run/retries.py): how many, the first backoff in seconds,
    # and the exit codes that are retried (None: every failure and timeout).
    retries: int | None = None
    retry_delay: float | None = None
    retry_on: tuple[int, ...] | None = None
    # --after (ops/run/after.py): jobs that must have succeeded for the same logical date first,
    # and how long to wait for them (seconds).
    after: tuple[str, ...] | None = None
    after_wait: float | None = None
    # A task (ops/run/tasks.py): put on its backend instead of run here, and how long to wait
    # for its result (seconds).
    enqueue: bool = False
    wait_result: float | None = None
    # Which options the command line set explicitly (the rest may come from crontab.d).
    given: set[str] = field(default_factory=set)

    @property
    def job_name(self) -> str:
        """`--name`, else the command's name, else a task's function's name."""
        if self.name:
            return self.name
        return self.command.rpartition(".")[2] if is_task_path(self.command) else self.command

    @property
    def is_task(self) -> bool:
        return is_task_path(self.command)


class _Parser(argparse.ArgumentParser):
    def _get_formatter(self):
        # Never shown (no --help; an error raises OptionsError): add_argument only checks each
        # option's metavar with it, which needs no terminal's width (~1.5 M instructions to
        # look it up for every option).
        return argparse.HelpFormatter(prog=self.prog, width=100)

    def error(self, message):
        # argparse echoes the words it refuses ("unrecognized arguments: ..."): cut each, once
        # its secrets are redacted (a secret cut in two is not recognised afterwards).
        from ..monitors.redact import redacted  # only on an error's path

        raise OptionsError(re.sub(rf"\S{{{SHOWN_MAX + 1},}}", _cut_word, redacted(message)))


def _cut_word(match: re.Match) -> str:
    word = match.group(0)
    if word.endswith("…") and len(word) <= 4 * SHOWN_MAX:
        return word  # cut by `shown` already (quoted, escapes spelled out), its length follows
    return f"{word[:SHOWN_MAX]}… ({len(word)} characters)"


def _duration(text):
    try:
        return parse_duration(text, maximum=MAX_DURATION)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _standby(text):
    return True if text == _BARE_STANDBY else _duration(text)


def logical_date(text: str) -> dt.date:
    """run_job's rules for a --logical-date (also the jobs page's Run again); ValueError saying
    why not. Exactly YYYY-MM-DD in ASCII: Python 3.11's fromisoformat also takes 20260105,
    2026-W02-1 and full-width digits, none of which an operator means as a logical date."""
    try:
        if not re.fullmatch(_ISO_DATE, text):
            raise ValueError(text)
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"bad date {text!r}: use YYYY-MM-DD") from None
    if day < EARLIEST_LOGICAL_DATE:
        raise ValueError(f"bad date {text!r}: logical dates start at {EARLIEST_LOGICAL_DATE}")
    return day


def _date(text):
    try:
        return logical_date(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text):
    if not re.fullmatch(r"[0-9]+", text):  # ASCII only: isdigit() takes '²' too
        raise argparse.ArgumentTypeError(f"bad count {text!r}: use a whole number ≥ 0")
    count = int(text) if len(text) <= 10 else MAX_CATCH_UP + 1
    if count > MAX_CATCH_UP:
        shown = text if len(text) <= 20 else text[:10] + "…"
        raise argparse.ArgumentTypeError(
            f"{shown} is too many: at most {MAX_CATCH_UP} earlier slots per run"
        )
    return count


def _retries(text):
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError(f"bad count {shown(text)}: use a whole number ≥ 0")
    count = int(text) if len(text) <= 10 else MAX_RETRIES + 1
    if count > MAX_RETRIES:
        raise argparse.ArgumentTypeError(f"at most {MAX_RETRIES} retries per slot, not {text}")
    return count


def _codes(text):
    codes = []
    for word in text.split(","):
        if not re.fullmatch(r"[0-9]{1,3}", word) or not 1 <= int(word) <= 255:
            raise argparse.ArgumentTypeError(
                f"bad exit code {shown(word)} in --retry-on: use codes 1-255, comma-separated"
            )
        codes.append(int(word))
    return tuple(sorted(set(codes)))


def _upstreams(text):
    names = []
    for word in text.split(","):
        if not JOB_NAME.match(word):
            raise argparse.ArgumentTypeError(
                f"bad job name {shown(word)} in --after: use {JOB_NAME_RULE}, comma-separated"
            )
        if word not in names:
            names.append(word)
    return tuple(names)


def _name(text):
    if not JOB_NAME.match(text):
        raise argparse.ArgumentTypeError(f"bad job name {shown(text)}: use {JOB_NAME_RULE}")
    return text


def _ping(text):
    if re.match(PING_UUID, text):
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
    parser.add_argument(
        "--timeout",
        type=_duration,
        metavar="DURATION",
        help="end the job after DURATION (90s, 30m, 2h, 7d; at most 365d): exit 124",
    )
    parser.add_argument(
        "--kill-after",
        type=_duration,
        metavar="DURATION",
        help="after --timeout's SIGTERM (or a passed SIGTERM/SIGINT), SIGKILL the job's process "
        "group once DURATION has passed (default 10s)",
    )
    parser.add_argument(
        "--catch-up",
        type=_count,
        default=None,
        metavar="N",
        help=f"first run up to N earlier slots that have no success (at most {MAX_CATCH_UP})",
    )
    parser.add_argument(
        "--wait",
        type=_duration,
        metavar="DURATION",
        help="wait up to DURATION (at most 365d) for the lock instead of skipping",
    )
    parser.add_argument(
        "--standby",
        type=_standby,
        nargs="?",
        const=True,
        metavar="DURATION",
        help="when another host runs this slot, wait for it instead of exiting 75: exit 0 once "
        "it succeeded, run the slot if it dies; give up (75) after --standby=DURATION, by "
        "default the job's --timeout (else OPS_DEFAULT_GRACE) plus 3 heartbeats. Its value "
        "takes '=': --standby=30m",
    )
    parser.add_argument(
        "--no-standby",
        dest="standby",
        action="store_const",
        const=False,
        help="never stand by, even with OPS_STANDBY on: exit 75 when the slot is busy",
    )
    parser.add_argument(
        "--retries",
        type=_retries,
        metavar="N",
        help=f"run a failed or timed-out attempt again, up to N more times (at most "
        f"{MAX_RETRIES}), within the slot's claim; never past the job's next fire time",
    )
    parser.add_argument(
        "--retry-delay",
        type=_duration,
        metavar="DURATION",
        help="wait before the first retry (default 1m); it doubles for each next one, with "
        "jitter, at most 1h",
    )
    parser.add_argument(
        "--retry-on",
        type=_codes,
        metavar="CODES",
        help="retry only these exit codes (comma-separated, e.g. 75; a timeout is 124)",
    )
    parser.add_argument(
        "--after",
        type=_upstreams,
        metavar="JOB[,JOB...]",
        help="run the slot only once each named job has succeeded for the same logical date: "
        "wait for it (--after-wait), exit 75 if it has not, exit 69 (blocked) if it failed",
    )
    parser.add_argument(
        "--after-wait",
        type=_duration,
        metavar="DURATION",
        help="how long --after waits for its upstream jobs (default 30m; never past the job's "
        "next fire time)",
    )
    parser.add_argument(
        "--logical-date",
        type=_date,
        metavar="YYYY-MM-DD",
        help="run the slot of this date by hand (from 1970-01-01, not in the future); the "
        "runner passes it to a command that takes --logical-date, which the command's own "
        "arguments must never carry",
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
    parser.add_argument(
        "--log", metavar="PATH", help="append all output to PATH (installed cron lines use it)"
    )
    parser.add_argument(
        "--enqueue",
        action="store_true",
        default=None,
        help="a task (module.function): put it on its task backend, once per slot, instead of "
        "running it here",
    )
    parser.add_argument(
        "--wait-result",
        type=_duration,
        metavar="DURATION",
        help="with --enqueue: wait up to DURATION for the task's result; the exit code and the "
        "monitors then say how it ended",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="run_job", add_help=False, allow_abbrev=False)
    add_runner_options(parser)
    parser.add_argument("command")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The runner's parser, built at its first use: not by every importer of this module."""
    return _build_parser()


def schedule_options() -> list[str]:
    """Runner options as written on a crontab.d line (--logical-date and --force are by hand
    only; install_crontab writes --log)."""
    return [
        a.option_strings[0]
        for a in _parser()._actions
        if a.option_strings and a.dest not in ("logical_date", "force", "log")
    ]


RUNNER_FIELDS = _FIELDS = [
    "name",
    "timeout",
    "kill_after",
    "catch_up",
    "wait",
    "logical_date",
    "force",
    "ping",
    "no_ping",
    "no_output_in_ping",
    "quiet",
    "log",
    "standby",
    "retries",
    "retry_delay",
    "retry_on",
    "after",
    "after_wait",
    "enqueue",
    "wait_result",
]


def parse_run_args(argv: list[str]) -> RunOptions:
    """Parse `[runner options] <command> [args]`; OptionsError on anything malformed."""
    if not argv:
        raise OptionsError("no command given")
    options = _leading_options(argv)
    if "--no-standby" in options and any(o.split("=", 1)[0] == "--standby" for o in options):
        raise OptionsError("--standby and --no-standby contradict each other: give one")
    try:
        ns = _parser().parse_args(_mark_bare_standby(argv))
    except OptionsError as exc:
        if str(exc).startswith("unrecognized arguments:"):
            _suggest(options)
        raise
    if ns.command.startswith("-"):
        _suggest(options)
        raise OptionsError(f"unknown runner option {shown(ns.command)}")
    given = {f for f in _FIELDS if getattr(ns, f) is not None}
    values = {f: getattr(ns, f) for f in given}
    return RunOptions(command=ns.command, args=list(ns.args), given=given, **values)


def _suggest(leading: list[str]) -> None:
    """Refuse the first of the `leading` option words that is no runner option with "did you
    mean" the one it is close to (`--timout=10m`: `--timeout`); nothing when none is close."""
    known = [o for a in _parser()._actions for o in a.option_strings]
    for word in leading:
        option = word.split("=", 1)[0]
        if option in known:
            continue
        # Compared without the dashes, which every option shares (`--bogus` is not `--log`).
        bare = {o.lstrip("-"): o for o in known}
        meant = close_match(option.lstrip("-"), bare)
        if meant is None:
            return
        meant = bare[meant]
        error = OptionsError(f"unknown runner option {shown(word)}: did you mean {meant}?")
        error.suggested = meant
        raise error


def _takes_separate_value(action: argparse.Action) -> bool:
    """`--opt VALUE` as two words: an option whose value is optional (--standby) takes one only
    as `--opt=VALUE`."""
    return action.nargs not in (0, argparse.OPTIONAL)


def _leading_options(argv: list[str]) -> list[str]:
    """The option words before the command name (their separate values left out)."""
    separate = {o for a in _parser()._actions for o in a.option_strings if _takes_separate_value(a)}
    found, i = [], 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        found.append(argv[i])
        i += 2 if argv[i] in separate else 1
    return found


def _mark_bare_standby(argv: list[str]) -> list[str]:
    """argv with each bare `--standby` among the runner options marked as bare, so that the
    parser never takes the next word (the command) for its value."""
    separate = {o for a in _parser()._actions for o in a.option_strings if _takes_separate_value(a)}
    marked = list(argv)
    i = 0
    while i < len(marked):
        word = marked[i]
        if not word.startswith("-") or word == "--":
            break  # the command name: the rest is the job's
        if word == "--standby":
            marked[i] = f"--standby={_BARE_STANDBY}"
            _refuse_separate_standby_value(marked[i + 1 : i + 2])
        i += 2 if word in separate else 1
    return marked


def _refuse_separate_standby_value(following: list[str]) -> None:
    """`--standby 30m job` means `--standby=30m job`, but would run a command named 30m."""
    if not following:
        return
    try:
        parse_duration(following[0])
    except ValueError:
        return
    raise OptionsError(
        f"--standby takes its bound with '=': write --standby={following[0]} (a separate "
        f"{following[0]!r} would be the command)"
    )


def split_common_options(
    argv: list[str], common: Callable[[], dict[str, bool]]
) -> tuple[list[str], list[str]]:
    """(runner argv, common options): take Django's common options (`common()`: option string
    → takes a value) out of the options before the command name.

    `manage.py run_job --settings=config.settings -v 2 --timeout=1h charge_daily --x` gives
    `--timeout=1h charge_daily --x` for the runner and `--settings=config.settings -v 2` for
    Django. Both `--opt=value` and `--opt value` forms count, and `-v2`; from the command name
    on, every word is the job's. An unknown option stops the walk: the runner's parser reports it.
    `common` is asked only for a word that is no runner option (the two sets never meet): a
    cron line's options are the runner's, and building Django's parser costs a fire ~2.5 M
    instructions.
    """
    runner = {
        option: _takes_separate_value(action)
        for action in _parser()._actions
        for option in action.option_strings
    }
    kept: list[str] = []
    taken: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-") or word == "--":
            break  # the command name: the rest is the job's
        option = word.split("=", 1)[0]
        if option in runner:
            separate = runner[option] and word == option
            kept.extend(argv[i : i + 1 + separate])
            i += 1 + separate
            continue
        django = common()
        if option not in django and word[:2] in django and not word.startswith("--"):
            option = word[:2]  # -v2
        if option not in django:
            break
        separate = django[option] and word == option
        taken.extend(argv[i : i + 1 + separate])
        i += 1 + separate
    return kept + argv[i:], taken


def merge(declared: RunOptions, cli: RunOptions) -> RunOptions:
    """A declared job's options, overridden by what the command line says explicitly."""
    merged = RunOptions(command=declared.command, args=list(cli.args or declared.args))
    for f in _FIELDS:
        source = cli if f in cli.given else declared
        setattr(merged, f, getattr(source, f))
    merged.given = declared.given | cli.given
    return merged
