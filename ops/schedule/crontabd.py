"""Read and validate `crontab.d/*.cron`: the one parser every command uses.

A job line is a schedule followed by `run_job`'s argument list (see DESIGN.md). Everything
that Debian's cron would silently misread, or that would never fire, is an error that names
`file:line`, quotes the offending text and says what would be valid.
"""

import calendar
import datetime as dt
import functools
import itertools
import re
from collections.abc import Iterable
from pathlib import Path

from ..run.commandargs import ArgsChecker
from ..values import Value, field
from . import before_fork, dependencies
from .options import (
    JOB_NAME,
    JOB_NAME_RULE,
    OptionsError,
    RunOptions,
    close_match,
    parse_run_args,
    schedule_options,
    shown,
    task_options_problem,
)

SPECIALS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
    "@reboot": None,
}
# name, low, high, names accepted by Debian's cron in the field
FIELDS = [
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}),
    ("day of week", 0, 7, {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}),
]
# Compiled at their first use, by re's cache, and most lines never need them: a fire reads
# crontab.d, and compiling them cost it ~1.5 M instructions (bench/RESULTS.md, P9 issue 33).
ENV_LINE = r"^([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)$"
_ITEM = r"^(\*|\w+|\w+-\w+)(?:/(\d+))?$"
_NUMBER = re.compile(r"^\d+$")  # Django's too: compiled already
_CONTROL = r"[\x00-\x08\x0a-\x1f\x7f]"
_MAILTO = r"^[^\s,;'\"\\`$|&<>()%]+$"
# What other crons accept and Debian's does not (or reads differently).
_FOREIGN_SYNTAX = [
    ("~", "'~' (random value) is a systemd/OpenBSD extension; Debian's cron reads 0~30 as 0"),
    (
        "#",
        "'#' (nth weekday) is Quartz/cronie syntax; Debian's cron ignores '#2' and reads 1#2 as 1",
    ),
    ("?", "'?' is Quartz syntax; Debian's cron has no '?'"),
    ("L", "'L' (last day) is Quartz syntax; Debian's cron has no 'L'"),
    ("W", "'W' (nearest weekday) is Quartz syntax; Debian's cron has no 'W'"),
]
# Environment lines people write that cannot work here, with the reason.
_ENV_HINTS = {
    "CRON_TZ": "Debian's cron has no CRON_TZ: schedules are in TIME_ZONE, which must be the "
    "system time zone",
    "TZ": "TZ= does not change when cron fires: schedules are in TIME_ZONE, which must be the "
    "system time zone",
    "SHELL": "the installed lines are written for /bin/sh; do not change SHELL",
    "PATH": "the installed lines use absolute paths; jobs read their environment from .env",
}


_PING_VALUE = r"(--ping(?:=|\s+))(\S+)"


class CrontabError(ValueError):
    """A crontab.d problem, always located: `file:line: message (in: text)`."""

    def __init__(self, path, lineno, message, text=""):
        self.path, self.lineno = str(path), lineno
        where = f"{self.path}:{lineno}" if lineno else self.path
        # These messages reach job logs, cron mail, job_status, the jobs page and system
        # checks: made here, once, with no credential in them. A --ping value is one (a check
        # UUID or a URL with the ping key); so is any known secret, wherever it stands.
        shown = re.sub(_PING_VALUE, r"\1<hidden>", re.sub(_CONTROL, "?", text.strip()))
        from ..monitors.redact import redacted  # an error's path: not every parse's import

        super().__init__(redacted(f"{where}: {message}" + (f" (in: {shown})" if shown else "")))


class Job(Value):
    name: str
    schedule: str  # normalised: five fields separated by one space, or a lower-case @word
    options: RunOptions
    argv: list[str]  # run_job's arguments exactly as written
    description: str = ""
    path: str = ""
    lineno: int = 0

    @property
    def cron_expr(self) -> str | None:
        """Five fields for the slot maths; None for @reboot (no slots)."""
        return SPECIALS[self.schedule] if self.schedule.startswith("@") else self.schedule


