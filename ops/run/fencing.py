"""Fencing: what a running job knows of its claim, and the locks between a holder and a
takeover.

A running job asks `current_claim()` (in run_job's forked child; the processes it starts find
the same in OPS_JOB, OPS_SLOT, OPS_CLAIM_VERSION and OPS_RUN_ID) and `HeldClaim.still_held()`
(ops/run/held.py) whether it still holds its claim. The claim's own transactions
(ops/run/claims.py) serialise per job (`lock_job`) and take a claim over only after the
holder's lock (`lock_holder`), which a fencing transaction holds shared.
"""

import hashlib
import os
from typing import TYPE_CHECKING

from django.db import connection

from ..models import JobRun
from . import process

if TYPE_CHECKING:
    from .held import HeldClaim


def advisory_lock(key: str, *, shared: bool = False, wait: bool = True) -> bool:
    """A transaction-scoped PostgreSQL advisory lock on `key` (SQLite: nothing to take; its
    IMMEDIATE transactions hold the one write lock from BEGIN, config/settings.py). Without
    `wait`: False, at once, when another transaction holds it."""
    if connection.vendor != "postgresql":
        return True
    digest = hashlib.sha256(key.encode()).digest()
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    if shared:
        function += "_shared"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s)", [int.from_bytes(digest[:8], "big", signed=True)])
        (taken,) = cursor.fetchone()
    return taken is not False  # the waiting kind returns void (None)


def lock_job(job: str) -> None:
    """Serialise claims of one job (inside the claim's transaction): a claim and its look for
    the same slot under other keys are then one step, so of two runs of one instant under two
    keys the second always sees the first. One lock per job: other jobs never wait."""
    advisory_lock(f"cronops claim {job}")


def lock_holder(job: str, slot_key: str, *, shared: bool = False, wait: bool = True) -> bool:
    """The holder of one running claim: a fencing transaction of the holder's job
    (`still_held(lock=True)`) takes it shared, a takeover of that claim exclusively and without
    waiting (ops/run/claims.py waits outside its transaction, which holds `lock_job`), so the
    takeover comes after the fencing commit. A heartbeat takes it shared too (claims.heartbeat),
    so that a takeover waits for a beat the database holds up. The claims of other slots or of
    a claim that is plainly busy never take it."""
    return advisory_lock(f"cronops holder {job} {slot_key}", shared=shared, wait=wait)


ENV_JOB, ENV_SLOT, ENV_VERSION, ENV_RUN = "OPS_JOB", "OPS_SLOT", "OPS_CLAIM_VERSION", "OPS_RUN_ID"
_ENV_NAMES = (ENV_JOB, ENV_SLOT, ENV_VERSION, ENV_RUN)


# A claim's job, slot key, version (its fencing token) and run id: what run_job hands its job.
Fields = tuple[str, str, int, int]

_entered: Fields | None = None  # the job's own process: the claim run_job started it under
_current: "HeldClaim | None" = None


def current_claim() -> "HeldClaim | None":
    """The claim of the run_job run this code runs in, or None (not under run_job, or a run
    without a slot). A child process reads it from the environment run_job set."""
    global _current
    if _current is None and _entered is not None:
        from .held import HeldClaim

        _current = HeldClaim(*_entered)
    if _current is not None:
        return _current
    values = [os.environ.get(name, "") for name in _ENV_NAMES]
    if not all(values):
        return None
    from .held import HeldClaim

    job, slot, version, run_id = values
    try:
        return HeldClaim(job=job, slot=slot, version=int(version), run_id=int(run_id))
    except ValueError:
        return None


def held_fields(run: JobRun) -> Fields | None:
    """The fields of the claim `run` holds (None for a run without a slot)."""
    version = getattr(run, "claim_version", None)
    if run.slot and version is not None and run.pk is not None:
        return (run.job, run.slot, version, run.pk)
    return None


def held_claim(run: JobRun) -> "HeldClaim | None":
    """The claim `run` holds, as its job sees it (None for a run without a slot)."""
    fields = held_fields(run)
    if fields is None:
        return None
    from .held import HeldClaim

    return HeldClaim(*fields)


ENV_HOLDER = "OPS_HOLDER"


def holder_mark(pid: int, started: int | None) -> str:
    """OPS_HOLDER's value: the run_job process (pid and start time) a job's process belongs to.
    With it, the survivor scan tells this machine's projects apart: two projects' databases
    both have a run #1 of a job `backup` for today."""
    return f"{pid}:{started}"


def environment(held: Fields | None, holder: process.Identity) -> dict[str, str | None]:
    """The OPS_* variables the job's process gets (None: removed, so that the variables of a
    run_job this one runs under do not leak into a run without a slot)."""
    values = dict(zip(_ENV_NAMES, _env_values(held), strict=True))
    values[ENV_HOLDER] = holder_mark(holder.pid, holder.started) if held else None
    return values


def enter(held: "Fields | HeldClaim | None") -> None:
    """In the job's own process (ops/run/child.py): the claim current_claim() answers (from
    run_job, its fields: made at the first question)."""
    global _entered, _current
    if isinstance(held, tuple):
        _entered, _current = held, None
    else:
        _entered, _current = None, held


def _env_values(held: Fields | None) -> list[str | None]:
    if held is None:
        return [None] * len(_ENV_NAMES)
    return [str(value) for value in held]
