"""run_job: one job run, in order: lock, claim, start ping, command, record, final ping.

`run(argv)` is what `manage.py run_job` calls; it returns the exit code (DESIGN.md's table).
"""

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
from django.core.management import get_commands, load_command_class
from django.core.management.base import CommandError
from django.db import DatabaseError, connection
from django.utils import timezone

from . import claims
from .crontabd import CrontabError, Job, load_jobs_leniently, load_schedule
from .healthchecks import PingConfig, Pinger
from .lock import JobLock, LockError
from .models import JobRun, Outcome
from .options import OptionsError, RunOptions, merge, parse_run_args
from .output import CapturedOutput, Tail
from .slots import Slot, current_slot, date_slot, previous_slots, slot_on_date

EXIT_SKIPPED = 75
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
    """One `cronops:` line. Never raises: when the log under cron's redirection is full or
    gone, the history note and the ping carry the message instead."""
    stream = stream or sys.stdout
    line = f"cronops: {message}\n"
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        fd = None  # a StringIO (tests, call_command)
    try:
        if fd is None:
            stream.write(line)
            stream.flush()
        else:
            # Straight to the descriptor: a failed write must not stay in Python's buffer,
            # where the flush at exit would fail again and turn the exit code into 1 or 120.
            stream.flush()
            os.write(fd, line.encode())
    except (OSError, ValueError):
        pass


def resolve(argv: list[str], stderr=None) -> Plan:
    try:
        cli = parse_run_args(argv)
    except OptionsError as exc:
        raise UsageError(str(exc)) from None
    try:
        job = load_schedule().get(cli.job_name)
    except CrontabError as exc:
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
    if job is None and cli.command not in get_commands():
        raise UsageError(
            f"unknown command {cli.command!r}: not a management command and not a job in crontab.d"
        )
    if job is not None:
        options = merge(job.options, cli)
        options.name = job.name if job.name != job.options.command else options.name
        return Plan(options=options, job=job)
    return Plan(options=cli, job=None)


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
        floor = claims.first_slot_key(plan.name)
        if floor is not None:
            earlier = [s for s in previous_slots(expr, slot, opts.catch_up, tz) if s.key >= floor]
            done = claims.succeeded_keys(plan.name, [s.key for s in earlier])
            slots = [s for s in earlier if s.key not in done] + slots
    return slots


def accepts_logical_date(command: str) -> bool:
    app = get_commands()[command]
    cmd = app if not isinstance(app, str) else load_command_class(app, command)
    parser = cmd.create_parser("manage.py", command)
    return any("--logical-date" in a.option_strings for a in parser._actions)


def command_line(plan: Plan, slot: Slot | None) -> list[str]:
    args = list(plan.options.args)
    if (
        slot is not None
        and not any(a.startswith("--logical-date") for a in args)
        and accepts_logical_date(plan.options.command)
    ):
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
        _flush_stdout()  # keep the job's own output before the error in the log
        line = f"CommandError: {exc}"
        sys.stderr.write(line + "\n")
        return _status(exc.returncode or 1), line
    except SystemExit as exc:
        if exc.code is None:
            return 0, ""
        if isinstance(exc.code, int):
            code = _status(exc.code)
            return code, f"exit {exc.code}" if code else ""
        _flush_stdout()
        sys.stderr.write(f"{exc.code}\n")
        return 1, str(exc.code)
    except JobInterrupted:
        raise
    except Exception as exc:
        _flush_stdout()
        traceback.print_exc()
        return 1, f"{type(exc).__name__}: {_one_line(exc)}"
    return 0, ""


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


