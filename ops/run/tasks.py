"""A job that is a Django task (`@task`): a dotted path on a crontab.d line instead of a command.

    0 7 * * mon   --timeout=20m   shop.tasks.send_digest '{"region": "eu"}'
    30 2 * * *    --enqueue       shop.tasks.rebuild_index

The command word of a job line is a task when it is a dotted path (a management command's name
has no dot); its one optional argument is a JSON object, the task's keyword arguments. The job's
name is `--name`, else the function's name. A task whose function takes `logical_date` gets the
slot's date (an ISO string: task arguments are JSON), as a command's --logical-date; one that
takes `cronops_slot` gets the claim it runs under ({"job", "slot", "run_id", "version"}), for
`ops.once(key, slot=cronops_slot)` in a worker that runs it later.

Run (the default): the function runs in run_job's forked child, `task.call(**kwargs)`, with
everything a command has. Enqueue (`--enqueue`): run_job claims the slot and puts the task on
its backend, once per slot (ops/run/enqueue.py).

Django 6.0+ has the framework as `django.tasks`; on Django 5.2 the `django-tasks` backport
(`pip install django-tasks`, app `django_tasks`) gives the same API.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json

from ..schedule.options import is_task_path

LOGICAL_DATE = "logical_date"
SLOT = "cronops_slot"
RESERVED = (LOGICAL_DATE, SLOT)  # the runner's to give, never the line's


class TaskRefused(ValueError):
    """A task line that cannot run: one line saying why (usage error, exit 2)."""


# Where the framework lives: Django 6.0+, else the django-tasks backport (same API).
_FRAMEWORKS = (
    ("django.tasks.base", "django.tasks.exceptions", "InvalidTaskBackend"),
    ("django_tasks.base", "django_tasks.exceptions", "InvalidTaskBackendError"),
)


def framework():
    """(the Task class, the exception of a backend not configured, ResultDoesNotExist), from
    django.tasks (Django 6.0+) or the django_tasks backport; TaskRefused without either."""
    for base, exceptions, invalid_backend in _FRAMEWORKS:
        try:
            tasks_base = importlib.import_module(base)
            errors = importlib.import_module(exceptions)
        except ImportError:
            continue
        return tasks_base.Task, getattr(errors, invalid_backend), errors.TaskResultDoesNotExist
    raise TaskRefused(
        "Django Tasks is not available: it comes with Django 6.0, and for Django 5.2 with the "
        "django-tasks package (`pip install django-tasks`, and 'django_tasks' in INSTALLED_APPS)"
    )


def load(path: str):
    """The Task at `path` (a module's attribute); TaskRefused naming what is wrong."""
    task_class, invalid_backend, _ = framework()
    module_path, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name and module_path.startswith(exc.name):
            raise TaskRefused(f"task {path}: no module {exc.name!r}") from None
        raise TaskBroken(f"task {path}: importing {module_path} failed: {_line(exc)}") from None
    except invalid_backend as exc:
        raise TaskRefused(f"task {path}: {_backend_problem(exc)}") from None
    except (Exception, SystemExit) as exc:  # the module's own: a RuntimeError, a sys.exit()
        raise TaskBroken(
            f"task {path}: importing {module_path} failed: {type(exc).__name__}: {_line(exc)}"
        ) from None
    task = getattr(module, attribute, None)
    if task is None:
        if _is_module(path):
            raise TaskRefused(f"task {path}: it is a module: name the task in it (module.task)")
        raise TaskRefused(f"task {path}: {module_path} has no {attribute!r}")
    if not isinstance(task, task_class):
        kind = "a function" if inspect.isfunction(task) else type(task).__name__
        raise TaskRefused(
            f"task {path}: it is {kind}, not a task (decorate it with @task, from "
            f"{task_class.__module__.rpartition('.')[0]})"
        )
    if task.module_path != path:  # the framework enqueues by the function's own path
        raise TaskRefused(f"task {path}: it is the task {task.module_path}: name it by that path")
    return task


class TaskBroken(TaskRefused):
    """The task's module is there but raised on import: at run time that is the run's failure
    (recorded, pinged), as a command whose module raises; for check and install, a refusal."""


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def _is_module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError):
        return False


def _backend_problem(exc: Exception) -> str:
    return f"its task backend is not configured ({exc}): add it to the TASKS setting"


