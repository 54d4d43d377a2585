"""Read and validate `crontab.d/*.cron`: the one parser every command uses.

A job line is a schedule followed by `run_job`'s argument list (see DESIGN.md). Everything
that Debian's cron would silently misread, or that would never fire, is an error that names
`file:line`.
"""

import calendar
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .options import OptionsError, RunOptions, parse_run_args

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
# name, low, high, names accepted by Debian's cron (single values only, never in ranges)
FIELDS = [
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}),
    (
        "day of week",
        0,
        7,
        {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
    ),
]
_ENV_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)$")
_ITEM = re.compile(r"^(\*|\d+|\d+-\d+)(?:/(\d+))?$")


class CrontabError(ValueError):
    """A crontab.d problem, always located: `file:line: message`."""

    def __init__(self, path, lineno, message, text=""):
        self.path, self.lineno, self.message, self.text = str(path), lineno, message, text
        where = f"{self.path}:{lineno}" if lineno else self.path
        super().__init__(f"{where}: {message}" + (f" (in: {text.strip()})" if text else ""))


@dataclass
class Job:
    name: str
    schedule: str  # as written: five fields or an @word
    options: RunOptions
    argv: list[str]  # run_job's arguments exactly as written
    description: str = ""
    path: str = ""
    lineno: int = 0

    @property
    def cron_expr(self) -> str | None:
        """Five fields for the slot maths; None for @reboot (no slots)."""
        return SPECIALS[self.schedule] if self.schedule.startswith("@") else self.schedule


@dataclass
class Schedule:
    jobs: list[Job] = field(default_factory=list)
    mailto: str | None = None
    files: list[str] = field(default_factory=list)

    def get(self, name: str) -> Job | None:
        return next((j for j in self.jobs if j.name == name), None)


def validate_field(text: str, index: int) -> str | None:
    """None if Debian's cron reads `text` as field `index` the way it looks; else why not."""
    name, low, high, names = FIELDS[index]
    if text.lower() in names:
        return None
    for item in text.split(","):
        match = _ITEM.match(item)
        if not match:
            return (
                f"bad {name} {text!r}: use *, N, N-M, */S or N-M/S "
                f"with {low}-{high}, comma-separated"
            )
        base, step = match.groups()
        if base == "*":
            lo, hi = low, high
        elif "-" in base:
            lo, hi = (int(x) for x in base.split("-"))
            if lo > hi:
                return f"bad {name} {item!r}: range start is after its end"
        else:
            lo = hi = int(base)
            if step is not None:
                return f"bad {name} {item!r}: a step needs * or a range (*/S, N-M/S)"
        if not (low <= lo <= high and low <= hi <= high):
            return f"bad {name} {item!r}: values must be {low}-{high}"
        if (step is not None and not 1 <= int(step) <= high - low + 1) or step == "0":
            return f"bad {name} step in {item!r}: must be 1-{high - low + 1}"
    return None


def _field_values(text: str, index: int) -> set[int]:
    _, low, high, names = FIELDS[index]
    if text.lower() in names:
        return {names[text.lower()]}
    values = set()
    for item in text.split(","):
        base, step = _ITEM.match(item).groups()
        if base == "*":
            lo, hi = low, high
        elif "-" in base:
            lo, hi = (int(x) for x in base.split("-"))
        else:
            lo = hi = int(base)
        values.update(range(lo, hi + 1, int(step or 1)))
    return values


def validate_schedule(schedule: str) -> str | None:
    """None when `schedule` is a valid Debian cron schedule that can fire; else why not."""
    if schedule.startswith("@"):
        if schedule.lower() not in SPECIALS:
            return f"unknown schedule {schedule!r}: use five fields or one of {' '.join(SPECIALS)}"
        return None
    fields = schedule.split()
    if len(fields) != 5:
        return f"a schedule has five fields (minute hour day month weekday), not {len(fields)}"
    for i, text in enumerate(fields):
        problem = validate_field(text, i)
        if problem:
            return problem
    dom, dow = fields[2], fields[4]
    if dow == "*" and not dom.startswith("*"):
        days, months = _field_values(dom, 2), _field_values(fields[3], 3)
        longest = max(calendar.monthrange(2024, m)[1] for m in months)  # 2024: Feb has 29
        if min(days) > longest:
            return f"never fires: no month in {fields[3]!r} has day {min(days)}"
    return None