class Schedule(Value):
    jobs: list[Job] = field(default_factory=list)
    mailto: str | None = None
    files: list[str] = field(default_factory=list)
    mailto_at: str = ""  # file:line of the MAILTO= line

    def get(self, name: str) -> Job | None:
        return next((j for j in self.jobs if j.name == name), None)


def _value(word: str, index: int) -> int | None:
    _, _, _, names = FIELDS[index]
    if _NUMBER.match(word):
        return int(word)
    return names.get(word.lower())


def _foreign_syntax(text: str, names: dict) -> str | None:
    """Why `text` is another cron's syntax that Debian's reads differently, or None."""
    for char, why in _FOREIGN_SYNTAX[:3]:
        if char in text:
            return why
    for part in re.split(r"[,/-]", text) if any(c in text for c in ",/-") else [text]:
        if part.lower() in names or _NUMBER.match(part) or part == "*":
            continue
        if part.endswith("L") or part == "LW":
            return _FOREIGN_SYNTAX[3][1]
        if part.endswith("W"):
            return _FOREIGN_SYNTAX[4][1]
    return None


def validate_field(text: str, index: int) -> str | None:
    """None if Debian's cron reads `text` as field `index` the way it looks; else why not."""
    name, low, high, names = FIELDS[index]
    valid = (
        f"use *, N, N-M, */S or N-M/S with {low}-{high}"
        + ({3: " (or jan-dec)", 4: " (or sun-sat)"}.get(index, ""))
        + ", comma-separated"
    )
    why = _foreign_syntax(text, names)
    if why:
        return f"bad {name} {text!r}: {why}; {valid}"
    lo: int | None
    hi: int | None
    for item in text.split(","):
        parts = _item(item)
        if parts is None:
            return f"bad {name} {text!r}: {valid}"
        base, step = parts
        if base == "*":
            lo, hi = low, high
        elif "-" in base:
            first, last = base.split("-")
            lo, hi = _value(first, index), _value(last, index)
            if lo is None or hi is None:
                return f"bad {name} {item!r}: {valid}"
            if lo > hi:
                top = 6 if index == 4 else high  # Sunday as 0 only: what Kubernetes reads too
                return (
                    f"bad {name} {item!r}: the range starts after it ends (Debian's cron "
                    f"would not wrap around); write it as a list, e.g. {lo}-{top},{low}-{hi}"
                )
        else:
            lo = _value(base, index)
            if lo is None:
                return f"bad {name} {item!r}: {valid}"
            hi = lo
            if step is not None:
                return f"bad {name} {item!r}: a step needs * or a range (*/S, N-M/S)"
        if not (low <= lo <= high and low <= hi <= high):
            return f"bad {name} {item!r}: values must be {low}-{high}"
        if step is not None and not 1 <= int(step) <= high - low:
            return f"bad {name} step in {item!r}: the step must be 1-{high - low}"
    return None


def _item(item: str) -> tuple[str, str | None] | None:
    """(base, step) of one item of a field (`*`, `N`, `N-M`, `name`, each with its `/S`), or None.
    `*`, `N` and `*/S` (most items) are read without the pattern."""
    if item == "*" or (item.isascii() and item.isdigit()):
        return item, None
    step = item[2:]
    if item.startswith("*/") and step.isascii() and step.isdigit():
        return "*", step
    match = re.match(_ITEM, item)
    return (match[1], match[2]) if match else None


def _field_values(text: str, index: int) -> set[int]:
    _, low, high, _ = FIELDS[index]
    values: set[int] = set()
    for item in text.split(","):
        parts = _item(item)
        assert parts is not None, "a field validate_field accepted"
        base, step = parts
        if base == "*":
            lo, hi = low, high
        else:
            first, _, last = base.partition("-")
            start, end = _value(first, index), _value(last or first, index)
            assert start is not None and end is not None, "a field validate_field accepted"
            lo, hi = start, end
        values.update(range(lo, hi + 1, int(step or 1)))
    return values