def kwargs_of(path: str, args: list[str]) -> dict:
    """The keyword arguments a task line gives: none, or one JSON object."""
    if not args:
        return {}
    if len(args) == 1:
        try:
            value = json.loads(args[0], parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else _line(exc)
            raise TaskRefused(f"task {path}: its argument is not JSON ({why})") from None
        if _holds_nul(value):
            raise TaskRefused(
                f"task {path}: its argument holds a NUL character (\\u0000), which a task "
                "backend's database cannot store"
            )
        if isinstance(value, dict):
            reserved = [key for key in value if key in RESERVED]
            if reserved:
                raise TaskRefused(
                    f"task {path}: its arguments give {reserved[0]!r}, which the runner "
                    "gives each run (the slot's)"
                )
            return value
        what = f"a JSON {type(value).__name__}"
    else:
        what = f"{len(args)} words"
    raise TaskRefused(
        f"task {path}: its arguments are one JSON object of keyword arguments "
        """('{"name": value}'), """ + f"not {what}"
    )


def _holds_nul(value: object) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return True
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _no_constant(name: str) -> float:
    # NaN and Infinity are Python's extension: no JSON column stores them.
    raise ValueError(f"{name} is not a JSON number")


def accepts(task, name: str) -> bool:
    parameters = inspect.signature(task.func).parameters
    return name in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def check(path: str, args: list[str], *, enqueue: bool = False, wait_result: bool = False):
    """The task and its keyword arguments, or TaskRefused: the path names a task, the
    arguments are JSON and fit its function, its backend is configured (and, enqueued, takes
    it; with --wait-result, can report results)."""
    if not is_task_path(path):
        raise TaskRefused(f"{path!r} is not a task's dotted path (module.function)")
    task = load(path)
    kwargs = kwargs_of(path, args)
    given = dict(kwargs)
    for name in RESERVED:
        if name in inspect.signature(task.func).parameters:
            given[name] = None  # filled in by each run
    try:
        inspect.signature(task.func).bind(*(() if not task.takes_context else (None,)), **given)
    except TypeError as exc:
        name = task.func.__name__
        raise TaskRefused(f"task {path}: its arguments do not fit {name}(): {exc}") from None
    _, invalid_backend, _ = framework()
    try:
        backend = task.get_backend()
    except invalid_backend as exc:
        raise TaskRefused(f"task {path}: {_backend_problem(exc)}") from None
    if enqueue and (kept := _in_process(backend)):
        raise TaskRefused(
            f"task {path}: its backend {type(backend).__name__} {kept}, so --enqueue would "
            "not hand it to a worker: run it without --enqueue (in run_job's child, with "
            "--timeout and its output), or enqueue it on a backend a worker reads"
        )
    if task.takes_context and not enqueue:
        raise TaskRefused(
            f"task {path}: it takes a task context (takes_context=True), which only a task "
            "backend gives: give it --enqueue"
        )
    if wait_result and not getattr(backend, "supports_get_result", False):
        raise TaskRefused(
            f"task {path}: its backend {type(backend).__name__} cannot report results, so "
            "--wait-result cannot follow one"
        )
    return task, kwargs


def _in_process(backend) -> str:
    """Why enqueueing on `backend` from run_job is no hand-over to a worker ("" when it is):
    the framework's immediate backend runs the task inside enqueue(), in run_job's own process
    (no child, no timeout), and its dummy one keeps it in memory that ends with run_job."""
    for cls in type(backend).__mro__:
        if cls.__module__.startswith(("django.tasks.", "django_tasks.")):
            if cls.__name__ == "ImmediateBackend":
                return "runs the task inside enqueue(), in run_job's own process"
            if cls.__name__ == "DummyBackend":
                return "keeps the task in run_job's memory, where nothing runs it"
    return ""


def call_kwargs(task, kwargs: dict, logical_date: str | None, slot: dict | None) -> dict:
    """`kwargs` with what the runner gives: the slot's date, the claim."""
    full = dict(kwargs)
    if logical_date is not None and accepts(task, LOGICAL_DATE):
        full[LOGICAL_DATE] = logical_date
    if slot is not None and accepts(task, SLOT):
        full[SLOT] = slot
    return full


def run(path: str, args: list[str]) -> None:
    """In the job's child: the task's function, here and now (its exceptions are the job's)."""
    task = load(path)
    kwargs = json.loads(args[0]) if args else {}
    if accepts(task, SLOT):
        from dataclasses import asdict

        from .fencing import current_claim

        claim = current_claim()
        kwargs[SLOT] = None if claim is None else asdict(claim)
    task.call(**kwargs)


def status_of(run) -> str:
    """The status of the task `run` enqueued (READY, RUNNING, SUCCESSFUL, FAILED...): its
    backend's, read now where the backend can tell, else the one last seen; "" for none."""
    if not run.task_result_id:
        return ""
    try:
        task = load(run.command.split(" ", 1)[0])
        if getattr(task.get_backend(), "supports_get_result", False):
            return str(task.get_result(run.task_result_id).status)
    except Exception:  # noqa: S110  the module gone, the backend down: the stored status
        pass
    return run.task_status or "enqueued"
