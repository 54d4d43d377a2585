"""The dispatcher's memory of cron's virtual minute (issue 33).

Debian's cron remembers the last minute it ran jobs for (its "virtual" minute) and compares the
clock with it at each wake-up (ops/schedule/firing.py): a clock stepped back by hand or NTP does
not re-run the fixed-time jobs of the repeated wall times, one stepped forward (or a late
wake-up) starts the skipped minutes' jobs. A stateless dispatcher cannot tell those from a plain
minute, so `run_due_jobs` keeps the daemon's virtual minute in a small file,
`OPS_LOCK_DIR/run_due_jobs.state` (0600, in the lock directory, 0700: the per-job locks' place,
kept across deploys and reboots like them), and replays the model from it at each wake-up.

So that it starts nothing a per-job line would not:

- no usable state (none yet, unreadable, another boot, another TIME_ZONE, another cron daemon:
  a restarted cron starts with no memory; another project's, in a shared OPS_LOCK_DIR): the
  minute alone, as a first run (firing.replay: the DST offsets of the last 3 h), and a fresh
  state from there;
- the same minute again (a second dispatcher line, a slow start overtaken by the next minute's
  dispatcher, cron's late wake-up starting the line once per missed minute): nothing;
- a gap the real time also took (monotonic clock: the dispatcher was not run, cron stopped, a
  broken deploy), beyond cron's own 5-minute catch-up of a late wake-up: the minute alone, as a
  restarted cron would; a gap the clock took without real time (a step, DST, a suspend) is the
  model's.

One dispatcher at a time reads, decides and replaces the file (a flock on
`run_due_jobs.state.lock`, the clock read under it, an atomic rename); a problem with either is
one `cronops:` line and this minute dispatched from the clock alone, never a minute missed.
"""

import datetime as dt
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

from ..schedule.firing import Daemon, Expr, replay
from .lock import ensure_lock_dir, open_lock_file
from .process import boot_id, stat_of

UTC = dt.UTC
STATE_NAME = "run_due_jobs.state"  # job names have no dot: never a job's `<name>.lock`
LOCK_PATIENCE = 10.0  # seconds; the lock is held for a read, a decision and a rename
LATE_WAKEUP = 5  # minutes: cron starts every job of a late wake-up's missed minutes up to this
MAX_BYTES = 4096
CRON_DAEMONS = ("cron", "crond")  # as ops/run/origin.py (which imports the models)
MAX_ANCESTORS = 64


