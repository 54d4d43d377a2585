"""run_job's own writes when another transaction holds a lock they need: short tries, retried
within a bound, signals checked between tries.

SQLite has one writer at a time: a job whose write transaction lasts 45 s holds every other
process's writes back as long (past the settings' busy timeout, 30 s, they fail with "database
is locked"). On PostgreSQL the claim step can meet a lock too: the job's claim lock, a claim row
that a frozen holder's record holds. A wait inside the database cannot be ended by a signal,
so run_job's parent process, which owns its connection, lets each try wait at most TRY seconds
for a lock (SQLite `PRAGMA busy_timeout`, PostgreSQL `SET LOCAL lock_timeout`), then pauses
with the runner's sleep (a SIGTERM ends the claim step's at once) and tries again, until
LOCK_WAIT has passed: `Locked`, whose message says what held it and how long.
"""

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connection

LOCK_WAIT = 300.0  # seconds run_job waits for another writer (docs/run_job.md, "SQLite")
TRY = 0.5  # seconds one statement may wait for a lock
PAUSE = 0.1  # seconds between two tries
SAY_AFTER = 5.0  # seconds of waiting before it is said: 20 jobs starting at once wait less
_LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's lock_timeout
_TAKE_WRITE_LOCK = "UPDATE ops_slotclaim SET id = id WHERE 0"  # writes nothing, locks

T = TypeVar("T")


class Locked(Exception):
    """Another transaction held a lock the write needed for the whole bound."""

    def __init__(self, reason: str, seconds: float):
        super().__init__(f"{reason} for {seconds:.0f} s")
        self.reason, self.seconds = reason, seconds


# What held the lock: said when a wait begins, and in the error past the bound.
WAITING = {
    "sqlite": "another writer holds the database",
    "postgresql": "another transaction holds a lock it needs",
}
LOCKED = {
    "sqlite": "database is locked by another writer",
    "postgresql": "a lock it needs was held by another transaction",
}


def held_by(exc: BaseException) -> str:
    """The vendor whose lock `exc` gave up on ("" for any other error)."""
    if connection.vendor == "sqlite" and "database is locked" in str(exc):
        return "sqlite"
    cause = exc.__cause__  # the driver's error: psycopg 3 says sqlstate, psycopg2 pgcode
    if _LOCK_NOT_AVAILABLE in (getattr(cause, "sqlstate", None), getattr(cause, "pgcode", None)):
        return "postgresql"
    return ""


_patient = threading.local()  # inside patiently(), on this thread


@contextlib.contextmanager
def short_lock_waits():
    """This thread's connection waits at most TRY seconds for a lock, until the block ends:
    SQLite's busy timeout is the connection's; on PostgreSQL each transaction of run_job's own
    says so itself (`in_transaction`), since a session setting would outlive the block on a
    pooled server connection (PgBouncer) and reach the application's transactions."""
    _patient.on = True
    try:
        if connection.vendor != "sqlite":
            yield
            return
        # On the driver's connection: three statements a write, Django's cursors cost more
        # than SQLite's work for them (no query of the database's, nothing to log).
        connection.ensure_connection()
        raw = connection.connection
        (before,) = raw.execute("PRAGMA busy_timeout").fetchone()
        raw.execute(f"PRAGMA busy_timeout = {int(TRY * 1000)}")
        try:
            yield
        finally:
            raw = connection.connection  # None when the block closed it: a new one waits as set
            if raw is not None:
                with contextlib.suppress(Exception):
                    raw.execute(f"PRAGMA busy_timeout = {int(before)}")
    finally:
        _patient.on = False


def in_transaction() -> None:
    """First thing in a write transaction of cronops' own (the claim's, the record's): inside
    patiently(), on PostgreSQL, its lock waits end after TRY seconds, for this transaction
    only (SET LOCAL), and patiently() tries it again.

    On SQLite it takes the write lock before anything is read, as BEGIN IMMEDIATE would: a
    transaction that has read fails at once with "database is locked" when it then meets
    another writer (SQLite will not wait there: it could deadlock), so 20 jobs of one minute
    went round patiently()'s pauses up to 12 times each; one that has not read waits for
    the lock (the busy timeout)."""
    if connection.vendor == "sqlite":
        from ..schema import ops_alias

        # Only where cronops' tables are: a project's router may keep them in another
        # database than the one this transaction is on (ops/schema.py), and this one has no
        # ops_slotclaim to lock ("no such table", read as "not migrated").
        if ops_alias() == connection.alias:
            with connection.cursor() as cursor:
                cursor.execute(_TAKE_WRITE_LOCK)
        return
    if getattr(_patient, "on", False) and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{int(TRY * 1000)}ms'")


def patiently(
    write: Callable[[], T],
    *,
    sleep: Callable[[float], object],
    bound: float | None = None,
    waiting: Callable[[str, float], None] | None = None,
) -> T:
    """`write()`, tried again while another transaction holds a lock it needs, for `bound`
    seconds (default LOCK_WAIT); `waiting(what holds it, the bound)` is told once, when the
    wait has lasted SAY_AFTER seconds. `write` runs whole each time: a transaction of its own,
    or a single statement."""
    bound = LOCK_WAIT if bound is None else bound
    started = time.monotonic()
    told = False
    with short_lock_waits():  # once, not once a try: a try costs a BEGIN and a ROLLBACK
        while True:
            try:
                return write()
            except DatabaseError as exc:
                vendor = held_by(exc)
                if not vendor:
                    raise
                while True:  # until the lock looks free: then the whole write again
                    waited = time.monotonic() - started
                    if waited >= bound:
                        raise Locked(LOCKED[vendor], waited) from exc
                    if waiting is not None and not told and waited >= SAY_AFTER:
                        told = True
                        waiting(WAITING[vendor], bound)
                    sleep(min(PAUSE, bound - waited))
                    if vendor != "sqlite" or _write_lock_free():
                        break


def _write_lock_free() -> bool:
    """Whether SQLite's write lock came free within a try (TRY seconds, the busy timeout): it
    is taken and given back at once (BEGIN IMMEDIATE, ROLLBACK). Under 20 jobs of one minute a
    write waits through many tries; each of them costs these two statements rather than the
    whole write (the claim's Python, a transaction begun and rolled back). False only while
    another writer holds it; any other answer lets the write run and say for itself."""
    from ..schema import ops_alias

    if connection.in_atomic_block or ops_alias() != connection.alias:
        return True  # not a lock this connection may take on its own (see in_transaction)
    try:
        connection.ensure_connection()
        raw = connection.connection  # the driver's own: a try is two statements, no more
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("ROLLBACK")
    except Exception as exc:  # the driver's own error: the write, run again, says it
        return "database is locked" not in str(exc)
    return True
