"""`--until=WHEN` (job_pause, the jobs page's Pause): when a pause ends by itself.

WHEN is a duration (`90m`, `2h`, `3d`, `1.5h`: from now), a date (`2026-12-07`: that day's
00:00), a date and time (`2026-12-07T14:00`, or with a space) or a time (`14:00`: the next
one, today or tomorrow), all in TIME_ZONE, in the future and at most 365 days ahead. (Its own
module: run_job never parses one, and does not compile these patterns.)
"""

import datetime as dt
import re
from zoneinfo import ZoneInfo

from ..schedule.durations import parse_duration
from .pauses import local

MAX_AHEAD = dt.timedelta(days=365)
_DURATION = re.compile(r"[0-9]+(\.[0-9]+)?[smhd]")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATE_TIME = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})[T ]([0-9]{2}:[0-9]{2}(:[0-9]{2})?)")
_TIME = re.compile(r"[0-9]{1,2}:[0-9]{2}(:[0-9]{2})?")
SPELLINGS = (
    "a duration (2h, 90m, 3d), a date (2026-12-07), a date and time (2026-12-07T14:00) or a "
    "time (14:00)"
)


def parse_until(text: str, now: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    """When a pause given `--until=text` at `now` ends; ValueError naming the spellings."""
    text = text.strip()
    try:
        if _DURATION.fullmatch(text):
            until = now + dt.timedelta(seconds=parse_duration(text, MAX_AHEAD.total_seconds()))
        elif _DATE.fullmatch(text):
            until = dt.datetime.combine(dt.date.fromisoformat(text), dt.time(0), tzinfo=tz)
        elif match := _DATE_TIME.fullmatch(text):
            day, time = dt.date.fromisoformat(match[1]), dt.time.fromisoformat(match[2])
            until = dt.datetime.combine(day, time, tzinfo=tz)
        elif _TIME.fullmatch(text):
            parts = [int(part) for part in text.split(":")] + [0]
            time = dt.time(parts[0], parts[1], parts[2])
            until = dt.datetime.combine(now.astimezone(tz).date(), time, tzinfo=tz)
            if until <= now:
                until = dt.datetime.combine(until.date() + dt.timedelta(days=1), time, tzinfo=tz)
        else:
            raise ValueError("not a spelling")
    except ValueError:
        shown = repr(text) if len(text) <= 40 else repr(text[:30]) + "…"
        raise ValueError(f"bad --until {shown}: use {SPELLINGS}, in {tz}") from None
    # The instant, in tz: a wall-clock time a DST gap skips (02:30 on the spring-forward day in
    # Berlin) is the time after it (03:30+02:00), as job_status shows it.
    until = until.astimezone(dt.UTC).astimezone(tz)
    if until <= now:
        raise ValueError(f"--until {text} is not in the future ({local(until, tz)} in {tz})")
    if until - now > MAX_AHEAD:
        raise ValueError(f"--until {text} is more than 365 days ahead: pause without --until")
    return until
