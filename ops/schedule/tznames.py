"""Time zone names as healthchecks.io stores them: the current tzdata name, not a legacy one.

tzdata keeps old names (`US/Eastern`, `Europe/Kiev`, `Asia/Calcutta`) as links to the current
ones (its `backward` file); the healthchecks server stores a check's `tz` under the current
name. The links are read from tzdata's own `tzdata.zi` (the system's zoneinfo, else the
`tzdata` package), never typed in here. The UTC and GMT aliases (`UTC`, `Etc/Universal`...)
are not treated as legacy: they link into `Etc/`, and the server keeps them as written.
"""

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


def same_zone(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return a == b
    return a == b or canonical(a) == canonical(b)


def current_name(name: str) -> str | None:
    """The current name when `name` is a legacy one (`US/Eastern` → `America/New_York`)."""
    target = canonical(name)
    if target == name or target.startswith("Etc/") or name.startswith("Etc/"):
        return None
    return target