class Guard:
    """SIGTERM, SIGINT and --timeout for the whole run.

    While the command runs, a signal raises JobInterrupted inside it. At any other moment
    (claim, record, pings) it is only noted, and acted on at the next safe point, so that a
    claim is never left "running" by a signal that arrived between two database writes.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)

    def __init__(self):
        self.pending: JobInterrupted | None = None
        self.fired: JobInterrupted | None = None
        self._armed = False
        self._timeout: float | None = None
        self._previous = {}

    def _on_signal(self, signum, frame):
        if signum == signal.SIGALRM:
            if not self._armed or not self._timeout:
                return  # not our timer (an in-process caller's, or kill -ALRM): ignore it
            interrupted = JobInterrupted(
                Outcome.TIMED_OUT, EXIT_TIMEOUT, f"timed out after {self._timeout:g}s"
            )
        else:
            name = signal.Signals(signum).name
            interrupted = JobInterrupted(Outcome.TERMINATED, 128 + signum, f"terminated by {name}")
        if self._armed:
            self._armed = False
            self.fired = interrupted  # remembered: a job that swallows it still ends this way
            raise interrupted
        if self.pending is None:
            self.pending = interrupted

    def install(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _reinstall(self) -> None:
        # A job may have put in handlers of its own; ours must guard the record that follows.
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
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
                signal.setitimer(signal.ITIMER_REAL, timeout)
            yield
        finally:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._reinstall()
        if self.fired is not None:  # the job caught our interruption and returned anyway
            raise self.fired


class Heartbeat:
    """Refreshes the claim's heartbeat from a thread, so another host can tell we are alive."""

    def __init__(self, run: JobRun, interval: float):
        self.run, self.interval = run, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="cronops-heartbeat")

    def _beat(self):
        try:
            while not self._stop.wait(self.interval):
                try:
                    if not claims.heartbeat(self.run, timezone.now()):
                        say(
                            f"job {self.run.job}: this run no longer owns its claim on "
                            f"{self.run.slot} (another host took it over: check the clocks)",
                            sys.stderr,
                        )
                except DatabaseError as exc:
                    say(f"job {self.run.job}: heartbeat failed: {_one_line(exc)}", sys.stderr)
        finally:
            connection.close()

    def __enter__(self):
        if self.run.slot:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class Runner:
    def __init__(self, plan: Plan, *, stdout=None, stderr=None):
        self.plan = plan
        self.opts = plan.options
        self.host = settings.OPS_HOST
        self.pid = os.getpid()
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.ping_config = PingConfig.from_settings()
        self.guard = Guard()
        self.stop = False  # set by a timeout, a signal or a lost database: no further slots

    def pinger(self) -> Pinger:
        return Pinger(
            self.ping_config, self.plan.name, override=self.opts.ping, enabled=not self.opts.no_ping
        )

    def skip(self, slot: Slot | None, note: str, exit_code: int) -> int:
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
        self.pinger().log(note)
        return exit_code

    def run(self) -> int:
        now = timezone.now()
        lock = JobLock(
            settings.OPS_LOCK_DIR,
            self.plan.name,
            host=self.host,
            since=timezone.localtime(now).strftime("%Y-%m-%d %H:%M:%S %Z"),
        )
        # The lock comes before the guard: a SIGTERM during --wait ends the wait at once
        # (nothing is claimed yet, there is nothing to record).
        if not lock.acquire(self.opts.wait):
            holder = lock.holder()
            return self.skip(None, f"skipped: {holder.describe()}", EXIT_SKIPPED)
        self.guard.install()
        try:
            return self._run(now)
        finally:
            self.guard.uninstall()
            lock.release()

    def _run(self, now: dt.datetime) -> int:
        tz = ZoneInfo(settings.TIME_ZONE)
        slots = plan_slots(self.plan, now, tz)
        exit_code = 0
        for slot in slots:
            if self.guard.pending is not None:  # a signal between two slots
                pending = self.guard.pending
                say(f"job {self.plan.name}: {pending.note}", self.stderr)
                return pending.exit_code
            code = self.run_slot(slot)
            if code and not exit_code:
                exit_code = code  # the first failure's code, also when a later slot succeeds
            if self.stop:
                break
        if self.guard.pending is not None:  # arrived while recording or pinging
            exit_code = self.guard.pending.exit_code
        return exit_code

    def run_slot(self, slot: Slot | None) -> int:
        name, now = self.plan.name, timezone.now()
        if slot is not None:
            result = claims.claim(
                name,
                slot,
                host=self.host,
                pid=self.pid,
                now=now,
                force=bool(self.opts.force),
                stale_after=claims.STALE_HEARTBEATS * settings.OPS_HEARTBEAT_SECONDS,
                command=self.opts.command,
            )
            if result.status == "done":
                return self.skip(slot, f"already done for {slot}", 0)
            if result.status == "busy":
                holder = result.holder
                since = timezone.localtime(holder.started_at).strftime("%Y-%m-%d %H:%M:%S %Z")
                return self.skip(
                    slot,
                    f"skipped: running since {since}, pid {holder.pid}, host {holder.host}",
                    EXIT_SKIPPED,
                )
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
        return self.execute_run(run, slot)

    def execute_run(self, run: JobRun, slot: Slot | None) -> int:
        pinger = self.pinger()
        run.rid = pinger.rid
        try:
            args = command_line(self.plan, slot)
        except Exception:  # the command cannot even load: execute() meets it and records it
            args = list(self.opts.args)
        run.command = " ".join([self.opts.command, *args])[:500]
        pinger.start()
        tail = Tail(TAIL_BYTES)
        captured = CapturedOutput(tail, quiet=bool(self.opts.quiet))
        started = time.monotonic()
        outcome, note = Outcome.SUCCEEDED, ""
        try:
            with Heartbeat(run, settings.OPS_HEARTBEAT_SECONDS), captured:
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
        if outcome == Outcome.SUCCEEDED and exit_code != 0:
            outcome = Outcome.FAILED
        if exit_code and self.opts.quiet:
            captured.replay()
        captured.close()
        lost_output = captured.loss_note()
        if outcome in (Outcome.TIMED_OUT, Outcome.TERMINATED):
            say(f"job {self.plan.name}: {note}", self.stderr)
            self.stop = True
        if lost_output:
            # The log's disk is full (or the reader is gone). The job's outcome stands (a done
            # slot must not run again), but the history notes it and the ping fails so that
            # monitoring says something is wrong on this host.
            say(f"error: job {self.plan.name}: {lost_output}", self.stderr)
            note = f"{note}; {lost_output}" if note else lost_output
        kind = "fail" if outcome in (Outcome.TIMED_OUT, Outcome.TERMINATED) else None
        if lost_output:
            kind = "fail"
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
        body = b"" if self.opts.no_output_in_ping else tail.text().encode()
        head = f"cronops: {note}\n".encode() if note else b""
        pinger.finish(exit_code, body, kind=kind, head=head)
        return exit_code

    def record(self, run, outcome, exit_code, duration, note, tail: Tail) -> str:
        """Save the outcome; "" when saved, else why not (one line)."""
        run.outcome, run.exit_code, run.note = outcome, exit_code, note[:300]
        run.finished_at = timezone.now()
        run.duration = duration
        run.output_tail = tail.text(HISTORY_TAIL_BYTES)
        for attempt in (1, 2):
            try:
                run.save()
                if run.slot:
                    claims.release(run)
                return ""
            except DatabaseError as exc:
                if attempt == 1:
                    connection.close()  # the job may have broken the connection: retry once
                    continue
                return _one_line(exc)
        return ""


def run(argv: list[str], *, stdout=None, stderr=None) -> int:
    """Run `argv` (run_job's arguments) and return the exit code."""
    stderr = stderr or sys.stderr
    plan = None
    try:
        plan = resolve(argv, stderr)
        runner = Runner(plan, stdout=stdout, stderr=stderr)
        return runner.run()
    except UsageError as exc:
        say(f"error: {exc}", stderr)
        return EXIT_USAGE
    except LockError as exc:
        # The lock directory cannot be used (read-only or full file system, permissions):
        # nothing can run on this host until it is fixed, so monitoring hears about it.
        say(f"error: {exc}", stderr)
        _fail_ping(plan, argv, str(exc))
        return 1
    except DatabaseError as exc:
        say(f"error: database unavailable: {_one_line(exc)}", stderr)
        _fail_ping(plan, argv, f"database unavailable: {_one_line(exc)}")
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
    pinger.finish(None, f"cronops: {message}\n".encode(), kind="fail")
