"""run_job: one job run, in order: lock, claim, start ping, command, record, final ping.

`run(argv)` is what `manage.py run_job` calls; it returns the exit code (DESIGN.md's table).
"""

import contextlib
import datetime as dt
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import get_commands
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from .. import conf
from ..models import JobRun, Outcome
from ..monitors.pings import PingConfig, Pinger
from ..monitors.redact import Redactor
from ..schedule.crontabd import CrontabError, Job, load_jobs_leniently, load_schedule
from ..schedule.options import OptionsError, RunOptions, merge, parse_run_args, shown
from ..schedule.slots import Slot, current_slot, date_slot, previous_slots, slot_on_date
from . import claims, commandargs, descendants, standby
from .commandargs import ArgsRefused, LogicalDateGiven
from .commandargs import check_args as check_command_args
from .lock import JobLock, LockError
from .output import (
    CapturedOutput,
    JobLog,
    Tail,
    hold_standard_fds,
    settle,
    standard_streams,
    write_fd,
)
from .threads import RUN_SIGNALS, SIG_INTERRUPT, Nudger, quiet_nudges
from .threads import start as start_thread

EXIT_SKIPPED = 75  # also a run whose claim was taken over: the slot is another run's now
EXIT_TIMEOUT = 124
EXIT_USAGE = 2
TAIL_BYTES = 100_000  # hosted healthchecks keeps 100,000 bytes of a ping body
HISTORY_TAIL_BYTES = 10_000


class UsageError(Exception):
    """Bad arguments or configuration: exit 2, no ping, nothing recorded."""


class JobInterrupted(BaseException):
    def __init__(self, outcome: str, exit_code: int, note: str):
        super().__init__(note)
        self.outcome, self.exit_code, self.note = outcome, exit_code, note


