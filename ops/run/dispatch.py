"""The warm dispatcher: `manage.py run_due_jobs`, one cron line a minute (install_crontab
--dispatcher), starts the crontab.d jobs Debian's cron would have started in that minute.

Which jobs: ops/schedule/firing.py, the model of cron's daemon that bench/faults/f7_clock.py
checks against the real one (DST nights included). How: for each due job this process, set up
once, forks; the child forks again and exits at once (reaped here), so the grandchild, the
job's run_job, belongs to no one here (init, or the nearest subreaper, reaps it) and this
process never waits for a job. The grandchild is a fresh process as far as run_job can tell
(no database connection, stdin from /dev/null, its own session, its output in the job's log
rather than cron's pipe) and runs run_job's own command with the arguments of the job's
installed line (`--log=OPS_LOG_DIR/<job>.log` and its crontab.d options): every guarantee of
run_job (lock, claim, the job in its own child, timeout, retries, --after, pause, pings,
history, --catch-up) holds because it is run_job's code.

The model is replayed from cron's virtual minute as the last dispatch left it, kept in
OPS_LOCK_DIR/run_due_jobs.state (ops/run/virtual_minute.py).
"""

import datetime as dt
import gc
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connections
from django.utils import timezone

from .. import conf
from ..schedule.before_fork import keep_for_children
from ..schedule.crontab_text import run_job_argv
from ..schedule.crontabd import CrontabError, Job, load_jobs_leniently, load_schedule
from ..schedule.firing import Expr, due_at
from . import descendants, heap, origin
from .output import open_append
from .virtual_minute import STATE_NAME, VirtualMinute


def say(message: str, stream) -> None:
    """One `cronops:` line, written here and now: not through run_job's writer threads
    (ops/run/outbox.py), since this process forks after it."""
    try:
        stream.write(f"cronops: {message}\n")
        stream.flush()
    except (OSError, ValueError):
        pass  # cron's mail or the log is gone: the runs go on


@dataclass
class Started:
    job: str
    pid: int  # the run_job process's (0 when it could not be started)
    argv: list[str]  # run_job's arguments


def scheduled_jobs(stderr=None) -> list[Job]:
    """crontab.d's jobs with a schedule (not @reboot). One bad line stops only its own job, as
    with per-job lines: the valid ones are still started (each run_job says the error too)."""
    try:
        schedule = load_schedule()
        keep_for_children(schedule, conf.crontab_dir())  # run_job's resolve reads it again
        jobs = schedule.jobs
    except CrontabError as exc:
        jobs = list(load_jobs_leniently().values())
        say(f"warning: {exc} (the jobs declared validly are started)", stderr or sys.stderr)
    return [job for job in jobs if job.cron_expr is not None]


def due_jobs(
    jobs: list[Job],
    now: dt.datetime | None,
    tz: ZoneInfo,
    memory: VirtualMinute | None = None,
) -> list[Job]:
    """The jobs Debian's cron starts at `now`'s minute (its per-job lines would): with
    `memory`, from cron's virtual minute kept there (`now` None: the clock, read under its
    lock); without, from the minute alone."""
    by_name = {job.name: job for job in jobs}
    exprs = {job.name: Expr(job.cron_expr) for job in jobs if job.cron_expr is not None}
    if memory is not None:
        names = memory.due(exprs, tz, now)
    else:
        names = due_at(exprs, now or timezone.now(), tz)
    return [by_name[name] for name in names]


def memory_here(stderr) -> VirtualMinute:
    """The dispatcher's state file in OPS_LOCK_DIR (ops/run/virtual_minute.py)."""
    return VirtualMinute(
        conf.lock_dir() / STATE_NAME,
        lambda message: say(message, stderr),
        project=str(conf.crontab_dir()),
    )


