"""The job's child processes: ended with the command, and found after the runner died.

A job that shells out (pg_dump, rsync, `sh -c …`) starts processes that outlive an interrupted
command unless someone ends them. Two halves keep a slot from running twice meanwhile:

- run_job makes itself a child subreaper (Linux `prctl(PR_SET_CHILD_SUBREAPER)`), so an orphaned
  grandchild reparents to run_job instead of init, and `end_descendants()` finds every process
  below run_job (the `children` files of /proc, else the parent pid of every process in /proc),
  SIGTERMs them, waits up to GRACE_SECONDS, SIGKILLs what remains and reaps the zombies that
  are run_job's own. It runs after every end of the command, before the outcome is recorded and
  the claim released (as systemd's KillMode=control-group does): a process left behind by a
  failed run would otherwise overlap the next run of the slot. Only descendants started while
  the command ran are touched: processes that were already run_job's children before (an
  in-process caller's) are never signalled, and each target is re-checked to be a descendant
  through a pidfd before the signal, so a reused pid is never hit.
- the job's process (run_job's forked child) has OPS_RUN_ID in its environment, which every
  process it starts inherits. When a claim's runner on this machine is dead, `survivor(run_id)`
  scans /proc/*/environ (the processes this user may read, in this pid namespace) for that run
  id: while one lives, the holder is not provably gone. (The job's own process is not found so:
  its /proc environ is what run_job started with. It dies with run_job instead,
  `die_with_parent`.)
"""

import contextlib
import functools
import os
import signal
import sys
import time
from pathlib import Path

from ..values import Value

PROC = Path("/proc")
GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL of the job's leftover processes
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_POLL = 0.05


class Proc(Value, frozen=True):
    pid: int
    comm: str

    def describe(self) -> str:
        return f"pid {self.pid}, {self.comm}"


@functools.cache
def libc_prctl():
    """libc's prctl(), called with ints (and a pointer to one); None where there is none.

    Through _ctypes, what the ctypes package is made of: importing the package (its dozens of
    types, the callback it makes at import) costs every run_job ~4.4 M instructions, ~0.6 % of
    its start-up (bench/RESULTS.md, P9), for this one function. Its function type is
    ctypes.CDLL(None, use_errno=True)'s, returning a C int."""
    if not sys.platform.startswith("linux"):
        return None
    import _ctypes

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = _c_int()

    class Library:  # what a function pointer is looked up in (a CDLL): its dlopen handle
        _handle = 0

    try:
        Library._handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)  # type: ignore[arg-type]
        return Function(("prctl", Library()))  # type: ignore[arg-type]
    except (OSError, AttributeError):
        return None


@functools.cache
def _c_int() -> type:
    """ctypes.c_int, without the ctypes package."""
    import _ctypes

    class CInt(_ctypes._SimpleCData):
        _type_ = "i"

    return CInt


def die_with_parent() -> bool:
    """Have the kernel SIGKILL this process when its parent (the thread that forked it) dies;
    False where it cannot (not Linux)."""
    prctl = libc_prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def set_subreaper(on: bool = True) -> bool | None:
    """Make this process a child subreaper (or stop being one); returns the previous state,
    None where the kernel has no such thing (then orphans go to init, and only the processes
    still below run_job are ended)."""
    prctl = libc_prctl()
    if prctl is None:
        return None
    import _ctypes

    previous = _c_int()(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, _ctypes.byref(previous), 0, 0, 0) != 0:
        return None
    if prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        return None
    return bool(previous.value)


def _stat(pid: int) -> tuple[int, str, str, int] | None:
    """(ppid, state, comm, start time) of `pid`, or None when it is gone or unreadable."""
    try:
        raw = _read(f"{PROC}/{pid}/stat")
    except OSError:
        return None
    try:
        left, right = raw.index(b"("), raw.rindex(b")")
        fields = raw[right + 2 :].split()
        comm = raw[left + 1 : right].decode(errors="replace")
        return int(fields[1]), fields[0].decode(), comm, int(fields[19])
    except (ValueError, IndexError):
        return None


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return []


def _read(path: str) -> bytes:
    """A /proc file's bytes (paths as strings: run_job reads a few dozen of them a run, and
    pathlib's joins cost more than the reads)."""
    with open(path, "rb") as file:
        return file.read()


