"""cronops: the reusable Django app (`"ops"` in INSTALLED_APPS).

Imported while Django loads its apps: nothing here may import a model at module level.
"""


def once(key: str) -> bool:
    """Inside a job run by run_job, in the transaction that does an effect: True when this run
    is the first to do `key` for its slot, False when a run of the same slot committed it
    already (docs/run_job.md, "Exactly once: ops.once"). See ops/run/once.py."""
    from .run.once import once as mark

    return mark(key)


__all__ = ["once"]
