"""Time zone names as healthchecks.io stores them: the current tzdata name, not a legacy one.

tzdata keeps old names (`US/Eastern`, `Europe/Kiev`, `Asia/Calcutta`) as links to the current
ones (its `backward` file); the healthchecks server stores a check's `tz` under the current
name. The links are read from tzdata's own `tzdata.zi` (the system's zoneinfo, else the
`tzdata` package), never typed in here. The UTC and GMT aliases (`UTC`, `Etc/Universal`...)
are not treated as legacy: they link into `Etc/`, and the server keeps them as written.
"""

import functools
import importlib.resources
import zoneinfo
from pathlib import Path


def _tzdata_zi() -> str:
    for directory in zoneinfo.TZPATH:
        path = Path(directory) / "tzdata.zi"
        if path.is_file():
            return path.read_text()
    try:
        return (importlib.resources.files("tzdata.zoneinfo") / "tzdata.zi").read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        return ""


@functools.cache
def links() -> dict[str, str]:
    """{link name: target} from tzdata.zi (`L TARGET NAME` lines)."""
    found = {}
    for line in _tzdata_zi().splitlines():
        if line.startswith("L "):
            _, target, name = line.split()
            found[name] = target
    return found


def canonical(name: str) -> str:
    """The zone `name` finally links to (itself when it is not a link)."""
    seen = set()
    while name in links() and name not in seen:
        seen.add(name)
        name = links()[name]
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
