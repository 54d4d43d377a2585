"""Time zone names: tzdata's legacy names, and whether two names tell the same time.

tzdata keeps old names (`US/Eastern`, `Europe/Kiev`, `Asia/Calcutta`) as links to the current
ones (its `backward` file). The links are read from tzdata's own `tzdata.zi` (the system's
zoneinfo, else the `tzdata` package), never typed in here. The UTC and GMT aliases (`UTC`,
`Etc/Universal`...) are not treated as legacy: they link into `Etc/`.

The healthchecks server renames a check's `tz` by a table of its own, not by tzdata's links
(`CET` is stored as `Europe/Brussels`, `America/Montreal` as written), and the table differs
between its versions. So sync_healthchecks does not predict the name the server stores: it
compares zones by their rules (`same_rules`: the same UTC offset at every moment of the coming
year, which is what decides when a check alerts) and says what the server stored once it has.
"""

import datetime as dt
import functools
import zoneinfo
from pathlib import Path


@functools.cache
def _tzdata_zi() -> str:
    for directory in zoneinfo.TZPATH:
        path = Path(directory) / "tzdata.zi"
        if path.is_file():
            return path.read_text()
    import importlib.resources  # only without a system tzdata: its import is costly

    try:
        return (importlib.resources.files("tzdata.zoneinfo") / "tzdata.zi").read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        return ""


def _target(name: str) -> str | None:
    """What `name` links to in tzdata.zi (an `L TARGET NAME` line), or None: a search for the
    name, not a parse of the whole file (manage.py check's zone check runs for every command)."""
    text, needle = _tzdata_zi(), f" {name}\n"
    at = text.find(needle)
    while at != -1:
        line = text[text.rfind("\n", 0, at) + 1 : at + len(needle) - 1].split()
        if len(line) == 3 and line[0] == "L" and line[2] == name:
            return line[1]
        at = text.find(needle, at + 1)
    return None


def canonical(name: str) -> str:
    """The zone `name` finally links to (itself when it is not a link)."""
    seen = set()
    while (target := _target(name)) is not None and name not in seen:
        seen.add(name)
        name = target
    return name


RULES_SPAN = 366 * 86400  # seconds ahead over which two zones must agree
RULES_STEP = 900  # every quarter of an hour: tzdata's transitions fall on one


def same_rules(a: str | None, b: str | None, *, now: dt.datetime) -> bool:
    """Whether zones `a` and `b` give the same UTC offset at every moment of the year from
    `now` (a check in either alerts at the same instants); names that are not zones differ."""
    if not a or not b or a == b:
        return a == b
    if canonical(a) == canonical(b):
        return True
    start = int(now.timestamp()) // RULES_STEP * RULES_STEP
    return _offsets(a, start) == _offsets(b, start) != ()


@functools.cache
def _offsets(name: str, start: int) -> tuple[dt.timedelta | None, ...]:
    try:
        zone = zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return ()
    at = dt.datetime.fromtimestamp
    return tuple(at(t, zone).utcoffset() for t in range(start, start + RULES_SPAN, RULES_STEP))


def current_name(name: str) -> str | None:
    """tzdata's current name when `name` is a legacy one (`US/Eastern` → `America/New_York`)."""
    target = canonical(name)
    if target == name or target.startswith("Etc/") or name.startswith("Etc/"):
        return None
    return target
