"""Slot maths: which scheduled fire time a run serves, and its logical date.

A slot is identified by its wall-clock time in TIME_ZONE ("2026-10-25 02:30"), like Debian's
cron: the repeated autumn hour maps onto the slots it already had, and a fixed time inside the
skipped spring hour fires right after the jump (cronsim follows the same rules).
"""

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from cronsim import CronSim

SLOT_FORMAT = "%Y-%m-%d %H:%M"


@dataclass(frozen=True)
class Slot:
    key: str  # wall-clock text in TIME_ZONE, the claim's identity
    at: dt.datetime | None  # the fire instant (aware); None for a by-hand date slot
    logical_date: dt.date

    def __str__(self):
        return self.key


def _slot(fire: dt.datetime) -> Slot:
    return Slot(key=fire.strftime(SLOT_FORMAT), at=fire, logical_date=fire.date())


def _minute_after(now: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    local = now.astimezone(tz).replace(second=0, microsecond=0)
    return local + dt.timedelta(minutes=1)


def current_slot(expr: str, now: dt.datetime, tz: ZoneInfo) -> Slot:
    """The most recent fire time of `expr` at or before `now`."""
    # cronsim's reverse iteration is strictly before its start: start just after `now`'s minute.
    return _slot(next(CronSim(expr, _minute_after(now, tz), reverse=True)))


def previous_slots(expr: str, slot: Slot, count: int, tz: ZoneInfo) -> list[Slot]:
    """Up to `count` distinct slots before `slot`, oldest first."""
    found: list[Slot] = []
    keys = {slot.key}
    start = slot.at if slot.at is not None else _start_of_day(slot.logical_date, tz)
    for fire in CronSim(expr, start.astimezone(tz), reverse=True):
        candidate = _slot(fire)
        if candidate.key in keys:  # the repeated autumn hour: same wall-clock slot
            continue
        keys.add(candidate.key)
        found.append(candidate)
        if len(found) == count:
            break
    return list(reversed(found))


def _start_of_day(day: dt.date, tz: ZoneInfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(0, 0), tzinfo=tz)


def slot_on_date(expr: str, day: dt.date, tz: ZoneInfo) -> Slot:
    """The first slot of `expr` on `day`, for --logical-date; ValueError if it has none."""
    start = _start_of_day(day, tz) - dt.timedelta(minutes=1)
    fire = next(CronSim(expr, start))
    if fire.date() != day:
        raise ValueError(f"the schedule {expr!r} has no slot on {day}")
    return _slot(fire)


def date_slot(day: dt.date) -> Slot:
    """A slot for an unscheduled command run with --logical-date: the date itself."""
    return Slot(key=day.isoformat(), at=None, logical_date=day)


def next_fire(expr: str, now: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    return next(CronSim(expr, now.astimezone(tz).replace(second=0, microsecond=0)))
