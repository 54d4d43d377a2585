"""A schedule the warm dispatcher read (ops/run/dispatch.py) before forking its run_jobs: a
run_job's plain read of the same, unchanged crontab.d files takes it instead of parsing them
again (crontabd.load_schedule). Only ever set in the dispatcher's process, which forks."""

from pathlib import Path
from typing import Any

_kept: tuple[tuple, Any] | None = None


def identity(directory: Path) -> tuple:
    """What tells that crontab.d's files are the ones read: each file's name, inode, size and
    modification time (empty when one cannot be read)."""
    found = []
    for path in sorted(directory.glob("*.cron")):
        try:
            st = path.stat()
        except OSError:
            return ()
        found.append((path.name, st.st_ino, st.st_size, st.st_mtime_ns))
    return (str(directory), tuple(found))


def keep_for_children(schedule: Any, directory: Path) -> None:
    """The dispatcher, before it forks: `schedule` was read from `directory` with
    load_schedule's defaults."""
    global _kept
    _kept = (identity(directory), schedule)


def kept(directory: Path) -> Any:
    """The kept schedule when `directory`'s files are still the ones it was read from."""
    if _kept is None or not _kept[0] or _kept[0] != identity(directory):
        return None
    return _kept[1]