def split_job_line(line: str) -> tuple[str, list[str]]:
    """(schedule, argv) of a job line; ValueError on unbalanced quotes or a missing command."""
    if line.startswith("@"):
        schedule, _, rest = line.partition(" ")
        rest = line[len(schedule) :]
    else:
        parts = line.split(None, 5)
        if len(parts) < 6:
            raise ValueError("a job line is a schedule followed by a command")
        schedule, rest = " ".join(parts[:5]), parts[5]
    argv = shlex.split(rest, comments=False, posix=True)
    if not argv:
        raise ValueError("a job line is a schedule followed by a command")
    return schedule, argv


def parse_text(text: str, path: str, known_commands: Iterable[str] | None = None) -> Schedule:
    """Parse one file's text; raise CrontabError for the first problem."""
    known = set(known_commands) if known_commands is not None else None
    schedule = Schedule(files=[path])
    comment: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            comment = []
            continue
        if line.startswith("#"):
            comment.append(line.lstrip("#").strip())
            continue
        env = _ENV_LINE.match(line)
        if env and not line.startswith("@") and not line[0].isdigit() and line[0] != "*":
            if env.group(1) != "MAILTO":
                raise CrontabError(
                    path,
                    lineno,
                    f"only MAILTO= may be set here, not {env.group(1)}"
                    " (jobs read their environment from .env)",
                    raw,
                )
            schedule.mailto = env.group(2).strip().strip("'\"")
            comment = []
            continue
        try:
            when, argv = split_job_line(line)
        except ValueError as exc:
            raise CrontabError(path, lineno, str(exc), raw) from None
        problem = validate_schedule(when)
        if problem:
            raise CrontabError(path, lineno, problem, raw)
        try:
            options = parse_run_args(argv)
        except OptionsError as exc:
            raise CrontabError(path, lineno, f"runner options: {exc}", raw) from None
        if options.logical_date is not None or options.force:
            raise CrontabError(
                path,
                lineno,
                "--logical-date and --force are for runs by hand, not for a schedule",
                raw,
            )
        if known is not None and options.command not in known:
            raise CrontabError(path, lineno, f"unknown management command {options.command!r}", raw)
        if "%" in line:
            raise CrontabError(
                path, lineno, "'%' is not allowed (cron turns it into a newline)", raw
            )
        name = options.job_name
        if not re.match(r"^[a-z0-9_-]{1,100}$", name):
            raise CrontabError(
                path, lineno, f"job name {name!r} must be a-z, 0-9, '_' or '-': add --name=", raw
            )
        schedule.jobs.append(
            Job(
                name=name,
                schedule=when.lower() if when.startswith("@") else " ".join(when.split()),
                options=options,
                argv=argv,
                description=" ".join(comment),
                path=path,
                lineno=lineno,
            )
        )
        comment = []
    return schedule


def load_schedule(directory: Path | str | None = None, known_commands=None) -> Schedule:
    """Every job in `directory/*.cron` (name order); CrontabError on the first problem."""
    if directory is None:
        from django.conf import settings

        directory = settings.OPS_CRONTAB_DIR
    if known_commands is None:
        from django.core.management import get_commands

        known_commands = get_commands()
    directory = Path(directory)
    if not directory.is_dir():
        raise CrontabError(directory, 0, "no such directory (set OPS_CRONTAB_DIR)")
    result = Schedule()
    seen: dict[str, Job] = {}
    for path in sorted(directory.glob("*.cron")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CrontabError(path, 0, f"cannot read: {exc}") from None
        part = parse_text(text, str(path), known_commands)
        for job in part.jobs:
            if job.name in seen:
                first = seen[job.name]
                raise CrontabError(
                    path,
                    job.lineno,
                    f"duplicate job name {job.name!r} (first at "
                    f"{first.path}:{first.lineno}); add --name=",
                )
            seen[job.name] = job
        if part.mailto is not None:
            result.mailto = part.mailto
        result.jobs.extend(part.jobs)
        result.files.append(str(path))
    return result
