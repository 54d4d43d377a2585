"""What a run_job call means: its options, the declared job, and the slots it serves.

`resolve(argv)` reads the options and crontab.d and refuses (UsageError: exit 2, nothing
recorded, no ping) anything malformed or that would run something other than what crontab.d
declares; `plan_slots` says which slots the call runs (catch-up's earlier ones first).
"""

import contextlib
import datetime as dt
import json
import sys
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.management import get_commands
from django.db import connections
from django.utils import timezone

from ..control import pauses
from ..schedule import dependencies
from ..schedule.crontabd import CrontabError, Job, load_jobs_leniently, load_schedule
from ..schedule.options import (
    OptionsError,
    RunOptions,
    close_match,
    merge,
    parse_run_args,
    shown,
    task_options_problem,
)
from ..schedule.slots import Slot, current_slot, date_slot, previous_slots, slot_on_date
from ..values import Value, replace
from . import claims, commandargs
from .commandargs import ArgsRefused, LogicalDateGiven
from .commandargs import check_args as check_command_args
from .output import write_fd


class UsageError(Exception):
    """Bad arguments or configuration: exit 2, no ping, nothing recorded."""


class Plan(Value):
    """What to run: the resolved options and the declared job (if any)."""

    options: RunOptions
    job: Job | None

    @property
    def name(self) -> str:
        return self.options.job_name


def say(message: str, stream=None) -> None:
    """One `cronops:` line. Never raises: when the log is full or gone, or a job closed the
    stream, the history note and the ping carry the message instead."""
    stream = stream or sys.stdout
    line = f"cronops: {message}\n"
    try:
        fd = stream.fileno()
    except Exception:
        fd = None  # a StringIO (tests, call_command), or a stream that is closed
    if fd is None:
        with contextlib.suppress(Exception):
            stream.write(line)
            stream.flush()
        return
    with contextlib.suppress(Exception):
        stream.flush()  # what the stream already holds comes first
    # Straight to the descriptor: a failed write must not stay in Python's buffer, where the
    # flush at exit would fail again and turn the exit code into 1 or 120.
    write_fd(fd, line)


def resolve(argv: list[str], stderr=None, now: dt.datetime | None = None) -> Plan:
    """The options and the declared job `argv` means; UsageError (exit 2, nothing recorded)
    when it is malformed or would run something other than what crontab.d declares."""
    aware_datetimes()
    try:
        cli = parse_run_args(argv)
    except OptionsError as exc:
        raise UsageError(str(exc)) from None
    stepped_over: CrontabError | None = None
    try:
        schedule = load_schedule()
        job = schedule.get(cli.job_name)
    except CrontabError as exc:
        schedule = None
        job = load_jobs_leniently().get(cli.job_name)
        if job is None:
            raise UsageError(f"{exc} (run_job reads crontab.d for the job's schedule)") from None
        # One bad line stops only its own job: this one's line is valid, so it runs, unless a
        # check below refuses it (its --after in a cycle, say), which is then the only line.
        stepped_over = exc
    if job is not None and job.options.command != cli.command and cli.command != job.name:
        raise UsageError(
            f"job {job.name!r} is declared at {job.path}:{job.lineno} with command "
            f"{job.options.command!r}, not {cli.command!r}"
        )
    if job is None:
        _check_ad_hoc(cli, schedule)
        options = cli
    else:
        options = merge(job.options, cli)
        options.name = job.name if job.name != job.options.command else options.name
    if why := task_options_problem(options):
        raise UsageError(why)
    if options.after and options.logical_date is None and (job is None or job.cron_expr is None):
        # No slot, so no logical date for the upstream to have succeeded for.
        raise UsageError(
            "--after needs a logical date: give --logical-date=YYYY-MM-DD, or declare the job "
            "with a schedule in crontab.d"
        )
    if options.after:
        _check_after(options, job, schedule)
    plan = Plan(options=options, job=job)
    _check_logical_date(plan, from_declaration=job is not None and not cli.args, now=now)
    if stepped_over is not None:
        ok = f"job {plan.name} is declared validly: that error does not stop it"
        say(f"warning: {stepped_over} ({ok})", stderr)
    return plan