@dataclass
class Plan:
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
    try:
        cli = parse_run_args(argv)
    except OptionsError as exc:
        raise UsageError(str(exc)) from None
    try:
        schedule = load_schedule()
        job = schedule.get(cli.job_name)
    except CrontabError as exc:
        schedule = None
        job = load_jobs_leniently().get(cli.job_name)
        if job is None:
            raise UsageError(f"{exc} (run_job reads crontab.d for the job's schedule)") from None
        # One bad line stops only its own job: this one's line is valid, so it runs.
        say(f"warning: {exc} (job {job.name} is declared validly and runs)", stderr)
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
    plan = Plan(options=options, job=job)
    _check_logical_date(plan, from_declaration=job is not None and not cli.args, now=now)
    return plan


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
    if cli.command not in commands:
        raise UsageError(
            f"unknown command {shown(cli.command)}: not a management command and not a job in "
            "crontab.d"
        )
    if cli.name is not None and cli.name != cli.command and cli.name in commands:
        raise UsageError(
            f"job name {cli.name!r} is the name of another management command: "
            f"`run_job {cli.name}` would mean that command; choose another --name"
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
    try:
        check_command_args(opts.command, opts.args)
    except LogicalDateGiven as exc:
        if from_declaration:
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
    if opts.logical_date is not None:
        today = timezone.localdate(now or timezone.now(), ZoneInfo(settings.TIME_ZONE))
        if opts.logical_date > today:
            # Running a future slot now would make the real run that day a no-op.
            raise UsageError(
                f"--logical-date {opts.logical_date} is in the future (today is {today} in "
                f"{settings.TIME_ZONE})"
            )


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
            comes = slot.at
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
            slots = [s for s in earlier if s.key not in done] + slots
    return slots


def accepts_logical_date(command: str) -> bool:
    return commandargs.accepts_logical_date(command)  # the parser built once, shared


def command_line(plan: Plan, slot: Slot | None) -> list[str]:
    """The command's arguments for `slot`: its own, plus the slot's date when it takes one
    (resolve() has refused arguments that carry a date of their own)."""
    args = list(plan.options.args)
    if slot is not None and accepts_logical_date(plan.options.command):
        args.append(f"--logical-date={slot.logical_date.isoformat()}")
    return args


def _status(code: int) -> int:
    """An exit status a shell (and a healthchecks /<code> ping) can carry: 0-255, else 1."""
    return code if 0 <= code <= 255 else 1


def execute(command: str, args: list[str]) -> tuple[int, str]:
    """Run a management command in this process: (exit code as a shell sees it, error line)."""
    from django.core.management import call_command

    try:
        call_command(command, *args)
    except CommandError as exc:
        line = f"CommandError: {exc}"
        write_fd(2, line + "\n")  # after the job's own output (write_fd flushes it first)
        return _status(exc.returncode or 1), line
    except SystemExit as exc:
        if exc.code is None:
            return 0, ""
        if isinstance(exc.code, int):
            code = _status(exc.code)
            return code, f"exit {exc.code}" if code else ""
        write_fd(2, f"{exc.code}\n")
        return 1, str(exc.code)
    except JobInterrupted:
        raise
    except Exception as exc:
        # To fd 2 itself, the job's captured stderr: the job may have closed sys.stderr.
        write_fd(2, traceback.format_exc())
        return 1, f"{type(exc).__name__}: {_one_line(exc)}"
    return 0, ""


class Guard:
    """SIGTERM, SIGINT and --timeout for the whole run.

    While the command runs, a signal raises JobInterrupted inside it. At any other moment
    (claim, record, pings) it is only noted, and acted on at the next safe point, so that a
    claim is never left "running" by a signal that arrived between two database writes.
    """

    SIGNALS = tuple(sorted(RUN_SIGNALS))

    def __init__(self):
        self.pending: JobInterrupted | None = None
        self.fired: JobInterrupted | None = None
        self.lost: JobInterrupted | None = None  # the claim was taken over (heartbeat thread)
        self._armed = False
        self._sleeping = False  # a standby between two reads of the claim
        self._timeout: float | None = None
        self._timer: threading.Timer | None = None
        self._previous = {}
        self._handled_at = 0.0  # when a handler of ours last ran (the Nudger asks)
        self._nudger = Nudger(lambda: self._handled_at)

    def _on_signal(self, signum, frame):
        self._handled_at = time.monotonic()
        if signum == SIG_INTERRUPT:
            if not self._armed:
                return  # a timer that fired as the command ended: nothing to interrupt
            if self.lost is not None:
                interrupted = self.lost
            elif not self._timeout:
                return
            else:
                interrupted = JobInterrupted(
                    Outcome.TIMED_OUT, EXIT_TIMEOUT, f"timed out after {self._timeout:g}s"
                )
        else:
            name = signal.Signals(signum).name
            interrupted = JobInterrupted(Outcome.TERMINATED, 128 + signum, f"terminated by {name}")
            if self._sleeping:  # a standby's wait ends at once: nothing is claimed yet
                self._sleeping = False
                raise interrupted
        if self._armed:
            self._armed = False
            self.fired = interrupted  # remembered: a job that swallows it still ends this way
            raise interrupted
        if self.pending is None:
            self.pending = interrupted

    def sleep(self, seconds: float) -> None:
        """A standby's pause between two reads of the claim; SIGTERM or SIGINT (also one
        that arrived just before) ends it at once with JobInterrupted."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            raise pending
        self._sleeping = True
        try:
            time.sleep(seconds)
        finally:
            self._sleeping = False

    def interrupt_lost(self, interrupted: JobInterrupted) -> None:
        """From the heartbeat thread: the claim was taken over; stop the command as a timeout
        would (a command that already ended is judged by its record instead)."""
        self.lost = interrupted
        self._interrupt_main()

    @staticmethod
    def _interrupt_main() -> None:
        with contextlib.suppress(Exception):
            signal.pthread_kill(threading.main_thread().ident, SIG_INTERRUPT)

    def install(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        try:
            hold_standard_fds()  # the nudger's pipe must not take a number the caller closed
            self._nudger.install()
        except BaseException:  # no pipe or thread to be had: no guard left half in place
            self.uninstall()
            raise

    def _reinstall(self) -> None:
        # A job may have put in handlers of its own; ours must guard the record that follows.
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)
        quiet_nudges()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def uninstall(self) -> None:
        try:
            self._stop_timer()
            self._nudger.uninstall()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous = {}

    @contextmanager
    def command(self, timeout: float | None):
        """The window in which a signal (or the timeout) interrupts the command."""
        if self.pending is not None:  # arrived during the claim: the command never starts
            pending, self.pending = self.pending, None
            raise pending
        self._timeout = timeout
        self.fired = None
        try:
            self._armed = True
            if timeout:
                self._timer = threading.Timer(timeout, self._interrupt_main)
                self._timer.daemon = True
                start_thread(self._timer)
            yield
        finally:
            self._armed = False
            self._stop_timer()
            self._reinstall()
        if self.fired is not None:  # the job caught our interruption and returned anyway
            raise self.fired


class Heartbeat:
    """Refreshes the claim's heartbeat from a thread, so another host can tell we are alive.

    A heartbeat that finds the claim no longer ours (another run took it over while this one
    was frozen or cut off from the database) says so once and calls `on_lost` with the note."""

    def __init__(self, run: JobRun, interval: float, on_lost=None):
        self.run, self.interval, self.on_lost = run, interval, on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="cronops-heartbeat")

    def _beat(self):
        failing = False
        try:
            while not self._stop.wait(self.interval):
                try:
                    hold_standard_fds()  # a reconnect must not take a number the job freed
                    owned = claims.heartbeat(self.run, timezone.now())
                    if not owned:
                        note = taken_over_note(self.run)
                        say(f"job {self.run.job}: {note}; stopping this run", sys.stderr)
                        if self.on_lost is not None:
                            self.on_lost(note)
                        return
                    failing = False
                except DatabaseError as exc:
                    if not failing:  # once per outage, not once per beat
                        say(f"job {self.run.job}: heartbeat failed: {_one_line(exc)}", sys.stderr)
                    failing = True
                    connection.close()  # the next beat connects afresh (Django would not)
        finally:
            connection.close()

    def __enter__(self):
        if self.run.slot:
            start_thread(self._thread)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return False


def taken_over_note(run: JobRun) -> str:
    """Who holds the slot now, for a run that lost its claim (one read of the claim)."""
    now = claims.peek(run.job, run.slot)
    if now is None:
        who = "another run"
    else:
        who = f"run #{now.run_id} on {now.host} (claim version {now.version})"
    return (
        f"the claim on {run.slot} was taken over by {who} while this run was frozen or cut "
        "off from the database (no heartbeat for 3 intervals)"
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def standby_bound(options: RunOptions, heartbeat: float) -> float | None:
    """How long a run stands by (ops/run/standby.py); UsageError for a bad OPS_STANDBY."""
    try:
        on = options.standby if options.standby is not None else standby.setting()
    except standby.StandbySettingError as exc:
        raise UsageError(str(exc)) from None
    if on is True and not options.timeout:
        from ..monitors.status import default_grace  # only then: the runner's start-up stays lean

        grace = default_grace()
    else:
        grace = 0.0
    return standby.bound(options, heartbeat=heartbeat, default_grace=grace)


class Runner:
    def __init__(self, plan: Plan, *, stdout=None, stderr=None, log_problem: str = ""):
        self.plan = plan
        self.log_problem = log_problem  # why --log could not be opened, or ""
        self.opts = plan.options
        self.host = conf.host()
        # Read (and so validated) before anything is claimed: a bad value is exit 2, no trace.
        self.heartbeat = conf.heartbeat_seconds()
        self.pid = os.getpid()
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.ping_config = PingConfig.from_settings()
        self.redactor = Redactor.from_settings(settings)
        self.guard = Guard()
        self.stop = False  # set by a timeout, a signal or a lost database: no further slots
        # Catch-up slots send no pings of their own (hosted healthchecks.io drops more than 5
        # pings a minute per check); the last slot's final ping sums them up.
        self.caught_up: list[str] = []
        self.summarised = False
        self.catch_up_failure = 0  # the exit code of this call's first failed catch-up slot
        # How long this call stands by for a busy slot (None: it does not); from the lock on.
        self.standby = standby_bound(plan.options, self.heartbeat)
        self.standby_deadline = time.monotonic() + (self.standby or 0)

    def pinger(self, enabled: bool = True) -> Pinger:
        return Pinger(
            self.ping_config,
            self.plan.name,
            override=self.opts.ping,
            enabled=enabled and not self.opts.no_ping,
        )

    def catch_up_head(self) -> bytes:
        """The summary of this call's catch-up slots, for the head of the final ping."""
        if not self.caught_up:
            return b""
        self.summarised = True
        return ("cronops: caught up " + "; ".join(self.caught_up) + "\n").encode()

    def skip(
        self,
        slot: Slot | None,
        note: str,
        exit_code: int,
        catch_up: bool = False,
        ping: bool = True,
    ) -> int:
        now = timezone.now()
        claims.new_run(
            self.plan.name,
            slot,
            host=self.host,
            pid=self.pid,
            now=now,
            command=self.opts.command,
            outcome=Outcome.SKIPPED,
            note=note,
            exit_code=exit_code,
            finished_at=now,
            duration=0.0,
        )
        if exit_code or not self.opts.quiet:
            say(f"job {self.plan.name}: {note}", self.stdout)
        if catch_up:
            self.caught_up.append(f"{slot}: {note}")
        elif ping:
            self.pinger().log(note)
        return exit_code

    def send_summary(self, exit_code: int) -> None:
        """A final ping for catch-up slots when no slot of this call sent one (the current slot
        was a skip, or a timeout or signal ended the call early)."""
        if self.caught_up and not self.summarised:
            code = self.catch_up_failure or exit_code
            code = 0 if code == EXIT_SKIPPED else code  # a busy current slot is no failure
            self.pinger().finish(code, b"", head=self.catch_up_head())

    def run(self) -> int:
        now = timezone.now()
        lock = JobLock(
            conf.lock_dir(),
            self.plan.name,
            host=self.host,
            since=timezone.localtime(now).strftime("%Y-%m-%d %H:%M:%S %Z"),
        )
        # The lock comes before the guard: a SIGTERM during --wait ends the wait at once
        # (nothing is claimed yet, there is nothing to record).
        if not lock.acquire(self.opts.wait):
            holder = lock.holder()
            return self.skip(None, f"skipped: {holder.describe()}", EXIT_SKIPPED)
        # The standby's bound counts from here: a --wait for the lock does not use it up.
        self.standby_deadline = time.monotonic() + (self.standby or 0)
        self.guard.install()
        # Orphaned grandchildren of the command reparent to run_job (ops/run/descendants.py).
        subreaper = descendants.set_subreaper(True)
        try:
            return self._run(now)
        finally:
            if subreaper is False:  # an in-process caller's state comes back
                descendants.set_subreaper(False)
            self.guard.uninstall()
            lock.release()

    def _run(self, now: dt.datetime) -> int:
        tz = ZoneInfo(settings.TIME_ZONE)
        slots = plan_slots(self.plan, now, tz)
        exit_code = 0
        for i, slot in enumerate(slots):
            if self.guard.pending is not None:  # a signal between two slots
                pending = self.guard.pending
                say(f"job {self.plan.name}: {pending.note}", self.stderr)
                self.send_summary(pending.exit_code)
                return pending.exit_code
            code = self.run_slot(slot, catch_up=i < len(slots) - 1)
            if code and not exit_code:
                exit_code = code  # the first failure's code, also when a later slot succeeds
            if self.stop:
                break
        if self.guard.pending is not None:  # arrived while recording or pinging
            exit_code = self.guard.pending.exit_code
        self.send_summary(exit_code)
        return exit_code

    def claim(self, slot: Slot) -> claims.ClaimResult:
        return claims.claim(
            self.plan.name,
            slot,
            host=self.host,
            pid=self.pid,
            now=timezone.now(),
            force=bool(self.opts.force),
            stale_after=claims.STALE_HEARTBEATS * self.heartbeat,
            command=self.opts.command,
        )

    def stand_by(self, slot: Slot, result: claims.ClaimResult, catch_up: bool):
        """Wait while another run holds `slot` (README: several servers). Returns this slot's
        exit code when there is nothing left to do here, else the ClaimResult it took."""
        total, seen = 0.0, result.holder
        # Said once, so that a run_job that lives for an hour in the log explains itself.
        say(
            f"job {self.plan.name}: {slot} is running on {result.holder.host} "
            f"(pid {result.holder.pid}); standing by",
            self.stdout,
        )
        while result.status == "busy":
            try:
                waited = standby.wait(
                    self.plan.name,
                    slot,
                    deadline=self.standby_deadline,
                    heartbeat=self.heartbeat,
                    sleep=self.guard.sleep,
                    clock=timezone.now,
                )
            except JobInterrupted as interrupted:
                # SIGTERM, SIGINT: the wait ends at once; nothing is claimed, nothing to ping.
                self.stop = True
                holder = result.holder
                note = f"standby {interrupted.note} while {holder.host} ran {slot}"
                return self.skip(slot, note, interrupted.exit_code, catch_up, ping=False)
            total += waited.seconds
            holder = seen = waited.claim or result.holder
            if waited.verdict == standby.DONE:
                note = f"done on {holder.host} for {slot} (stood by {standby.waited(total)})"
                return self.skip(slot, note, 0, catch_up)
            if waited.verdict == standby.FAILED:
                outcome = holder.state.replace("_", " ")
                note = (
                    f"{outcome} on {holder.host} for {slot}: not run again by a standby (it "
                    "runs a slot whose holder died or was terminated, not one that failed)"
                )
                return self.skip(slot, note, 0, catch_up)
            if waited.verdict == standby.GAVE_UP:
                since = timezone.localtime(holder.started_at).strftime("%Y-%m-%d %H:%M:%S %Z")
                note = (
                    f"skipped: running since {since}, pid {holder.pid}, host {holder.host} "
                    f"(stood by {standby.waited(total)}, the standby's bound)"
                )
                return self.skip(slot, note, EXIT_SKIPPED, catch_up)
            result = self.claim(slot)  # TAKE: another standby may be quicker (busy again)
            if result.status == "done":
                holder = result.holder
                note = f"done on {holder.host} for {slot} (stood by {standby.waited(total)})"
                return self.skip(slot, note, 0, catch_up)
        if seen is not None and seen.state in standby.RUN_AGAIN:
            say(
                f"job {self.plan.name}: the run on {seen.host} was {seen.state.replace('_', ' ')}; "
                f"this standby runs {slot}",
                self.stderr,
            )
        return result

    def run_slot(self, slot: Slot | None, catch_up: bool = False) -> int:
        name, now = self.plan.name, timezone.now()
        if slot is not None:
            result = self.claim(slot)
            if result.status == "busy" and self.standby is not None:
                result = self.stand_by(slot, result, catch_up)
                if isinstance(result, int):
                    return result
            if result.status == "done":
                return self.skip(slot, f"already done for {slot}", 0, catch_up)
            if result.status == "busy":
                holder = result.holder
                since = timezone.localtime(holder.started_at).strftime("%Y-%m-%d %H:%M:%S %Z")
                note = f"skipped: running since {since}, pid {holder.pid}, host {holder.host}"
                if result.survivor is not None:  # its runner died, a child of it did not
                    note = (
                        f"skipped: the runner of run #{holder.run_id} (pid {holder.pid}, host "
                        f"{holder.host}) is gone, but a process of run #{holder.run_id} "
                        f"({result.survivor.describe()}) is still running"
                    )
                return self.skip(slot, note, EXIT_SKIPPED, catch_up)
            if result.abandoned is not None:
                say(
                    f"job {name}: recorded the dead attempt #{result.abandoned.pk} for {slot} as "
                    "abandoned",
                    self.stderr,
                )
            run = result.run
        else:
            run = claims.new_run(
                name, None, host=self.host, pid=self.pid, now=now, command=self.opts.command
            )
        return self.execute_run(run, slot, catch_up=catch_up)

    def execute_run(self, run: JobRun, slot: Slot | None, catch_up: bool = False) -> int:
        # The claim goes into the environment before this run starts a thread that reads it,
        # and leaves it after its last ping: glibc's getenv (a thread's getaddrinfo or SSL
        # set-up, libpq's connect) read the array that adding a variable moves, and run_job
        # died with SIGSEGV (CI, 3.13).
        with claims.holding(run):
            return self._execute_held(run, slot, catch_up)

    def _execute_held(self, run: JobRun, slot: Slot | None, catch_up: bool) -> int:
        pinger = self.pinger(enabled=not catch_up)
        run.rid = pinger.rid
        try:
            args = command_line(self.plan, slot)
        except Exception:  # the command cannot even load: execute() meets it and records it
            args = list(self.opts.args)
        # The history and the admin show the command line: a secret passed as an argument is not
        # kept there (the admin's search box would let anyone test guesses at it).
        run.command = self.redactor.text(" ".join([self.opts.command, *args]))[:500]
        pinger.start()
        tail = Tail(TAIL_BYTES, redactor=self.redactor)
        captured = CapturedOutput(tail, quiet=bool(self.opts.quiet))
        started = time.monotonic()
        outcome, note = Outcome.SUCCEEDED, ""
        self.guard.lost = None
        before = frozenset(descendants.children_of(os.getpid()))  # not the command's: never ended

        def on_lost(note: str) -> None:
            self.guard.interrupt_lost(JobInterrupted(Outcome.TAKEN_OVER, EXIT_SKIPPED, note))

        try:
            with Heartbeat(run, self.heartbeat, on_lost), captured:
                try:
                    with self.guard.command(self.opts.timeout):
                        exit_code, note = execute(self.opts.command, args)
                except JobInterrupted as interrupted:
                    captured.restore()
                    outcome, exit_code, note = (
                        interrupted.outcome,
                        interrupted.exit_code,
                        interrupted.note,
                    )
        except JobInterrupted as late:  # a signal between the command's end and our cleanup
            captured.restore()
            outcome, exit_code, note = late.outcome, late.exit_code, late.note
        duration = time.monotonic() - started
        # The job may have closed sys.stdout or sys.stderr (ours too, from manage.py).
        self.stdout, self.stderr = captured.usable(self.stdout), captured.usable(self.stderr)
        self.end_leftovers(before)  # before the claim is released: they must not overlap a rerun
        if outcome == Outcome.SUCCEEDED and exit_code != 0:
            outcome = Outcome.FAILED
        if exit_code and self.opts.quiet:
            captured.replay()
        captured.close()
        lost_output = captured.loss_note()
        if outcome in (Outcome.TIMED_OUT, Outcome.TERMINATED):
            say(f"job {self.plan.name}: {note}", self.stderr)
            self.stop = True
        if outcome == Outcome.TAKEN_OVER:  # the heartbeat thread said so already
            note += "; the job was interrupted"
        kind = None  # timeouts and signals ping their exit code (/124, /143, /130)
        if lost_output:
            # The log's disk is full (or the reader is gone). The job's outcome stands (a done
            # slot must not run again), but the history notes it and the ping is /fail (its
            # exit status, 0, would say success) so that monitoring says something is wrong.
            say(f"error: job {self.plan.name}: {lost_output}", self.stderr)
            note = f"{note}; {lost_output}" if note else lost_output
            kind = "fail"
        if self.log_problem:  # said on cron's stderr at the start; monitoring hears it too
            note = f"{note}; {self.log_problem}" if note else self.log_problem
            kind = "fail"
        note = self.redactor.text(note)  # an error line may quote a secret
        lost = self.record(run, outcome, exit_code, duration, note, tail)
        if lost:
            # The database went away during the run: the outcome exists nowhere but here, so
            # say so once, fail the ping and the exit code; the claim stays "running" and the
            # next run records this attempt as abandoned and runs the slot again.
            note = (
                f"database unavailable: could not record the outcome ({outcome}, exit "
                f"{exit_code}): {lost}"
            )
            say(f"error: job {self.plan.name}: {note}", self.stderr)
            exit_code, kind, self.stop = exit_code or 1, "fail", True
        elif run.outcome == Outcome.TAKEN_OVER:
            # The slot is another run's now: its outcome is the slot's. Not a success, not a
            # failure to alert on (the new holder pings its own); no further slots here.
            outcome, exit_code, note, kind = run.outcome, run.exit_code, run.note, "log"
            self.stop = True
        if catch_up:
            self.catch_up_failure = self.catch_up_failure or exit_code
            self.caught_up.append(
                f"{slot}: {outcome}" + (f", exit {exit_code}" if exit_code else "")
            )
            return exit_code
        body, cut = b"", False
        if not self.opts.no_output_in_ping:
            text, cut = tail.output()
            body = text.encode()
        note = self.redactor.text(note)
        head = self.catch_up_head() + (f"cronops: {note}\n".encode() if note else b"")
        # The final ping carries run_job's exit code: a failed catch-up slot is not hidden by
        # a current slot that succeeded.
        pinger.finish(
            self.catch_up_failure or exit_code,
            body,
            kind=kind,
            head=head,
            written=tail.total,
            cut=cut,
        )
        return exit_code

    def end_leftovers(self, before: frozenset[int]) -> None:
        """End the processes the command left behind (ops/run/descendants.py), after any end of it.
        A signal meanwhile is only noted by the guard and acted on afterwards."""
        try:
            ended = descendants.end_descendants(exclude=before)
        except Exception as exc:  # never lose the outcome over it
            say(f"job {self.plan.name}: could not end its child processes: {exc}", self.stderr)
            return
        if ended:
            shown = ", ".join(f"{p.comm} ({p.pid})" for p in ended[:5])
            more = f" and {len(ended) - 5} more" if len(ended) > 5 else ""
            what = "process" if len(ended) == 1 else "processes"
            say(
                f"job {self.plan.name}: ended {len(ended)} leftover {what} of the command: "
                f"{shown}{more}",
                self.stderr,
            )

    def record(self, run, outcome, exit_code, duration, note, tail: Tail) -> str:
        """Save the outcome; "" when saved, else why not (one line)."""
        run.outcome, run.exit_code, run.note = outcome, exit_code, note[:300]
        run.finished_at = timezone.now()
        run.duration = duration
        run.output_tail = tail.text(HISTORY_TAIL_BYTES)
        for attempt in (1, 2):
            try:
                with transaction.atomic():
                    # Fenced: the outcome goes onto the claim only while the claim is ours.
                    if run.slot and run.outcome != Outcome.TAKEN_OVER and not claims.release(run):
                        self.taken_over(run)
                    run.save()
                return ""
            except DatabaseError as exc:
                if attempt == 1:
                    connection.close()  # the job may have broken the connection: retry once
                    continue
                return _one_line(exc)
        return ""

    def taken_over(self, run: JobRun) -> None:
        """The command ended after its claim was taken over (the heartbeat did not see it in
        time): record it as taken over, never as the slot's outcome."""
        note = taken_over_note(run)
        if self.guard.lost is None:  # else the heartbeat has said so already
            say(f"job {run.job}: {note}", self.stderr)
        ended = f"{run.outcome}, exit {run.exit_code}" if run.exit_code else run.outcome
        run.note = f"{note}; the job had ended by then ({ended})"[:300]
        run.outcome, run.exit_code = Outcome.TAKEN_OVER, EXIT_SKIPPED


def run(argv: list[str], *, stdout=None, stderr=None) -> int:
    """Run `argv` (run_job's arguments) and return the exit code."""
    # --log first, before anything prints: every line of this run belongs in it.
    log = JobLog(log_option(argv))
    standard_streams()
    if log.problem:
        say(f"error: {log.problem}", stderr or sys.stderr)
    try:
        return _run(argv, stdout=stdout, stderr=stderr, log_problem=log.problem)
    finally:
        log.close()
        settle()  # nothing unwritable left in sys.stdout/sys.stderr for the flush at exit


def log_option(argv: list[str]) -> str | None:
    """The `--log` of `argv`; also when another option is malformed (its error goes there)."""
    try:
        return parse_run_args(argv).log
    except OptionsError:
        for word in argv:  # installed lines write --log=PATH first
            if not word.startswith("-"):
                break
            if word.startswith("--log="):
                return word.removeprefix("--log=")
        return None


def _run(argv: list[str], *, stdout=None, stderr=None, log_problem: str = "") -> int:
    stderr = stderr or sys.stderr
    plan = None
    try:
        plan = resolve(argv, stderr, now=timezone.now())
        runner = Runner(plan, stdout=stdout, stderr=stderr, log_problem=log_problem)
        return runner.run()
    except UsageError as exc:
        say(f"error: {exc}", stderr)
        return EXIT_USAGE
    except ImproperlyConfigured as exc:  # a cronops setting's value (ops/conf.py): one line
        say(f"error: {exc}", stderr)
        return EXIT_USAGE
    except LockError as exc:
        # The lock directory cannot be used (read-only or full file system, permissions):
        # nothing can run on this host until it is fixed, so monitoring hears about it.
        say(f"error: {exc}", stderr)
        _fail_ping(plan, argv, str(exc))
        return 1
    except DatabaseError as exc:
        hint = " (run `manage.py migrate`)" if conf.not_migrated(exc) else ""
        say(f"error: database unavailable: {_one_line(exc)}{hint}", stderr)
        _fail_ping(plan, argv, f"database unavailable: {_one_line(exc)}{hint}")
        return 1


def _fail_ping(plan: Plan | None, argv: list[str], message: str) -> None:
    """A /fail ping for a run that could not start, with the job's declared ping options."""
    if plan is not None:
        opts = plan.options
    else:
        try:
            opts = parse_run_args(argv)
        except OptionsError:
            return
    pinger = Pinger(
        PingConfig.from_settings(), opts.job_name, override=opts.ping, enabled=not opts.no_ping
    )
    # /fail, not an exit status: the job never ran, there is none to report.
    message = Redactor.from_settings(settings).text(message)
    pinger.finish(None, f"cronops: {message}\n".encode(), kind="fail")
