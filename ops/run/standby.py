"""Standby: the same crontab on every server; one runs the slot, the others wait for it.

A run that finds its slot claimed by a live run (on another server, usually) does not exit 75
at once when it stands by (`--standby`, or OPS_STANDBY=on): it reads the claim again every
`poll_interval()` seconds, holding its own host's lock, until one of these:

- the holder succeeded: nothing to do (exit 0, "done on <host>");
- the holder failed or timed out: the job itself failed, and would fail the same way here, on
  every standby, each with its own alert; the holder's own ping already alerted, so the standby
  does not retry (exit 0, its /log names the holder's outcome);
- the holder was terminated (SIGTERM, SIGINT: its server shutting down, say), or its claim is
  free for another reason: the standby claims the slot and runs it;
- the holder is gone (its heartbeat older than 3 intervals, or, on this machine, its process
  ended): the standby takes the claim over (version + 1, the dead attempt recorded abandoned)
  and runs the slot;
- the bound passed: exit 75, as a run that does not stand by.

Each read is one indexed SELECT; the poll interval is the heartbeat interval, at most
POLL_MAX seconds, so a takeover comes at most 3 heartbeats + POLL_MAX after the holder's last
heartbeat.
"""

import datetime as dt
import time
from collections.abc import Callable

from ..models import Outcome, SlotClaim
from ..schedule.durations import human_duration
from ..schedule.options import RunOptions
from ..schedule.slots import Slot
from ..values import Value
from . import claims, process
from .plan import UsageError

POLL_MAX = 5.0  # seconds: takeover within 3 heartbeats + this
POLL_MIN = 0.2
# A holder that ended this way left the slot to be run: its server went away or was told to
# stop (a reboot, a deploy). A failure or a timeout is the job's own, and is not retried.
RUN_AGAIN = (Outcome.TERMINATED, Outcome.ABANDONED)

DONE, FAILED, TAKE, WAIT, GAVE_UP = "done", "failed", "take", "wait", "gave up"


class StandbySettingError(ValueError):
    pass


def setting() -> bool:
    """OPS_STANDBY (ops/conf.py): on (1, true, yes, on) or off (0, false, no, off, empty)."""
    from .. import conf

    try:
        return conf.standby()
    except conf.SettingError as exc:
        raise StandbySettingError(str(exc)) from None


def bound(options: RunOptions, *, heartbeat: float, default_grace: float) -> float | None:
    """How long this run stands by, in seconds; None when it does not.

    `--standby=DURATION` is that; `--standby` (or OPS_STANDBY) is as long as the holder may
    legitimately run (the job's --timeout, else OPS_DEFAULT_GRACE) plus the 3 heartbeats it
    takes to see it gone."""
    value = options.standby
    if value is None:
        value = setting()
    if value is False:
        return None
    if value is True:
        return (options.timeout or default_grace) + claims.STALE_HEARTBEATS * heartbeat
    return float(value)


def poll_interval(heartbeat: float) -> float:
    return min(POLL_MAX, max(POLL_MIN, heartbeat))


def judge(
    row: SlotClaim | None, *, now: dt.datetime, stale_after: float, me: process.Identity | None
) -> str:
    """What a standby does about the claim `row` as it stands now."""
    if row is None:
        return TAKE  # no claim (pruned by hand?): claim it
    if row.state == Outcome.SUCCEEDED:
        return DONE
    if row.state == Outcome.RUNNING:
        return WAIT if claims.holder_alive(row, now, stale_after, me) else TAKE
    if row.state in RUN_AGAIN:
        return TAKE
    return FAILED


class Waited(Value):
    verdict: str  # DONE, FAILED, TAKE or GAVE_UP
    claim: SlotClaim | None
    seconds: float


def wait(
    job: str,
    slot: Slot,
    *,
    deadline: float,
    heartbeat: float,
    sleep: Callable[[float], None],
    clock: Callable[[], dt.datetime],
) -> Waited:
    """Watch the claim of `slot` until it is done, failed, free to take, or `deadline` (a
    time.monotonic() value) passes. `sleep` is the runner's: a signal ends it at once."""
    me = process.identify()
    interval = poll_interval(heartbeat)
    stale_after = claims.STALE_HEARTBEATS * heartbeat
    started = time.monotonic()
    while True:
        row = claims.peek_slot(job, slot)
        verdict = judge(row, now=clock(), stale_after=stale_after, me=me)
        if verdict != WAIT:
            return Waited(verdict, row, time.monotonic() - started)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Waited(GAVE_UP, row, time.monotonic() - started)
        sleep(min(interval, remaining))


def waited(seconds: float) -> str:
    return human_duration(seconds) if seconds >= 1 else "less than a second"


def run_bound(options: RunOptions, heartbeat: float) -> float | None:
    """How long a run stands by; UsageError for a bad OPS_STANDBY."""
    try:
        on = options.standby if options.standby is not None else setting()
    except StandbySettingError as exc:
        raise UsageError(str(exc)) from None
    if on is True and not options.timeout:
        from ..monitors.grace import default_grace

        grace = default_grace()
    else:
        grace = 0.0
    return bound(options, heartbeat=heartbeat, default_grace=grace)