@functools.lru_cache(maxsize=4096)
def validate_schedule(schedule: str, second_opinion: bool = False) -> str | None:
    """None when `schedule` is a valid Debian cron schedule that can fire; else why not.

    `second_opinion` also asks python-crontab (the installer does): its import pulls in
    asyncio, 60 ms that a run or another command's system checks should not pay."""
    if schedule.startswith("@"):
        if schedule not in SPECIALS:
            return f"unknown schedule {schedule!r}: use five fields or one of {' '.join(SPECIALS)}"
        return None
    fields = schedule.split()
    if len(fields) != 5:
        return f"a schedule has five fields (minute hour day month weekday), not {len(fields)}"
    for i, text in enumerate(fields):
        problem = validate_field(text, i)
        if problem:
            return problem
    dom, month, dow = fields[2], fields[3], fields[4]
    # Debian's cron ANDs day of month and day of week when either starts with '*', else ORs.
    if dow.startswith("*"):
        days, months = _field_values(dom, 2), _field_values(month, 3)
        longest = max(calendar.monthrange(2024, m)[1] for m in months)  # 2024: Feb has 29
        if min(days) > longest:
            return (
                f"never fires: no month in {month!r} has day {min(days)}; "
                "pick a day every chosen month has"
            )
    if second_opinion and not _python_crontab_reads(schedule):
        return f"bad schedule {schedule!r}: python-crontab cannot read it"
    try:
        from cronsim import CronSim

        CronSim(schedule.lower(), dt.datetime(2024, 1, 1))  # the runner's slot maths parses it
    except Exception as exc:
        return f"bad schedule {schedule!r}: the slot maths (cronsim) cannot use it: {exc}"
    return None


def _python_crontab_reads(schedule: str) -> bool:
    from crontab import CronSlices  # python-crontab: a second opinion on the syntax

    try:
        return bool(CronSlices.is_valid(schedule))
    except Exception:  # python-crontab 3.4 raises on a name-number range (`sat-7`)
        return True  # its bug, not the schedule's: our rules and cronsim still judge


def _looks_like_a_field(word: str) -> bool:
    if not word or not (word[0].isdecimal() or word[0] in "*?"):  # as [\d*?] reads it
        return False  # (the command, an option: without compiling the pattern)
    return bool(re.match(r"^[\d*?][\d*/,\-?LW#~]*$", word))


_BLANKS = re.compile(r"[ \t]+")


def _words(text: str, maxsplit: int = 0) -> list[str]:
    """`text` split at spaces and tabs, as cron and /bin/sh split it; never `str.split()`,
    which also splits at U+2028, U+0085 and other characters a shell keeps inside a word."""
    return [w for w in _BLANKS.split(text.strip(" \t"), maxsplit) if w]


def _shown(job: Job) -> str:
    import shlex  # on error paths only (and for lines with quotes): ~0.8 M to import

    return f"{job.schedule} {shlex.join(job.argv)}"


def split_job_line(line: str) -> tuple[str, list[str]]:
    """(schedule, argv) of a job line; ValueError on unbalanced quotes or a missing command."""
    if line.startswith("@"):
        schedule = _words(line, 1)[0]
        rest = line[len(schedule) :]
    else:
        parts = _words(line, 5)
        if len(parts) < 6:
            raise ValueError(
                "a job line is five schedule fields (or an @word) followed by "
                "[runner options] <management command> [its args]"
            )
        schedule, rest = " ".join(parts[:5]), parts[5]
        first = _words(rest, 1)[0]
        if _looks_like_a_field(first):
            following = _words(rest)
            count = 5 + sum(1 for _ in itertools.takewhile(_looks_like_a_field, following))
            raise ValueError(
                f"{count} schedule fields: Debian's cron has five (minute hour day month "
                "weekday), no seconds or year field"
            )
    if not any(c in rest for c in "'\"\\#"):
        argv = _words(rest)  # what shlex would give, without its cost (1,000-job files)
        if not argv:
            _no_command()
        return schedule, argv
    import shlex

    try:
        argv = shlex.split(rest, comments=False, posix=True)
        commented = shlex.split(rest, comments=True, posix=True)
    except ValueError as exc:
        raise ValueError(
            f"unbalanced quotes ({str(exc).lower()}): close every ' and \" on the same line"
        ) from None
    if not argv:
        _no_command()
    if commented != argv:
        raise ValueError(
            "'#' would be passed to the command, not start a comment: put comments on their "
            "own line above the job, or quote the '#'"
        )
    return schedule, argv