@dataclass(frozen=True)
class State:
    tz: str  # TIME_ZONE's key: the virtual minute is a wall clock of it
    boot: str  # the kernel's boot id: the monotonic clock's epoch
    virtual: dt.datetime  # cron's virtual minute, naive wall clock
    reading: dt.datetime  # the clock's minute at the dispatch that wrote this (UTC)
    monotonic: float  # the monotonic clock then (seconds)
    cron: str = ""  # the cron daemon that woke it (pid:start), "" when not known
    project: str = ""  # whose crontab.d: an OPS_LOCK_DIR shared by two projects shares no state

    def dumps(self) -> bytes:
        return json.dumps(
            {
                "tz": self.tz,
                "boot": self.boot,
                "virtual": self.virtual.isoformat(timespec="minutes"),
                "reading": self.reading.isoformat(timespec="minutes"),
                "monotonic": self.monotonic,
                "cron": self.cron,
                "project": self.project,
            }
        ).encode()

    @classmethod
    def loads(cls, data: bytes) -> "State":
        """ValueError when `data` is not a state this module wrote."""
        try:
            raw = json.loads(data)
            state = cls(
                tz=str(raw["tz"]),
                boot=str(raw["boot"]),
                virtual=dt.datetime.fromisoformat(raw["virtual"]),
                reading=dt.datetime.fromisoformat(raw["reading"]),
                monotonic=float(raw["monotonic"]),
                cron=str(raw.get("cron", "")),
                project=str(raw.get("project", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a state file ({exc.__class__.__name__})") from None
        if state.virtual.tzinfo is not None or state.reading.utcoffset() != dt.timedelta(0):
            raise ValueError("not a state file (its clocks)")
        return state


def decide(
    jobs: dict[str, Expr],
    now: dt.datetime,
    tz: ZoneInfo,
    state: State | None,
    *,
    boot: str,
    monotonic: float,
    cron: str = "",
    project: str = "",
) -> tuple[list[str], State | None]:
    """The jobs cron starts at this wake-up (`now`, aware), and the state to keep (None: keep
    the one there). `cron`: the daemon that woke this dispatcher ("": run by hand, or not
    known: then the state's daemon is kept)."""
    reading = now.astimezone(UTC).replace(second=0, microsecond=0)
    usable = (
        state is not None
        and state.tz == tz.key
        and state.boot == boot
        and monotonic >= state.monotonic
        and not (cron and state.cron and cron != state.cron)
        and state.project == project
    )
    if state is not None and usable:
        if reading == state.reading:
            return [], None  # this minute was dispatched already
        wall = reading.astimezone(tz).replace(tzinfo=None)
        diff = round((wall - state.virtual).total_seconds() / 60)
        # A gap real time took too: cron would have woken in it (a restarted cron has no
        # memory), so the dispatcher was not run; only a jump of the clock is cron's to replay.
        not_run = diff > LATE_WAKEUP and monotonic - state.monotonic >= (diff - 2) * 60
        if not not_run:
            daemon = Daemon(jobs)
            daemon.virtual = state.virtual
            due = daemon.wake(wall)
            assert daemon.virtual is not None
            kept = cron or state.cron
            return due, State(tz.key, boot, daemon.virtual, reading, monotonic, kept, project)
    due, virtual = replay(jobs, reading, tz)
    return due, State(tz.key, boot, virtual, reading, monotonic, cron, project)


class VirtualMinute:
    """The state file at `path`, for one dispatch; `say` takes a problem's one line."""

    def __init__(
        self,
        path: Path,
        say: Callable[[str], None],
        *,
        boot: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        cron: str | None = None,
        project: str = "",
    ):
        self.path = path
        self.say = say
        self.boot = boot if boot is not None else boot_id()
        self.monotonic = monotonic
        self.cron = cron if cron is not None else cron_daemon()
        self.project = project
        self._said = False  # one line a dispatch: a file it could not read, not its write too

    def due(self, jobs: dict[str, Expr], tz: ZoneInfo, now: dt.datetime | None) -> list[str]:
        """The jobs to start at this wake-up (the clock read under the lock when `now` is
        None), the state replaced for the next one."""
        self._said = False
        try:
            lock = self._lock()
        except OSError as exc:
            self._fall_back(str(exc))
            return replay(jobs, now or dt.datetime.now(UTC), tz)[0]
        try:
            now = now or dt.datetime.now(UTC)
            state = self._read()
            due, new = decide(
                jobs,
                now,
                tz,
                state,
                boot=self.boot,
                monotonic=self.monotonic(),
                cron=self.cron,
                project=self.project,
            )
            if new is not None:
                self._write(new)
            return due
        finally:
            os.close(lock)

    def _fall_back(self, problem: str) -> None:
        self._say(
            f"warning: the dispatcher's state {self.path}: {problem}; this minute's jobs are "
            "found from the clock alone (as on a first run)"
        )

    def _say(self, message: str) -> None:
        if not self._said:
            self._said = True
            self.say(message)

    def _lock(self) -> int:
        ensure_lock_dir(self.path.parent)
        fd = open_lock_file(self.path.with_name(self.path.name + ".lock"))
        deadline = time.monotonic() + LOCK_PATIENCE
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise OSError(f"still locked after {LOCK_PATIENCE:g} s") from None
                time.sleep(0.05)

    def _read(self) -> State | None:
        """The state there, or None (said, unless there is none yet)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._fall_back(exc.strerror or str(exc))
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                problem = "not a regular file"
            elif info.st_uid != os.geteuid():
                problem = f"owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
            else:
                return State.loads(os.read(fd, MAX_BYTES))
        except (OSError, ValueError) as exc:
            problem = str(exc)
        finally:
            os.close(fd)
        self._fall_back(problem)
        return None

    def _write(self, state: State) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, state.dumps())
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            self._say(
                f"warning: the dispatcher's state {self.path} cannot be written: "
                f"{exc.strerror or exc}; the next minute is found from the clock alone"
            )


def cron_daemon(pid: int | None = None) -> str:
    """`pid:start` (start: clock ticks after boot) of the cron daemon among the ancestors of
    `pid` (default: this process's parent), "" when there is none: the farthest of the
    processes named `cron`/`crond` in a row (the daemon, then the child it forks per job)."""
    found = ""
    pid = os.getppid() if pid is None else pid
    for _ in range(MAX_ANCESTORS):
        fields = _stat(pid) if pid > 1 else None
        if fields is None:
            break
        comm, parent, start = fields
        if comm in CRON_DAEMONS:
            found = f"{pid}:{start}"
        elif found:
            break
        pid = parent
    return found


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(comm, parent pid, start time) of `pid`, or None."""
    found = stat_of(pid)
    try:
        return (found[0], int(found[1][1]), found[1][19]) if found else None
    except (IndexError, ValueError):
        return None
