"""crontab.d's --after rules (ops/run/after.py runs them): every upstream is a declared job, no
job depends on itself through any chain, and an upstream's logical dates line up with its
dependent's.

The rule for lining up: a dependent slot waits for its upstream's success *for the same
logical date*, so the upstream must have exactly one slot on each date the dependent runs:
a once-a-day schedule (single minute and hour) that fires on every day the dependent fires.
A daily job after a weekly one would wait six days in seven for a date the upstream never
runs; a job after an hourly one would not know which of its 24 slots it means. The days are
compared as the days cron fires on, not as text: `mon-fri` is `1-5`, `0` is `7`, `*/1` is `*`.
"""

import calendar
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .crontabd import Job

EVERY_DAY = ["*", "*", "*"]
WEEKDAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
# Not the locale's (calendar.month_name): every other message is English too.
MONTHS = ["", "January", "February", "March", "April", "May", "June", "July", "August"]
MONTHS += ["September", "October", "November", "December"]


def problems(jobs: list["Job"]) -> list[tuple["Job", str]]:
    """(job, why) for each job whose --after breaks a rule, in file order."""
    found: list[tuple[Job, str]] = []
    by_name = {job.name: job for job in jobs}
    for job in jobs:
        for name in job.options.after or ():
            upstream = by_name.get(name)
            if upstream is None:
                found.append((job, f"--after names {name!r}, which no crontab.d line declares"))
                continue
            why = _lines_up(job, upstream)
            if why:
                found.append((job, why))
    for job in jobs:
        cycle = _cycle_from(job, by_name)
        if cycle:
            found.append((job, "--after makes a cycle: " + " → ".join(cycle)))
            break  # one report per cycle is enough: the first job of it in file order
    return found


def refusal(job: "Job", jobs: dict[str, "Job"]) -> str:
    """Why a run of `job` (its options as run_job merged them with its command line) breaks a
    rule above against the declared `jobs`, or "". The command line's --after, and a crontab.d
    whose error run_job steps over (another line's), are held to the same rules as a line."""
    by_name = {**jobs, job.name: job}
    for name in job.options.after or ():
        upstream = by_name.get(name)
        if upstream is None:
            return f"--after names {name!r}, which no crontab.d line declares"
        why = _lines_up(job, upstream)
        if why:
            return why
    cycle = _cycle_from(job, by_name)
    return "--after makes a cycle: " + " → ".join(cycle) if cycle else ""


def _lines_up(job: "Job", upstream: "Job") -> str:
    if upstream.name == job.name:
        return f"job {job.name!r} cannot run --after itself"
    mine, theirs = job.cron_expr, upstream.cron_expr
    if mine is None or theirs is None:
        which = job if mine is None else upstream
        return f"--after {upstream.name}: @reboot job {which.name!r} has no logical dates"
    from .slots import once_a_day  # with an --after only: the slot maths' import

    if not once_a_day(theirs):
        return (
            f"--after {upstream.name}: its schedule `{upstream.schedule}` runs several times a "
            "day, so its logical dates do not line up with this job's (an upstream must run "
            "once a day: single minute and hour)"
        )
    days, their_days = mine.split()[2:], theirs.split()[2:]
    if their_days in (EVERY_DAY, days):
        return ""  # the common cases, without the calendar
    missed = _a_day_missed(" ".join(days), " ".join(their_days))
    if missed:
        return (
            f"--after {upstream.name}: its schedule `{upstream.schedule}` does not run on every "
            f"day this job's `{job.schedule}` runs (not on a {missed}, for one), so some of "
            "this job's logical dates would wait for a date it never runs"
        )
    return ""


@functools.lru_cache(maxsize=256)
def _a_day_missed(days: str, their_days: str) -> str:
    """A day (`Sunday 1 January`) that the day fields `days` fire on and `their_days` do not,
    or "" when there is none."""
    mine, theirs = _fire_days(days), _fire_days(their_days)
    for (month, day), weekdays in mine.items():
        for weekday in sorted(weekdays - theirs.get((month, day), frozenset())):
            return f"{WEEKDAYS[weekday]} {day} {MONTHS[month]}"
    return ""


def _fire_days(fields: str) -> dict[tuple[int, int], frozenset[int]]:
    """{(month, day of month): the weekdays (0 = Sunday) it fires on} for day fields `fields`
    (day of month, month, day of week), by Debian cron's rule (crontabd.validate_schedule):
    when either day field starts with `*` a day must match both, else either. Every (month,
    day, weekday) comes round in the calendar (29 February too, within 28 years), so these are
    the days themselves."""
    from .crontabd import _field_values  # crontabd imports this module

    dom, month, dow = fields.split()
    days, months = _field_values(dom, 2), _field_values(month, 3)
    weekdays = frozenset(w % 7 for w in _field_values(dow, 4))  # 7 is Sunday too
    both = dom.startswith("*") or dow.startswith("*")
    every = frozenset(range(7))
    fired: dict[tuple[int, int], frozenset[int]] = {}
    for m in sorted(months):
        for day in range(1, calendar.monthrange(2000, m)[1] + 1):  # 2000: 29 February
            if both:
                on = weekdays if day in days else frozenset()
            else:
                on = every if day in days else weekdays
            if on:
                fired[m, day] = on
    return fired


def _cycle_from(start: "Job", by_name: dict[str, "Job"]) -> list[str]:
    """The names along a chain of --after from `start` back to it; [] when there is none."""
    stack = [(start.name, [start.name])]
    seen: set[str] = set()
    while stack:
        name, path = stack.pop()
        job = by_name.get(name)
        for upstream in (job.options.after or ()) if job else ():
            if upstream == start.name:
                return [*path, upstream]
            if upstream not in seen:
                seen.add(upstream)
                stack.append((upstream, [*path, upstream]))
    return []
