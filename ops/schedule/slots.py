"""Slot maths: which scheduled fire time a run serves, its logical date and its key.

Fire times come from cronsim (healthchecks.io's evaluator), which follows Debian cron on DST
days: a fixed-time schedule (minute and hour fields not starting with `*`) fires once, on the
first occurrence of a repeated wall-clock time, and a time inside the skipped spring hour fires
right after the jump; a wildcard schedule (`* * * * *`, `*/15`, `0 *`) fires again in the
repeated autumn hour, each time as its own instant.

A slot's key, the claim's identity, comes in two kinds:

- a schedule that fires at most once per calendar day (minute and hour each a single number:
  `0 3 * * *`, `@daily`, `@weekly`, `@monthly`, `@yearly`) is keyed by its logical date,
  `2026-11-29`: a schedule edit from 03:00 to 04:00 keeps the day's key, and a by-hand
  `--logical-date` run of that day meets the same claim;
- any other schedule is keyed by the wall-clock time in TIME_ZONE plus its UTC offset,
  `2026-10-25 02:30+02:00`, so the two 02:30s of the repeated autumn hour are two slots.

A by-hand `--logical-date` run of an unscheduled command is keyed by the bare date too.
"""

import datetime as dt
import re
from zoneinfo import ZoneInfo

from cronsim import CronSim

from ..values import Value

UTC = dt.UTC
_SINGLE_NUMBER = r"^[0-9]+$"  # compiled at its first use (an ad hoc run has none)
# Computing a slot beyond the calendar's ends (year 1 or 9999) is not a slot, never a crash.
_OUT_OF_RANGE = (OverflowError, ValueError)


class Slot(Value, frozen=True):
    key: str  # the claim's identity: "2026-11-29" or "2026-10-25 02:30+02:00"
    at: dt.datetime | None  # the fire instant (aware); None for a by-hand date slot
    logical_date: dt.date

    def __str__(self) -> str:
        return self.key

    @property
    def by_date(self) -> bool:
        """Keyed by its logical date (a once-a-day schedule, or a by-hand date slot)."""
        return is_date_key(self.key)


def is_date_key(key: str) -> bool:
    return len(key) == 10


def once_a_day(expr: str) -> bool:
    """Fires at most once per calendar day: the minute and the hour are single numbers."""
    minute, hour = expr.split()[:2]
    return bool(re.match(_SINGLE_NUMBER, minute) and re.match(_SINGLE_NUMBER, hour))


def utc_offset(value: dt.datetime) -> str:
    """`+02:00` (`+05:53:28` for the odd historical offset that has seconds)."""
    offset = value.utcoffset()
    assert offset is not None, "an aware datetime"
    seconds = int(offset.total_seconds())
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" + (f":{secs:02d}" if secs else "")


def time_key(fire: dt.datetime) -> str:
    """Wall-clock time plus UTC offset: the two 02:30s of an autumn night differ."""
    return f"{fire:%Y-%m-%d %H:%M}{utc_offset(fire)}"


def wall_clock(slot: Slot, tz: ZoneInfo) -> str:
    """The slot as an operator reads it: `2026-11-29 03:00` (the date alone for a date slot)."""
    if slot.at is None:
        return slot.key
    return slot.at.astimezone(tz).strftime("%Y-%m-%d %H:%M")


def make_slot(expr: str, fire: dt.datetime) -> Slot:
    key = fire.date().isoformat() if once_a_day(expr) else time_key(fire)
    return Slot(key=key, at=fire, logical_date=fire.date())


def _local(instant: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    """`instant` in `tz`. Arithmetic is done in UTC first: an aware datetime plus a timedelta
    keeps its wall clock and drops `fold`, which would turn the second 02:31 of an autumn night
    into the first."""
    return instant.astimezone(UTC).astimezone(tz)


def current_slot(expr: str, now: dt.datetime, tz: ZoneInfo) -> Slot:
    """The most recent fire time of `expr` at or before `now`."""
    # cronsim's reverse iteration is strictly before its start: start just after `now`'s minute.
    start = now.astimezone(UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    fire = next(CronSim(expr, _local(start, tz), reverse=True))
    # From the second pass of a repeated autumn hour (02:10 CET) the reverse walk compares
    # wall clocks and misses a fixed-time fire of the first pass (02:30 CEST, an hour ago): it
    # answers the day before. The forward walk follows DST; step it up to `now`.
    limit = now.astimezone(UTC)
    for later in CronSim(expr, fire):
        if later.astimezone(UTC) > limit:
            break
        fire = later
    return make_slot(expr, fire)


def previous_slots(
    expr: str,
    slot: Slot,
    count: int,
    tz: ZoneInfo,
    *,
    after: dt.datetime | None = None,
    since: dt.datetime | None = None,
) -> list[Slot]:
    """Up to `count` distinct slots before `slot`, oldest first: only fire times later than
    `after` and not earlier than `since`. The walk back stops there (and at the calendar's
    start), so it never runs far into the past nor raises."""
    found: list[Slot] = []
    keys = {slot.key}
    start = slot.at if slot.at is not None else start_of_day(slot.logical_date, tz)
    try:
        for fire in CronSim(expr, _local(start, tz), reverse=True):
            # Compared in UTC: two datetimes in one zone compare by wall clock, fold ignored.
            instant = fire.astimezone(UTC)
            if (after is not None and instant <= after) or (since is not None and instant < since):
                break
            candidate = make_slot(expr, fire)
            if candidate.key in keys:  # a once-a-day key met twice (never in practice)
                continue
            keys.add(candidate.key)
            found.append(candidate)
            if len(found) >= count:
                break
    except _OUT_OF_RANGE:
        pass  # before year 1: there is nothing earlier to catch up
    return list(reversed(found))


def start_of_day(day: dt.date, tz: ZoneInfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(0, 0), tzinfo=tz)


def slot_on_date(expr: str, day: dt.date, tz: ZoneInfo) -> Slot:
    """The first slot of `expr` on `day`, for --logical-date; ValueError if it has none."""
    try:
        start = _local(start_of_day(day, tz).astimezone(UTC) - dt.timedelta(minutes=1), tz)
        fire = next(CronSim(expr, start))
    except (*_OUT_OF_RANGE, StopIteration):
        fire = None
    if fire is None or fire.date() != day:
        raise ValueError(f"the schedule {expr!r} has no slot on {day}")
    return make_slot(expr, fire)


def date_slot(day: dt.date) -> Slot:
    """A slot for an unscheduled command run with --logical-date: the date itself."""
    return Slot(key=day.isoformat(), at=None, logical_date=day)


def next_fire(expr: str, now: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    return next(CronSim(expr, _local(now.astimezone(UTC).replace(second=0, microsecond=0), tz)))
