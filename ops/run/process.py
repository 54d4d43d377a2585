"""Who holds a claim, in terms the kernel can check: is that process provably gone?

A claim records its holder as this kernel's boot id, the pid namespace, the pid and the
process's start time (clock ticks after boot, field 22 of /proc/<pid>/stat). Another run can
check such a holder only when it shares the boot id and the pid namespace (the same machine and
container, since the same boot): then the holder is gone when its pid no longer exists or now
belongs to a process started at another time (pid reuse). A holder anywhere else (another
machine, another container, this machine before a reboot) cannot be checked here; only its
stale heartbeat frees its claim.

OPS_HOST is never part of this: it is a display name, and two servers may share it.
"""

import os
from pathlib import Path

from ..values import Value

PROC = Path("/proc")


class Identity(Value, frozen=True):
    boot_id: str  # "" where the kernel does not say (not Linux): such a holder is never checked
    pid_ns: int | None
    pid: int
    started: int | None  # clock ticks after boot; None when /proc does not say

    def describe(self) -> str:
        boot = self.boot_id[:8] or "?"
        return f"pid {self.pid} (boot {boot}, pid namespace {self.pid_ns}, start {self.started})"


def boot_id() -> str:
    """The kernel's id of this boot ("" where there is none)."""
    try:
        with open(f"{PROC}/sys/kernel/random/boot_id", "rb") as file:  # no pathlib: per try
            return file.read().decode().strip()
    except OSError:
        return ""


def _pid_ns() -> int | None:
    try:
        return os.stat(f"{PROC}/self/ns/pid").st_ino
    except OSError:
        return None


def stat_of(pid: int) -> tuple[str, list[str]] | None:
    """(command name, the fields after it: [0] the state, [1] the parent pid, [4] the
    controlling terminal, [19] the start time) of /proc/<pid>/stat, or None. The name may hold
    spaces and ')': the fields start after the last one."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as file:  # no pathlib: per claim try
            text = file.read().decode("utf-8", "replace")
    except OSError:
        return None
    if ")" not in text:
        return None
    return text[text.find("(") + 1 : text.rfind(")")], text[text.rfind(")") + 2 :].split()


def is_zombie(pid: int) -> bool:
    """A process that has ended but was not yet waited for (state Z, or X while it goes): it
    keeps its pid and start time in /proc, and runs nothing."""
    found = stat_of(pid)
    return found is not None and found[1][:1] in (["Z"], ["X"])


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: clock ticks after boot."""
    found = stat_of(pid)
    try:
        return int(found[1][19]) if found is not None else None
    except (IndexError, ValueError):
        return None


def identify(pid: int | None = None) -> Identity:
    """The identity of process `pid` (default: this process) as seen from this process."""
    pid = os.getpid() if pid is None else pid
    return Identity(boot_id=boot_id(), pid_ns=_pid_ns(), pid=pid, started=start_time(pid))


def same_machine(holder: Identity, me: Identity) -> bool:
    """Whether `me` can see `holder`'s process table: the same boot and pid namespace."""
    return bool(holder.boot_id) and (holder.boot_id, holder.pid_ns) == (me.boot_id, me.pid_ns)


def is_gone(holder: Identity, me: Identity) -> bool:
    """True only when `holder` provably no longer runs: on this machine (same boot, same pid
    namespace), its pid is free or belongs to a process started at another time."""
    if not same_machine(holder, me) or holder.pid <= 0:
        return False
    if not _pid_exists(holder.pid):
        return True
    started = start_time(holder.pid)
    if started is not None and started == holder.started and is_zombie(holder.pid):
        return True  # killed, not yet reaped by its parent: it holds nothing any more
    if started is None:
        # Unreadable (/proc mounted with hidepid) or it ended just now: a live holder must
        # never be judged dead, so only a pid that is free by now counts.
        return not _pid_exists(holder.pid)
    return holder.started is not None and started != holder.started


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