def dispatch(
    now: dt.datetime | None = None,
    *,
    stdout=None,
    stderr=None,
    dry_run: bool = False,
    start: "Callable[[list[str], Path], int] | None" = None,
    memory: VirtualMinute | None = None,
) -> list[Started]:
    """Start a run_job for every job due at `now` (default: this minute); never waits for one.
    `memory`: cron's virtual minute, kept between minutes (none: the minute alone)."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    tz = ZoneInfo(settings.TIME_ZONE)
    if dry_run:
        memory, now = None, now or timezone.now()  # a question: it changes no state
    due = due_jobs(scheduled_jobs(stderr), now, tz, memory)
    log_dir = conf.log_dir()
    planned = [(job, run_job_argv(job, log_dir)) for job in due]
    if dry_run:
        at = f"{timezone.localtime(now, tz):%Y-%m-%d %H:%M %Z}"
        for _job, argv in planned:
            say(f"due at {at}: run_job {' '.join(argv)}", stdout)
        return [Started(job.name, 0, argv) for job, argv in planned]
    if not planned:
        return []
    warm_up()
    origin.dispatched_by_cron = origin.under_cron(os.getppid())  # its runs' trigger, inherited
    if start is None:  # real forks (a test's `start` runs each run_job in this process)
        # Last before them: a child's allocations then land on pages of its own, not in the
        # holes of this process's heap, each on a page every child shares (ops/run/heap.py).
        heap.take_free_chunks()
        start = start_run_job
    started = []
    for job, argv in planned:
        try:
            pid = start(argv, log_dir / f"{job.name}.log")
        except OSError as exc:  # a process limit: the next minute (or --catch-up) tries again
            say(f"error: job {job.name}: could not start run_job: {exc}", stderr)
            pid = 0
        started.append(Started(job.name, pid, argv))
    return started


def warm_up() -> None:
    """What every run_job would otherwise import (or build) for itself, done once before the
    forks, so that the children share it; then nothing a child must not inherit."""
    descendants.libc_prctl()  # run_job's subreaper (ops/run/descendants.py)
    import django.db.models.sql.compiler  # noqa: F401  (its first query)
    from django.core.management import get_commands

    from ..management.commands.run_job import common_options
    from ..monitors import pings, sentry  # noqa: F401  (a run_job loads them when configured)
    from ..monitors.redact import Redactor
    from . import after, claimstep, held, retries, runner  # noqa: F401  (and what it loads as needed)

    try:
        Redactor.from_settings().pattern()  # compiled once for every run_job that needs it
    except Exception:  # noqa: S110  (a secret it cannot take: each run_job says so itself)
        pass
    get_commands()
    common_options(str(conf.base_dir() / "manage.py"), "run_job")
    # Not the jobs' own command parsers: building one imports the command's module, which is
    # the job's code (run_job imports it, in the job's own processes).
    connections["default"]  # the database backend's modules (no connection is opened)
    warm_queries()
    connections.close_all()  # a child must never use this process's connection
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # As run_job does: what the start-up made is never garbage, and a collection in a child
    # would copy every page it touches.
    gc.freeze()


def warm_queries() -> bool:
    """Compile (without running: no connection is opened) the kinds of query every run_job
    makes, so that what Django builds at a process's first query of each kind (the models'
    field maps, the fields' columns and lookups, the compilers' code specialised by the
    interpreter) is built once here and shared: a dispatched no-op run_job 36.7 -> 31.7 M
    instructions (bench/RESULTS.md). Best effort (False): a run_job builds what is missing."""
    from django.db.models import Q
    from django.db.models.sql.subqueries import InsertQuery, UpdateQuery

    from ..models import JobPause, JobRun, Outcome, SlotClaim

    now = timezone.now()
    try:
        queries = [
            JobPause.objects.filter(job="")
            .filter(Q(ended_at__isnull=True) | Q(check_paused=True))
            .order_by("-since")[:1]
            .query,
            SlotClaim.objects.filter(job="", slot="")[:21].query,
            SlotClaim.objects.filter(Q(scheduled_at=now) | Q(logical_date=now.date()), job="")
            .exclude(slot="")
            .filter(state__in=[Outcome.SUCCEEDED, Outcome.RUNNING])
            .order_by("id")
            .query,
        ]
        for query in queries:
            query.get_compiler("default").as_sql()
        for model, values in (
            (SlotClaim, {"run": None}),
            (JobRun, {"outcome": Outcome.SUCCEEDED}),
        ):
            update = model.objects.filter(pk=0, job="").query.chain(UpdateQuery)
            assert isinstance(update, UpdateQuery)  # as QuerySet.update() makes it
            update.add_update_values(values)
            update.get_compiler("default").as_sql()
        run = JobRun(job="", slot="", started_at=now, host="", pid=0, command="")
        claim = SlotClaim(job="", slot="", state=Outcome.RUNNING, version=1, host="", pid=0,
                          started_at=now, heartbeat_at=now)  # fmt: skip
        for obj in (run, claim):
            meta = type(obj)._meta
            insert = InsertQuery(type(obj))
            fields = [f for f in meta.local_concrete_fields if f is not meta.auto_field]
            insert.insert_values(fields, [obj])
            compiler = insert.get_compiler("default")
            compiler.returning_fields = meta.db_returning_fields
            compiler.as_sql()
    except Exception:  # Django's internals moved: each run_job builds them itself
        return False
    return True


def start_run_job(argv: list[str], log: Path) -> int:
    """Fork twice: the grandchild runs `manage.py run_job <argv>`; the child exits at once and
    is reaped here. Returns the grandchild's pid (told through a pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a session of its own, one more fork, gone
        code = 1
        try:
            os.close(read)
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                os.close(write)
                _run_job(argv, log)  # never returns
            os.write(write, str(grandchild).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        told = b""
        while chunk := os.read(read, 64):
            told += chunk
    finally:
        os.close(read)
    os.waitpid(pid, 0)
    return int(told or 0)


def _run_job(argv: list[str], log: Path) -> None:
    """In the grandchild: become what cron's per-job line would have started, and run it."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # Off cron's pipe (cron would keep its mail open until every job ended): straight to
        # the job's log, which run_job then opens itself as usual. When it cannot be opened,
        # the output stays where cron sends it, as with a per-job line.
        try:
            fd = open_append(log)  # as run_job's --log: the directory made, no symlink
        except OSError:
            pass
        else:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        from django.core.management import ManagementUtility

        manage_py = str(conf.base_dir() / "manage.py")
        sys.argv = [manage_py, "run_job", *argv]
        ManagementUtility(sys.argv).fetch_command("run_job").run_from_argv(sys.argv)
        code = 0  # run_from_argv ends the process itself (runner.exit_now)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)