def _children_files(pid: int) -> list[int] | None:
    """The children of `pid` from /proc/<pid>/task/*/children; None when the kernel has no
    such file (CONFIG_PROC_CHILDREN)."""
    tasks_dir = f"{PROC}/{pid}/task"
    try:
        tasks = os.listdir(tasks_dir)
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            text = _read(f"{tasks_dir}/{task}/children")
        except FileNotFoundError:
            if not os.path.exists(f"{tasks_dir}/{task}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
        found.extend(int(word) for word in text.split())
    return found


def children_of(pid: int) -> list[int]:
    listed = _children_files(pid)
    if listed is not None:
        return listed
    result = []
    for candidate in _pids():
        stat = _stat(candidate)
        if stat is not None and stat[0] == pid:
            result.append(candidate)
    return result


def descendants(root: int | None = None, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Every process below `root` (default: this one), minus the subtrees of `exclude`."""
    root = os.getpid() if root is None else root
    seen: list[int] = []
    todo = [root]
    while todo:
        for child in children_of(todo.pop()):
            if child in exclude or child in seen or child == root:
                continue
            seen.append(child)
            todo.append(child)
    return seen


def _is_descendant(pid: int, root: int, exclude: frozenset[int]) -> bool:
    for _ in range(4096):  # a parent chain is finite; this only bounds a /proc gone strange
        stat = _stat(pid)
        if stat is None:
            return False
        parent = stat[0]
        if parent == root:
            return pid not in exclude
        if parent <= 1 or pid in exclude:
            return False
        pid = parent
    return False


def _signal(pid: int, sig: int, root: int, exclude: frozenset[int]) -> bool:
    """Send `sig` to `pid` only if it is (still) below `root`: through a pidfd, so that a pid
    freed and reused between the check and the signal is never hit."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        if not _is_descendant(pid, root, exclude):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)
            return True
        return False
    finally:
        if fd is not None:
            os.close(fd)


def signal_descendants(sig: int, exclude: frozenset[int] = frozenset()) -> None:
    """`sig` to every live process below this one outside `exclude`'s subtrees (each checked
    through a pidfd, as end_descendants does)."""
    root = os.getpid()
    for pid in descendants(root, exclude):
        _signal(pid, sig, root, exclude)


def _reap(root: int) -> None:
    """Reap the zombies that are this process's own children (orphans that reparented here, or
    the command's direct children), one pid at a time: never another owner's child."""
    if root != os.getpid():
        return
    for pid in children_of(root):
        stat = _stat(pid)
        if stat is not None and stat[1] == "Z":
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _alive(root: int, exclude: frozenset[int]) -> list[int]:
    # Look first, reap after: one that dies in between is then either still counted (and
    # looked at again) or already a zombie the reap takes, never a zombie left behind.
    alive = [pid for pid in descendants(root, exclude) if (_stat(pid) or (0, "Z"))[1] != "Z"]
    _reap(root)
    return alive


def end_descendants(
    exclude: frozenset[int] = frozenset(), grace: float = GRACE_SECONDS, root: int | None = None
) -> list[Proc]:
    """SIGTERM every live descendant of `root` (default: this process) outside `exclude`'s
    subtrees, SIGKILL those still alive after `grace` seconds, reap our zombies. Returns the
    processes that were found (for one line in the log)."""
    root = os.getpid() if root is None else root
    ended: dict[int, Proc] = {}
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    termed: set[int] = set()
    while True:
        alive = _alive(root, exclude)
        if not alive:
            break
        for pid in alive:
            if pid not in ended:
                stat = _stat(pid)
                ended[pid] = Proc(pid, stat[2] if stat else "?")
            if sig == signal.SIGKILL or pid not in termed:
                _signal(pid, sig, root, exclude)
                termed.add(pid)
        if sig == signal.SIGTERM and time.monotonic() >= deadline:
            sig = signal.SIGKILL
            continue
        if sig == signal.SIGKILL and time.monotonic() >= deadline + grace:
            break  # unkillable (uninterruptible sleep): leave it, say what was found
        time.sleep(_POLL)
    return sorted(ended.values(), key=lambda p: p.pid)


def survivor(
    run_id: int, job: str = "", *, holder: str = "", skip: int | None = None
) -> Proc | None:
    """A live process of this pid namespace whose environment carries OPS_RUN_ID=`run_id`,
    OPS_JOB=`job` and OPS_HOLDER=`holder` (the run_job process: two projects on one machine
    number their runs each from 1), a child of that run, or None. Processes that vanish or
    cannot be read are skipped."""
    needle = f"OPS_RUN_ID={run_id}".encode()
    marks = [f"OPS_JOB={job}".encode()] if job else []
    marks += [f"OPS_HOLDER={holder}".encode()] if holder else []
    me = os.getpid() if skip is None else skip
    for pid in sorted(_pids()):
        if pid == me:
            continue
        try:
            environ = (PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue  # another user's, or gone
        if needle not in environ:
            continue
        words = environ.split(b"\0")
        if needle not in words or any(mark not in words for mark in marks):
            continue
        stat = _stat(pid)
        if stat is None or stat[1] in ("Z", "X"):
            continue
        return Proc(pid, stat[2])
    return None


def end_leftovers(job: str, before: frozenset[int], kill_after: float, stderr) -> None:
    """End the processes job `job`'s command left behind, after any end of it (run_job's),
    saying which in one line; `before`: run_job's children that are not the job's. A signal
    meanwhile is only noted, and acted on afterwards."""
    from .plan import say  # plan imports claims, which imports this module

    try:
        ended = end_descendants(exclude=before, grace=min(GRACE_SECONDS, kill_after))
    except Exception as exc:  # never lose the outcome over it
        say(f"job {job}: could not end its child processes: {exc}", stderr)
        return
    if ended:
        shown = ", ".join(f"{p.comm} ({p.pid})" for p in ended[:5])
        more = f" and {len(ended) - 5} more" if len(ended) > 5 else ""
        what = "process" if len(ended) == 1 else "processes"
        say(f"job {job}: ended {len(ended)} leftover {what} of the command: {shown}{more}", stderr)
