"""--enqueue: a task put on its task backend, once per slot; what the claim guards is the enqueue.

run_job claims the slot as for any job, then enqueues instead of forking: the task with its
line's keyword arguments, the slot's `logical_date` and, to a function that takes it, the claim
as `cronops_slot`. The run records the task result's id (JobRun.task_result_id).

- When the backend keeps its tasks in the claims' own database (django-tasks-db's
  DatabaseBackend, routed to the same alias), the enqueue is written inside the transaction that
  records the claim's success: both commit, or neither (a kill before the commit leaves the slot
  not done and nothing enqueued; the next run enqueues it). No lost and no double enqueue.
- With any other backend (Redis, a broker, an HTTP service) the enqueue goes out first and the
  record follows: a run killed between the two has enqueued the task while its slot is not done,
  and the slot's next run enqueues it again. Such a task makes itself idempotent with the claim
  it gets: `ops.once(key, slot=cronops_slot)` inside its transaction does an effect once per
  slot, whichever run enqueued it (docs/tasks.md).

`--wait-result=DURATION` then waits (bounded) for the task's result, so that the exit code and
the monitors say how the task ended, not only that it was enqueued.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, router, transaction

from ..models import JobRun, Outcome, SlotClaim
from . import tasks
from .plan import one_line
from .supervisor import EXIT_SKIPPED, EXIT_TIMEOUT, Ended

if TYPE_CHECKING:
    from ..schedule.slots import Slot
    from .runner import Runner

POLL = 1.0  # seconds between two looks at an enqueued task's result (--wait-result)
FINISHED = {"SUCCESSFUL": 0, "FAILED": 1}  # a finished task's status → run_job's exit code


class Pending:
    """An enqueue that is written with the record (the backend shares the claims' database)."""

    def __init__(self, task, kwargs: dict):
        self.task, self.kwargs = task, kwargs


def in_claims_database(task) -> bool:
    """Whether `task`'s backend writes its tasks in the database the claims are in."""
    backend = type(task.get_backend())
    if not any(cls.__module__.split(".")[0] == "django_tasks_db" for cls in backend.__mro__):
        return False  # a subclass of the project's own counts: it writes the same rows
    from django_tasks_db.models import DBTaskResult  # type: ignore[import-not-found,unused-ignore]

    return router.db_for_write(DBTaskResult) == router.db_for_write(SlotClaim)


def put(runner: Runner, run: JobRun, slot: Slot | None) -> Ended:
    """The enqueue step of a run (instead of forking the job): how it ended."""
    opts = runner.opts
    path = opts.command
    try:
        task, kwargs = tasks.check(
            path, opts.args, enqueue=True, wait_result=bool(opts.wait_result)
        )
    except tasks.TaskRefused as exc:
        return Ended(Outcome.FAILED, 1, str(exc), path)
    claim = None
    if run.slot:
        version = getattr(run, "claim_version", None)
        claim = {"job": run.job, "slot": run.slot, "run_id": run.pk, "version": version}
    day = slot.logical_date.isoformat() if slot is not None else None
    kwargs = tasks.call_kwargs(task, kwargs, day, claim)
    if in_claims_database(task):
        runner.pending_enqueue = Pending(task, kwargs)
        return Ended(Outcome.SUCCEEDED, 0, f"enqueued {path}", path)
    result, ended = bounded(runner, lambda: task.enqueue(**kwargs), path)
    if ended is not None:
        return ended
    run.task_result_id = str(result.id)[:64]
    run.task_status = str(result.status)[:16]
    return Ended(Outcome.SUCCEEDED, 0, f"enqueued {path} as {result.id}", path)


def bounded(runner: Runner, enqueue: Callable[[], Any], path: str) -> tuple[Any, Ended | None]:
    """An enqueue on a backend outside the claims' database (a broker, an HTTP service), from a
    thread, so that --timeout and a signal end the run as they end a job's: a client with no
    socket timeout must not hold the slot's lock forever. (result, None), or (None, how the
    run ended); an enqueue cut off may still arrive (the window docs/tasks.md describes)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = enqueue()
        except BaseException as exc:  # reported by the main thread
            box["error"] = exc
        finally:
            connections.close_all()  # a backend that used this thread's database connection
            runner.signals.wake()

    thread = threading.Thread(target=work, name="cronops-enqueue", daemon=True)
    thread.start()
    bound = runner.opts.timeout
    deadline = None if not bound else time.monotonic() + bound
    while thread.is_alive():
        if (ended := runner.terminated()) is not None:
            note = f"{ended.note} while enqueueing {path}"
            return None, Ended(ended.outcome, ended.exit_code, note, path)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            note = f"timed out after {bound:g}s enqueueing {path}"
            return None, Ended(Outcome.TIMED_OUT, EXIT_TIMEOUT, note, path)
        runner.signals.wait([], left)
    if "error" in box:
        note = f"could not enqueue {path}: {_said(box['error'])}"
        return None, Ended(Outcome.FAILED, 1, note, path)
    return box["result"], None


def inside_record(pending: Pending | None, run: JobRun) -> Callable[[], None] | None:
    """In the record's transaction: the enqueue that commits with the claim's success. When it
    fails, the run is recorded failed instead (its savepoint rolled back; the claim then says
    failed and the slot runs again). Returns what undoes it, for the record to call when the
    claim turns out taken over meanwhile (the new holder enqueues; this one must not)."""
    if pending is None or run.outcome != Outcome.SUCCEEDED:
        return None
    path = run.command.split(" ")[0]
    before = transaction.savepoint()  # kept after the enqueue's own: what undo() rolls back to
    try:
        with transaction.atomic():  # a failed INSERT rolls back to here, the record goes on
            result = pending.task.enqueue(**pending.kwargs)
    except Exception as exc:
        run.outcome, run.exit_code = Outcome.FAILED, 1
        run.note = f"could not enqueue {path}: {_said(exc)}"[:300]
        return None
    run.task_result_id = str(result.id)[:64]
    run.task_status = str(result.status)[:16]
    run.note = f"enqueued {path} as {result.id}"[:300]

    def undo() -> None:
        transaction.savepoint_rollback(before)
        run.task_result_id = run.task_status = ""

    return undo


def follow(runner: Runner, run: JobRun, exit_code: int, catch_up: bool) -> tuple[int, str]:
    """--wait-result: wait (bounded, a signal ends it) for the enqueued task's result; (the
    exit code it gives run_job, one line on how it ended). Not for a catch-up slot: one wait
    per run, the current slot's (its grace holds one)."""
    bound = runner.opts.wait_result
    if not bound or exit_code or not run.task_result_id or catch_up:
        return exit_code, ""
    task = tasks.load(runner.opts.command)
    _, _, missing = tasks.framework()
    deadline = time.monotonic() + bound
    status = ""
    while True:
        try:
            result = task.get_result(run.task_result_id)
            status = str(result.status)
        except missing:
            status = "gone"
        except Exception as exc:  # the backend's own, a database error too: the outcome stands
            return exit_code, f"the task's result could not be read: {_said(exc)}"
        if status in FINISHED or status == "gone":
            break
        left = deadline - time.monotonic()
        if left <= 0 or runner.signals.received is not None:
            break
        runner.signals.wait([], min(POLL, left))
    _store(run, status)
    if status == "SUCCESSFUL":
        return 0, f"the task {run.task_result_id} succeeded"
    if status == "FAILED":
        errors = getattr(result, "errors", None) or []
        why = f": {errors[-1].exception_class_path}" if errors else ""
        return 1, f"the task {run.task_result_id} failed{why}"
    if status == "gone":
        return 1, f"the task {run.task_result_id} is gone from its backend"
    if runner.signals.received is not None:
        return 128 + runner.signals.received, f"stopped waiting for the task ({status})"
    return EXIT_SKIPPED, f"the task {run.task_result_id} had not finished ({status})"


def _store(run: JobRun, status: str) -> None:
    try:
        JobRun.objects.filter(pk=run.pk).update(task_status=status[:16])
    except DatabaseError:
        pass  # shown live where the backend tells; the stored one is only a fallback
    run.task_status = status[:16]


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"
