"""The system time zone against TIME_ZONE: Debian's cron has no CRON_TZ and fires every line in
the system's zone, so the installer (and `manage.py check`) refuses when the two differ.
"""

import os
from pathlib import Path

UTC_NAMES = {"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu"}


def system_time_zone(
    localtime: Path = Path("/etc/localtime"), timezone_file: Path = Path("/etc/timezone")
) -> str:
    """The system's zone name: /etc/localtime's link target, else /etc/timezone, else UTC."""
    try:
        target = os.readlink(localtime)
        if "zoneinfo/" in target:
            return target.split("zoneinfo/", 1)[1]
    except OSError:
        if not localtime.exists():
            return "UTC"  # glibc's default without /etc/localtime
    try:
        return timezone_file.read_text().strip() or "UTC"
    except OSError:
        return "unknown"


def _zone_data(name: str, zoneinfo: Path) -> bytes | None:
    try:
        return (zoneinfo / name).read_bytes()
    except (OSError, ValueError):
        return None


def tz_mismatch(
    time_zone: str,
    localtime: Path = Path("/etc/localtime"),
    timezone_file: Path = Path("/etc/timezone"),
    zoneinfo: Path = Path("/usr/share/zoneinfo"),
) -> str | None:
    """None when the system's time zone is TIME_ZONE (or an alias of it); else the problem."""
    system = system_time_zone(localtime, timezone_file)
    if system == time_zone or {system, time_zone} <= UTC_NAMES:
        return None
    wanted = _zone_data(time_zone, zoneinfo)
    try:
        current = localtime.read_bytes() if localtime.exists() else _zone_data("UTC", zoneinfo)
    except OSError:
        current = None
    if wanted is not None and wanted == current:
        return None
    return (
        f"the system time zone is {system} but TIME_ZONE is {time_zone}, and Debian's cron fires "
        "in the system time zone (it has no CRON_TZ)"
    )


def tz_hint(time_zone: str) -> str:
    return (
        f"run `timedatectl set-timezone {time_zone}` (then restart cron), or set TIME_ZONE to the "
        "system's zone (in your settings, or .env if they read it from there)"
    )
