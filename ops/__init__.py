"""cronops: the reusable Django app (`"ops"` in INSTALLED_APPS).

Imported while Django loads its apps: nothing here may import a model at module level.
"""

from collections.abc import Mapping


def once(key: str, slot: Mapping[str, object] | None = None) -> bool:
    """Inside a job run by run_job, in the transaction that does an effect: True when this run
    is the first to do `key` for its slot, False when a run of the same slot committed it
    already (docs/run_job.md, "Exactly once: ops.once"). In a Django task run_job enqueued,
    `slot=cronops_slot` (docs/tasks.md). See ops/run/once.py."""
    from .run.once import once as mark

    return mark(key, slot)


__all__ = ["once"]
