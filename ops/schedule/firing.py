"""When Debian's cron starts a job: a model of its daemon (cron.c, 3.0pl1), minute by minute.

bench/faults/f7_clock.py checks this model against the real daemon under libfaketime (both DST
nights of Europe/Berlin), and the dispatcher (`manage.py run_due_jobs`, ops/run/dispatch.py)
uses it to start the jobs the per-job lines would have started.

Each wake-up the daemon compares its wall clock (local time, to the minute) with its "virtual"
minute, the last one it ran jobs for:

- +1: every job due at the new minute;
- +2 … +5 (a late wake-up): every job due in each minute missed, and the new one;
- +6 … +180 (a clock set forward; the DST spring jump): fixed-time jobs for each minute
  skipped, wildcard jobs (minute or hour field starting with `*`) once, at the new minute;
- -180 … 0 (a clock set back; the repeated autumn hour): wildcard jobs only, at the clock's
  minute; fixed-time jobs wait until the wall clock passes the virtual minute again;
- further off: every job due at the new minute, from there on.
"""

import datetime as dt
from collections.abc import Iterable
from zoneinfo import ZoneInfo

from cronsim import CronSim

UTC = dt.UTC
# How far back the stateless question "due at this minute?" replays the daemon: its longest
# memory is a clock set back by up to 3 h (the autumn hour is one), plus a minute.
LOOKBACK = dt.timedelta(minutes=181)
_ANY_DAY = dt.datetime(2000, 1, 1)


class Expr:
    """One five-field schedule, matched against a wall-clock minute as cron matches it (the
    day-of-month / day-of-week AND/OR rule included: cronsim's fields and day matcher)."""

    def __init__(self, expr: str):
        self.text = expr
        self._sim = CronSim(expr, _ANY_DAY)
        minute, hour = expr.split()[:2]
        # Debian's cron: a job whose minute or hour field starts with `*` follows the wall clock
        # in a repeated hour and is started once after a jump (its MIN_STAR / HR_STAR flags).
        self.wildcard = minute.startswith("*") or hour.startswith("*")

    def matches(self, wall: dt.datetime) -> bool:
        sim = self._sim
        return (
            wall.minute in sim.minutes
            and wall.hour in sim.hours
            and wall.month in sim.months
            and sim.match_day(wall.date())
        )


class Daemon:
    """Debian cron's scheduling loop over `jobs` ({name: Expr}), fed one wall clock a wake-up."""

    def __init__(self, jobs: dict[str, Expr]):
        self.jobs = jobs
        self.virtual: dt.datetime | None = None  # naive wall clock, to the minute

    def wake(self, wall: dt.datetime) -> list[str]:
        """The jobs started at this wake-up (each once, in `jobs`' order), the wall clock naive
        and to the minute."""
        wall = wall.replace(second=0, microsecond=0, tzinfo=None)
        if self.virtual is None:
            self.virtual = wall - dt.timedelta(minutes=1)
        diff = round((wall - self.virtual).total_seconds() / 60)
        due: list[str] = []
        if diff == 1:
            due = self._due(wall)
            self.virtual = wall
        elif 1 < diff <= 5:
            for k in range(1, diff + 1):
                due += self._due(self.virtual + dt.timedelta(minutes=k))
            self.virtual = wall
        elif 5 < diff <= 180:
            for k in range(1, diff + 1):
                due += self._due(self.virtual + dt.timedelta(minutes=k), fixed=True)
            due += self._due(wall, wildcard=True)
            self.virtual = wall
        elif -180 <= diff <= 0:
            due = self._due(wall, wildcard=True)
        else:
            due = self._due(wall)
            self.virtual = wall
        return list(dict.fromkeys(due))

    def _due(self, wall: dt.datetime, fixed: bool = False, wildcard: bool = False) -> list[str]:
        return [
            name
            for name, expr in self.jobs.items()
            if (not fixed or not expr.wildcard)
            and (not wildcard or expr.wildcard)
            and expr.matches(wall)
        ]


def due_at(jobs: dict[str, Expr], now: dt.datetime, tz: ZoneInfo) -> list[str]:
    """The jobs Debian's cron, running in `tz` and woken every minute, starts at `now`'s minute."""
    return replay(jobs, now, tz)[0]


def replay(jobs: dict[str, Expr], now: dt.datetime, tz: ZoneInfo) -> tuple[list[str], dt.datetime]:
    """due_at's jobs, and the daemon's virtual minute after that wake-up (naive wall clock).

    Without a change of UTC offset in the last 3 h the daemon's virtual minute is simply the
    previous minute: the jobs matching the wall clock. Around one (a DST night) the daemon is
    replayed minute by minute from 3 h before, so that a repeated or skipped hour is met as the
    daemon meets it."""
    now = now.astimezone(UTC).replace(second=0, microsecond=0)
    first = now - LOOKBACK
    wall = now.astimezone(tz).replace(tzinfo=None)
    if first.astimezone(tz).utcoffset() == now.astimezone(tz).utcoffset():
        return Daemon(jobs)._due(wall), wall
    daemon = Daemon(jobs)
    due: list[str] = []
    for reading in minutes(first, now):
        due = daemon.wake(reading.astimezone(tz))
    assert daemon.virtual is not None  # woken at least once
    return due, daemon.virtual


def minutes(first: dt.datetime, last: dt.datetime) -> Iterable[dt.datetime]:
    """Every real minute from `first` to `last` (aware), both included."""
    at = first
    while at <= last:
        yield at
        at += dt.timedelta(minutes=1)