def _check_after(options: RunOptions, job: Job | None, schedule) -> None:
    """--after's rules (ops/schedule/dependencies.py) for this run: an upstream given on the
    command line, or declared in a crontab.d whose error is elsewhere, would otherwise wait its
    --after-wait and exit 75 on every run. An ad hoc run is held to a daily job's rule."""
    jobs = {j.name: j for j in schedule.jobs} if schedule else load_jobs_leniently()
    me = replace(job, options=options) if job else Job(options.job_name, "* * * * *", options, [])
    why = dependencies.refusal(me, jobs)
    if why:
        where = f"{job.path}:{job.lineno}: " if job and job.options.after else ""
        raise UsageError(f"{where}job {me.name}: {why}")


def _check_ad_hoc(cli: RunOptions, schedule) -> None:
    """An ad hoc run (no job of that name in crontab.d) may wrap any command that crontab.d
    does not declare: a declared command never escapes its slot gate under another name."""
    commands = get_commands()
    if cli.command == "run_job":  # a runner inside the runner: two locks, claims and pings
        spelled = " ".join(cli.args) or "<command>"
        spelled = spelled if len(spelled) <= 60 else spelled[:60] + "…"
        raise UsageError(
            f"run_job cannot run run_job: write the command itself (`run_job {spelled}`)"
        )
    if cli.command not in commands and not cli.is_task:
        names = [c for c in commands if c != "run_job"]
        names += [j.name for j in schedule.jobs] if schedule else []
        meant = close_match(cli.command, names)  # as Django's own "Did you mean …?"
        raise UsageError(
            f"unknown command {shown(cli.command)}: not a management command, a task's dotted "
            "path (module.function) or a job in crontab.d"
            + (f". Did you mean {meant}?" if meant else "")
        )
    if cli.job_name != cli.command and cli.job_name in commands:  # a task's too: `check`
        raise UsageError(
            f"job name {cli.job_name!r} is the name of another management command: "
            f"`run_job {cli.job_name}` would mean that command; choose another --name"
        )
    declared = [j for j in schedule.jobs if j.options.command == cli.command] if schedule else []
    if declared:
        where = ", ".join(f"{j.name!r} ({j.path}:{j.lineno})" for j in declared)
        spell = " or ".join(f"`run_job {j.name}`" for j in declared)
        raise UsageError(
            f"{cli.command} is declared in crontab.d as job {where}; run it as {spell} (a "
            "declared command runs only as its declared job, so each slot runs once)"
        )
    other = commandargs.history_command(cli.job_name, cli.command)
    if other is not None:
        raise UsageError(
            f"job name {cli.job_name!r} has a history made by command {other!r}, not "
            f"{cli.command!r}: its slots are {other}'s; choose another --name"
        )


def _check_logical_date(plan: Plan, *, from_declaration: bool, now: dt.datetime | None) -> None:
    opts = plan.options
    if opts.is_task:
        from .tasks import TaskBroken, TaskRefused, check

        try:
            check(opts.command, opts.args, enqueue=opts.enqueue, wait_result=bool(opts.wait_result))
        except TaskBroken:
            pass  # its module raised on import: the run fails and says so, as a command's would
        except TaskRefused as exc:
            where = f"{plan.job.path}:{plan.job.lineno}: " if plan.job and from_declaration else ""
            raise UsageError(f"{where}{exc}") from None
    else:
        _check_command_args(plan, from_declaration=from_declaration)
    if opts.logical_date is not None:
        today = timezone.localdate(now or timezone.now(), ZoneInfo(settings.TIME_ZONE))
        if opts.logical_date > today:
            # Running a future slot now would make the real run that day a no-op.
            raise UsageError(
                f"--logical-date {opts.logical_date} is in the future (today is {today} in "
                f"{settings.TIME_ZONE})"
            )


def _check_command_args(plan: Plan, *, from_declaration: bool) -> None:
    opts = plan.options
    try:
        check_command_args(opts.command, opts.args)
    except LogicalDateGiven as exc:
        if from_declaration and plan.job is not None:
            where = f"{plan.job.path}:{plan.job.lineno}: "
            fix = "remove it from that line: each run gets its slot's date"
        else:
            if plan.job is not None:
                spelled = plan.job.name
            elif opts.name in (None, opts.command):
                spelled = opts.command
            else:
                spelled = f"--name={opts.name} {opts.command}"
            where = ""
            fix = f"write `run_job --logical-date={exc.value or 'YYYY-MM-DD'} {spelled}`"
        raise UsageError(f"{where}{exc}; {fix}") from None
    except ArgsRefused as exc:
        raise UsageError(str(exc)) from None