def _no_command():
    raise ValueError("a job line needs a management command after the schedule")


def _check_env_line(name: str, value: str, path: str, lineno: int, raw: str) -> str:
    if name != "MAILTO":
        hint = _ENV_HINTS.get(name, "jobs read their environment from .env")
        raise CrontabError(
            path, lineno, f"only MAILTO= may be set in crontab.d, not {name}= ({hint})", raw
        )
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    if value and not all(re.match(_MAILTO, a) for a in value.split(",")):
        raise CrontabError(
            path,
            lineno,
            f"bad MAILTO {value!r}: use comma-separated addresses without spaces, or MAILTO= "
            "for no mail",
            raw,
        )
    return value


def parse_text(
    text: str,
    path: str,
    known_commands: Iterable[str] | None = None,
    check_args=None,
    second_opinion: bool = False,
) -> Schedule:
    """Parse one file's text; raise CrontabError for the first problem.

    `known_commands`: when given, the command must be one of them. `check_args`: when given,
    a callable (command, args) -> problem or None (see ops/run/commandargs.py, ArgsChecker).
    """
    known = set(known_commands) if known_commands is not None else None
    schedule = Schedule(files=[path])
    comment: list[str] = []
    seen: dict[str, Job] = {}
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(" \t")
        if not line:
            comment = []
            continue
        if line.startswith("\ufeff"):  # invisible when the line is echoed
            raise CrontabError(
                path,
                lineno,
                "starts with a byte-order mark (U+FEFF): save the file as UTF-8 without BOM",
                raw.replace("\ufeff", ""),
            )
        if not line.isprintable() and re.search(_CONTROL, line):  # (\t is not printable)
            raise CrontabError(
                path, lineno, "control characters (a carriage return?) are not allowed", raw
            )
        if line.startswith("#"):
            comment.append(line.lstrip("#").strip())
            continue
        job_like = line.startswith("@") or line[0].isdigit() or line[0] == "*"
        env = None if job_like else re.match(ENV_LINE, line)
        if env:
            value = _check_env_line(env.group(1), env.group(2), path, lineno, raw)
            if schedule.mailto is not None:
                raise CrontabError(
                    path,
                    lineno,
                    f"MAILTO is already set at {schedule.mailto_at}: set it once, it applies "
                    "to every job",
                    raw,
                )
            schedule.mailto, schedule.mailto_at = value, f"{path}:{lineno}"
            comment = []
            continue
        job = _parse_job_line(line, raw, path, lineno, known, check_args, second_opinion)
        if job.name in seen:
            first = seen[job.name]
            raise CrontabError(
                path,
                lineno,
                f"duplicate job name {job.name!r} (first at {first.path}:{first.lineno}); "
                "give one of them --name=",
                raw,
            )
        job.description = " ".join(comment)
        seen[job.name] = job
        schedule.jobs.append(job)
        comment = []
    return schedule


