"""HeldClaim: the claim a running job was started under (`ops.claims.current_claim()`).

In a module of its own, imported only where a claim is asked for (the job's own process, a
task, `ops.once`): run_job's process hands its job the claim's fields (ops/run/fencing.py), and
defining a frozen dataclass costs a fire ~3 M instructions (bench/RESULTS.md, P9 issue 33).
"""

from dataclasses import dataclass

from django.db import connection
from django.db.transaction import TransactionManagementError

from ..models import Outcome, SlotClaim
from .fencing import lock_holder


@dataclass(frozen=True)  # public (docs/several-servers.md): stays a dataclass for users' code
class HeldClaim:
    """The claim the running job was started under: its slot and its fencing token."""

    job: str
    slot: str  # the slot's key, "2026-11-29" or "2026-10-25 02:30+02:00"
    version: int  # 1 for the first claim of the slot, +1 for every takeover
    run_id: int  # the run's row in the history (JobRun)

    def still_held(self, *, lock: bool = False) -> bool:
        """Whether this run still holds its claim (no other run took the slot over).

        With `lock=True`, inside `transaction.atomic()`, a takeover of this claim waits until
        the transaction ends (a shared advisory lock on PostgreSQL, which a takeover takes
        exclusively), so what the transaction writes is written by the holder. The claim's row
        is not locked and other claims of the job do not wait: the holder's heartbeats go on
        meanwhile, a long transaction does not make it look dead, and a second run of the slot
        is still told `busy` at once. (SQLite has one writer at a time anyway.) This guards
        late writes of a holder that lost its claim; work a new holder redoes needs
        `ops.once` (or a unique constraint of the job's own).

        Outside a transaction (autocommit) the lock would end with its own statement:
        TransactionManagementError. PostgreSQL's REPEATABLE READ or SERIALIZABLE would read the
        claim from a snapshot taken before the lock (a takeover committed meanwhile goes
        unseen): refused too, the check needs READ COMMITTED (Django's default)."""
        if lock and connection.get_autocommit():
            raise TransactionManagementError(
                "still_held(lock=True) outside transaction.atomic() holds nothing"
            )
        rows = SlotClaim.objects.filter(
            job=self.job,
            slot=self.slot,
            version=self.version,
            run_id=self.run_id,
            state=Outcome.RUNNING,
        )
        if lock:
            lock_holder(self.job, self.slot, shared=True)
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT current_setting('transaction_isolation')")
                    (level,) = cursor.fetchone()
                if level != "read committed":
                    raise TransactionManagementError(
                        f"still_held(lock=True) needs READ COMMITTED, not {level.upper()}: "
                        "its snapshot predates the lock, so a takeover would go unseen"
                    )
        return rows.exists()