def plan_slots(plan: Plan, now: dt.datetime, tz: ZoneInfo) -> list[Slot | None]:
    opts, expr = plan.options, plan.job.cron_expr if plan.job else None
    if opts.logical_date is not None:
        if expr is None:
            slot = date_slot(opts.logical_date)
            comes = dt.datetime.combine(opts.logical_date, dt.time(0), tzinfo=tz)
        else:
            try:
                slot = slot_on_date(expr, opts.logical_date, tz)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            comes = slot.at or dt.datetime.combine(opts.logical_date, dt.time(0), tzinfo=tz)
        if comes > now:
            # Running a future slot now would make the real run that day a no-op.
            raise UsageError(
                f"--logical-date {opts.logical_date} is in the future: its slot ({slot}) has "
                "not come yet"
            )
        return [slot]
    if expr is None:
        return [None]  # unscheduled: lock, history and pings, but no slot gate
    slot = current_slot(expr, now, tz)
    slots: list[Slot | None] = [slot]
    if opts.catch_up:
        # Never at or before the latest succeeded slot, nor before the first claim (README).
        floor = claims.catch_up_floor(plan.name, tz)
        if floor.first is not None:
            earlier = previous_slots(
                expr, slot, opts.catch_up, tz, after=floor.latest_success, since=floor.first
            )
            done = claims.done_keys(plan.name, earlier)
            done |= pauses.paused_keys(plan.name, [s for s in earlier if s.key not in done])
            slots = [*(s for s in earlier if s.key not in done), slot]
    return slots


def accepts_logical_date(command: str) -> bool:
    return commandargs.accepts_logical_date(command)  # the parser built once, shared


def command_line(plan: Plan, slot: Slot | None) -> list[str]:
    """The command's arguments for `slot`: its own, plus the slot's date when it takes one
    (resolve() has refused arguments that carry a date of their own). A task's: one JSON
    object, its keyword arguments with the slot's date (ops/run/tasks.py)."""
    if plan.options.is_task:
        from . import tasks

        task = tasks.load(plan.options.command)
        day = slot.logical_date.isoformat() if slot is not None else None
        given = tasks.kwargs_of(plan.options.command, plan.options.args)
        kwargs = tasks.call_kwargs(task, given, day, None)
        return [json.dumps(kwargs)]
    args = list(plan.options.args)
    if slot is not None and accepts_logical_date(plan.options.command):
        args.append(f"--logical-date={slot.logical_date.isoformat()}")
    return args


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def env_file_usable() -> None:
    """A `.env` line that could not be loaded (ops/env.py) is a usage error: the job would run
    without that variable (a garbled DATABASE_URL: against another database)."""
    from .. import env

    if env.problems:
        raise UsageError(env.problems[0])


def aware_datetimes() -> None:
    """USE_TZ off (ops.E008 under `manage.py check`) is a usage error: every slot, claim and run
    is an aware datetime. run_job runs no system check, so it says it itself, in one line."""
    if not getattr(settings, "USE_TZ", False):
        raise UsageError(
            "USE_TZ is off: cronops stores every slot and run as an aware datetime (set "
            "USE_TZ = True)"
        )


def outside_transactions() -> None:
    """The job runs in a child process, on a connection of its own: it cannot see (or wait for)
    what a caller's open transaction holds, and closing the caller's connection before the fork
    would end that transaction. call_command("run_job") inside transaction.atomic() is a usage
    error."""
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            raise UsageError(
                "run_job cannot run inside transaction.atomic() (database "
                f"{conn.alias!r}): the job runs in a child process with a connection of its own"
            )


def could_not_start(plan: Plan | None, argv: list[str], message: str) -> None:
    """Tell the monitors of a run that could not start, with the job's declared options."""
    from ..monitors import monitors

    if plan is not None:
        opts = plan.options
    else:
        try:
            opts = parse_run_args(argv)
        except OptionsError:
            return
    monitors.could_not_start(opts, plan.job if plan is not None else None, message)