def _parse_job_line(line, raw, path, lineno, known, check_args, second_opinion=False) -> Job:
    if not (line[0].isdigit() or line[0] in "*@?"):
        raise CrontabError(
            path,
            lineno,
            "not a job, comment or MAILTO= line: a job starts with five schedule fields "
            f"or one of {' '.join(SPECIALS)}",
            raw,
        )
    try:
        when, argv = split_job_line(line)
    except ValueError as exc:
        raise CrontabError(path, lineno, str(exc), raw) from None
    problem = validate_schedule(when, second_opinion)
    if problem:
        raise CrontabError(path, lineno, problem, raw)
    try:
        options = parse_run_args(argv)
    except OptionsError as exc:
        valid = f" (valid: {' '.join(schedule_options())}, before the command)"
        raise CrontabError(
            path, lineno, f"runner options: {exc}{'' if exc.suggested else valid}", raw
        ) from None
    if options.logical_date is not None or options.force:
        raise CrontabError(
            path,
            lineno,
            "--logical-date and --force are for runs by hand, not for a schedule",
            raw,
        )
    if options.log is not None:
        raise CrontabError(
            path,
            lineno,
            "--log is not for crontab.d: install_crontab gives every line "
            "--log=OPS_LOG_DIR/<job name>.log",
            raw,
        )
    if options.command == "run_job":
        raise CrontabError(
            path, lineno, "write the command itself: every line already runs run_job", raw
        )
    why = task_options_problem(options)
    if why:
        raise CrontabError(path, lineno, why, raw)
    if known is not None and options.command not in known and not options.is_task:
        meant = close_match(options.command, (c for c in known if c != "run_job"))
        if meant is not None:  # Django's own words for an unknown command
            why = f"unknown management command {options.command!r}. Did you mean {meant}?"
        else:
            why = (
                f"unknown management command {options.command!r} (see `manage.py help` for "
                "the commands this project has)"
            )
        raise CrontabError(path, lineno, why, raw)
    name = options.job_name
    if known is not None and name != options.command and name in known:
        raise CrontabError(
            path,
            lineno,
            f"job name {name!r} is the name of another management command: `run_job {name}` "
            "must not mean a different command; choose another --name",
            raw,
        )
    if check_args is not None:
        problem = check_args(options.command, options.args, options)
        if problem:
            what = "" if options.is_task else f"{options.command}'s arguments: "
            raise CrontabError(path, lineno, f"{what}{problem.strip()}", raw)
    if not JOB_NAME.match(name):
        raise CrontabError(
            path,
            lineno,
            f"job name {shown(name)} must be {JOB_NAME_RULE}: add --name=",
            raw,
        )
    return Job(
        name=name,
        schedule=when if when.startswith("@") else " ".join(when.split()),
        options=options,
        argv=argv,
        path=path,
        lineno=lineno,
    )


def load_schedule(
    directory: Path | str | None = None,
    known_commands=None,
    check_args: bool = False,
    second_opinion: bool = False,
) -> Schedule:
    """Every job in `directory/*.cron` (name order); CrontabError on the first problem.

    `check_args=True` also runs each job's arguments through its command's parser (the
    installer and the system checks do; a run does not pay for it). `second_opinion=True` also
    has python-crontab read each schedule (the installer and the exporter do)."""
    if directory is None:
        from .. import conf

        directory = conf.crontab_dir()
        kept = before_fork.kept(Path(directory))  # the dispatcher's read, in its run_jobs
        if kept is not None and known_commands is None and not (check_args or second_opinion):
            return kept
    if known_commands is None:
        from django.core.management import get_commands

        known_commands = get_commands()
    checker = ArgsChecker() if check_args else None
    directory = Path(directory)
    if not directory.is_dir():
        raise CrontabError(directory, 0, "no such directory (set OPS_CRONTAB_DIR)")
    result = Schedule()
    seen: dict[str, Job] = {}
    for path in sorted(directory.glob("*.cron")):
        try:
            text = path.read_bytes().decode("utf-8")  # no newline translation: a CR is an error
        except (OSError, UnicodeDecodeError) as exc:
            raise CrontabError(path, 0, f"cannot read: {exc} (crontab.d files are UTF-8)") from None
        part = parse_text(text, str(path), known_commands, checker, second_opinion)
        for job in part.jobs:
            if job.name in seen:
                first = seen[job.name]
                raise CrontabError(
                    path,
                    job.lineno,
                    f"duplicate job name {job.name!r} (first at "
                    f"{first.path}:{first.lineno}); give one of them --name=",
                    _shown(job),
                )
            seen[job.name] = job
        if part.mailto is not None:
            if result.mailto is not None:
                lineno = int(part.mailto_at.rsplit(":", 1)[1])
                raise CrontabError(
                    path,
                    lineno,
                    f"MAILTO is already set at {result.mailto_at}: set it once, it applies to "
                    "every job",
                )
            result.mailto, result.mailto_at = part.mailto, part.mailto_at
        result.jobs.extend(part.jobs)
        result.files.append(str(path))
    for job, why in dependencies.problems(result.jobs):  # --after's rules: the first one
        raise CrontabError(job.path, job.lineno, why, _shown(job))
    return result


def load_jobs_leniently(directory: Path | str | None = None, known_commands=None) -> dict:
    """{name: Job} for every job whose own line is valid, even when other lines are not
    (ops/schedule/lenient.py: read only when crontab.d has an error)."""
    from .lenient import load_jobs_leniently as load

    return load(directory, known_commands)
