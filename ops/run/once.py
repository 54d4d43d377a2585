"""`ops.once(key)`: an effect done once per slot, however often the slot is run.

The claim stops two runs of a slot at the same time, and fencing (`still_held`) stops a late
write of a run that lost its claim. Neither can tell a run that redoes the slot (a standby after
a takeover, `--force`, a run by hand, catch-up) what an earlier run already committed: only the
database can, by a unique row written in the same transaction as the effect. `once(key)` writes
that row, (job, slot, key), first: the first run to commit it does the effect; every other run
gets False, whichever way it came to run the slot.

A Django task that run_job enqueued (`--enqueue`) runs later in a worker, outside any run: it
passes the claim it was enqueued under, `once(key, slot=cronops_slot)`, so that two enqueues of
one slot (a backend outside the claims' database, docs/tasks.md) still do the effect once.
"""

from collections.abc import Mapping

from django.db import IntegrityError, connections, router, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from ..models import Effect
from .fencing import current_claim
from .held import HeldClaim

KEY_MAX = 200  # Effect.key's max_length


class OutsideRun(RuntimeError):
    """once() was called where there is no slot claim to mark the effect for."""


def once(key: str, slot: Mapping | None = None) -> bool:
    """Mark the effect `key` done for this run's slot, inside the caller's transaction; True
    when this run is the first to do it (go on with the effect), False when a run of the same
    job and slot already committed it (skip it). The caller's transaction stays usable either
    way (the INSERT is inside a savepoint). `slot`: the claim an enqueued task was given
    (`cronops_slot`), instead of the run this process is in."""
    if not isinstance(key, str) or not key or len(key) > KEY_MAX:
        raise ValueError(f"once(key): a non-empty string of at most {KEY_MAX} characters")
    claim = current_claim() if slot is None else given_claim(key, slot)
    if claim is None:
        raise OutsideRun(
            f"ops.once({key!r}) needs the slot claim of a run_job run, and this process has "
            "none (not started by run_job, or by a run without a slot): run the command as its "
            "crontab.d job (`manage.py run_job <job>`), or give an undeclared command a slot "
            "(`manage.py run_job --logical-date=YYYY-MM-DD <command>`)"
        )
    alias = router.db_for_write(Effect)
    if connections[alias].get_autocommit():
        raise TransactionManagementError(
            f"ops.once({key!r}) outside transaction.atomic() would mark the effect done apart "
            "from the effect itself: call it first inside the transaction that does the effect"
        )
    effects = Effect.objects.using(alias)
    try:
        with transaction.atomic(using=alias):  # a savepoint
            effects.create(
                job=claim.job,
                slot=claim.slot,
                key=key,
                run_id=claim.run_id,
                version=claim.version,
                created_at=timezone.now(),
            )
    except IntegrityError:
        # Only the mark itself means "done": another clash (a primary-key sequence behind its
        # table after a restore) would otherwise skip a new effect for good.
        if effects.filter(job=claim.job, slot=claim.slot, key=key).exists():
            return False
        raise
    return True


def given_claim(key: str, slot: Mapping) -> HeldClaim:
    """The claim a task got as `cronops_slot` ({"job", "slot", "run_id", "version"}); ValueError
    for anything else (a hand-made dict would mark effects for a slot no run holds)."""
    try:
        claim = HeldClaim(
            job=slot["job"], slot=slot["slot"], version=slot["version"], run_id=slot["run_id"]
        )
    except (KeyError, TypeError):
        claim = None
    if (
        claim is None
        or not all(isinstance(v, str) and v for v in (claim.job, claim.slot))
        or not all(type(v) is int and v > 0 for v in (claim.version, claim.run_id))
    ):
        raise ValueError(
            f"ops.once({key!r}, slot=...): slot is the cronops_slot argument run_job gives an "
            'enqueued task ({"job", "slot", "run_id", "version"}), and this is not one'
        )
    return claim
