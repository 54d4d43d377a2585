"""run_job: one call, in order: lock, claim, fork the job and supervise it, record, final ping.

`run(argv)` is what `manage.py run_job` calls; it returns the exit code (DESIGN.md's table).
The job itself runs in a forked child (ops/run/supervisor.py, ops/run/child.py): this process
never runs job code, so its heartbeat, its timeout and its record cannot be stopped by it.
"""

import contextlib
import datetime as dt
import os
import signal
import sys
import time
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from .. import conf, schema
from ..control import actions, pauses
from ..models import JobRun, Outcome
from ..monitors import monitors
from ..monitors.monitors import RunMonitors
from ..monitors.redact import Redactor
from ..schedule.durations import human_duration
from ..schedule.options import DEFAULT_KILL_AFTER
from ..schedule.slots import Slot
from . import claims, descendants, patience, process, standby
from .failure import explain as explain_failure
from .heartbeat import ClaimKeeper, taken_over
from .lock import JobLock, LockError
from .loghead import write as write_header
from .origin import detect as detect_origin
from .outbox import OUTBOX
from .output import JobLog, Tail, Tee, log_option, settle, standard_streams
from .plan import (
    Plan,
    UsageError,
    command_line,
    could_not_start,
    env_file_usable,
    one_line,
    outside_transactions,
    plan_slots,
    resolve,
    say,
)
from .signals import Interrupted, Signals
from .supervisor import Ended, Supervisor, fork_job

if TYPE_CHECKING:
    from .enqueue import Pending
    from .retries import Attempts

EXIT_SKIPPED = 75  # also a run whose claim was taken over: the slot is another run's now
EXIT_TIMEOUT = 124
EXIT_USAGE = 2
TAIL_BYTES = 100_000  # hosted healthchecks keeps 100,000 bytes of a ping body
HISTORY_TAIL_BYTES = 10_000
# Outcomes that end with one line saying why on stderr.
SAID = (Outcome.FAILED, Outcome.TIMED_OUT, Outcome.TERMINATED, Outcome.WAITING, Outcome.BLOCKED)
OUTPUT_GRACE = 2.0  # seconds the output pipes may stay open after the job's end


class Runner:
    def __init__(self, plan: Plan, *, stdout=None, stderr=None, log_problem="", logged=False):
        self.plan = plan
        self.log_problem = log_problem  # why --log could not be opened, or ""
        self.logged = logged  # fds 1 and 2 are the --log file: each run gets a header line there
        self.opts = plan.options
        self.host = conf.host()
        # Read (and so validated) before anything is claimed: a bad value is exit 2, no trace.
        self.heartbeat = conf.heartbeat_seconds()
        self.pid = os.getpid()
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.monitor_configs = monitors.Configs.from_settings()
        self.redactor = Redactor.from_settings(settings)
        self.kill_after = plan.options.kill_after or DEFAULT_KILL_AFTER
        self.signals = Signals()  # installed from the lock on (run())
        self.lock_fd: int | None = None  # the job's lock: the job does not inherit it
        self.keeper: ClaimKeeper | None = None  # the current slot's heartbeat (heartbeat.py)
        self.stop = False  # set by a timeout, a signal or a lost database: no further slots
        # Catch-up slots send no pings of their own (hosted healthchecks.io drops more than 5
        # pings a minute per check); the last slot's final ping sums them up.
        self.caught_up: list[str] = []
        self.summarised = False
        self.catch_up_failure = 0  # the exit code of this call's first failed catch-up slot
        # How long this call stands by for a busy slot (None: it does not); from the lock on.
        self.standby = standby.run_bound(plan.options, self.heartbeat)
        self.standby_deadline = time.monotonic() + (self.standby or 0)
        self.claim_wait = ""  # what the claim step waits for, once it waits (claimstep.py)
        self.action = actions.from_environment()  # started from the jobs page (who, and why)
        self.origin = detect_origin(self.action)  # cron, by hand, the jobs page (origin.py)
        self.attempts: Attempts | None = None  # the current slot's (--retries)
        self.pending_enqueue: Pending | None = None  # written with the record (enqueue.py)

    def monitors(self, enabled: bool = True) -> RunMonitors:
        """The monitors of one run (ops/monitors/monitors.py): healthchecks.io and Sentry."""
        return monitors.for_run(
            self.monitor_configs,
            self.plan.name,
            self.plan.job,
            ping=self.opts.ping,
            no_ping=bool(self.opts.no_ping),
            tz=settings.TIME_ZONE,
            enabled=enabled,
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
        try:
            run = self.write(lambda: claims.new_skip(self, slot, note, exit_code, now, catch_up))
            self.write(lambda: actions.attach(self.action, run))
        except patience.Locked as locked:
            run = None
            say(f"error: job {self.plan.name}: {locked}: this skip is not recorded", self.stderr)
        if exit_code or not self.opts.quiet:
            write_header(self, run, printed=True)
            say(f"job {self.plan.name}: {note}", self.stdout)
        if catch_up:
            self.caught_up.append(f"{slot}: {note}")
        elif ping:
            self.monitors().log(note)
        return exit_code

    def write(self, write, *, outcome: bool = False, interruptible: bool = False):
        """One of run_job's own writes, waiting for another writer's lock up to LOCK_WAIT
        (ops/run/patience.py); after a signal that ends the run, one try, unless it records a
        job's outcome (which may stand: a signal that came after the job ended). An
        `interruptible` wait (a paused fire's, before anything is claimed) ends at a signal:
        Interrupted."""
        bound = patience.LOCK_WAIT if self.signals.received is None or outcome else 0.0
        sleep = self.signals.sleep if interruptible else lambda s: self.signals.wait([], s)

        def waiting(reason: str, bound: float) -> None:
            say(
                f"job {self.plan.name}: {reason}; waiting for it to write its record (at most "
                f"{human_duration(bound)})",
                self.stderr,
            )

        return patience.patiently(write, sleep=sleep, bound=bound, waiting=waiting)

    def send_summary(self, exit_code: int) -> None:
        """A final ping for catch-up slots when no slot of this call sent one (the current slot
        was a skip, or a timeout or signal ended the call early)."""
        if self.caught_up and not self.summarised:
            code = self.catch_up_failure or exit_code
            code = 0 if code == EXIT_SKIPPED else code  # a busy current slot is no failure
            self.monitors().finish(code, b"", head=self.catch_up_head())

    def run(self) -> int:
        now = timezone.now()
        # A paused job runs nothing (ops/control/pauses.py). Its writes wait for another writer
        # (SQLite's one writer) as the run's do; a SIGTERM or SIGINT ends that wait at once.
        self.signals.install()
        try:
            paused = pauses.at_fire(self, now)
        except Interrupted as interrupted:
            say(
                f"job {self.plan.name}: {interrupted} while waiting for another writer to "
                "record its pause: nothing was run or recorded",
                self.stderr,
            )
            return interrupted.exit_code
        finally:
            self.signals.uninstall()
        if paused is not None:
            return paused
        lock = JobLock(
            conf.lock_dir(),
            self.plan.name,
            host=self.host,
            since=timezone.localtime(now).strftime("%Y-%m-%d %H:%M:%S %Z"),
        )
        # The lock comes before the signal handlers: a SIGTERM during --wait ends the wait at
        # once (nothing is claimed yet, there is nothing to record).
        try:
            acquired = lock.acquire(self.opts.wait)
        except KeyboardInterrupt:  # SIGINT (Ctrl-C) while waiting for the lock
            say(f"job {self.plan.name}: interrupted while waiting for its lock", self.stderr)
            return 128 + signal.SIGINT
        if not acquired:
            holder = lock.holder()
            return self.skip(None, f"skipped: {holder.describe()}", EXIT_SKIPPED)
        self.lock_fd = lock.fd
        # The standby's bound counts from here: a --wait for the lock does not use it up.
        self.standby_deadline = time.monotonic() + (self.standby or 0)
        self.signals.install()
        # Orphaned grandchildren of the command reparent to run_job (ops/run/descendants.py).
        subreaper = descendants.set_subreaper(True)
        try:
            return self._run(now)
        finally:
            if subreaper is False:  # an in-process caller's state comes back
                descendants.set_subreaper(False)
            self.signals.uninstall()
            lock.release()

    @property
    def lost_claim(self) -> str | None:
        """Why the current slot's claim is no longer this run's (its heartbeat found it), or
        None."""
        return self.keeper.lost if self.keeper is not None else None

    def terminated(self) -> Ended | None:
        """A SIGTERM or SIGINT run_job received, as the outcome it gives."""
        received = self.signals.received
        if received is None:
            return None
        return Ended(Outcome.TERMINATED, 128 + received, Interrupted(received).args[0])

    def _run(self, now: dt.datetime) -> int:
        tz = ZoneInfo(settings.TIME_ZONE)
        slots = plan_slots(self.plan, now, tz)
        exit_code = 0
        for i, slot in enumerate(slots):
            if i and (pending := self.terminated()) is not None:  # a signal between two slots
                say(f"job {self.plan.name}: {pending.note}", self.stderr)
                self.send_summary(pending.exit_code)
                return pending.exit_code
            code = self.run_slot(slot, catch_up=i < len(slots) - 1)
            if code and not exit_code:
                exit_code = code  # the first failure's code, also when a later slot succeeds
            if self.stop:
                break
        pending = self.terminated()
        if pending is not None and not self.stop:
            # After the job had ended (recording, pinging): the outcome is the job's; it stands.
            say(f"job {self.plan.name}: {pending.note} after the job had ended", self.stderr)
        self.send_summary(exit_code)
        return exit_code

    def run_slot(self, slot: Slot | None, catch_up: bool = False) -> int:
        if slot is not None:
            from . import claimstep  # a slot's: an ad hoc run has none

            result = claimstep.claim_slot(self, slot, catch_up)
            if isinstance(result, int):  # done, busy, or a wait that ended: recorded
                return result
            run = result.taken
        else:
            now = timezone.now()
            run = self.write(
                lambda: claims.new_run(
                    self.plan.name,
                    None,
                    host=self.host,
                    pid=self.pid,
                    now=now,
                    command=self.opts.command,
                    **self.origin.fields(),
                )
            )
        # The claim is kept alive from here until its outcome is written (conclude), whatever
        # the run does in between; a beat that finds it taken over wakes the main thread.
        self.keeper = ClaimKeeper(run, self.heartbeat, lambda note: self.signals.wake())
        with self.keeper:
            return self.execute_run(run, slot, catch_up=catch_up)

    def execute_run(self, run: JobRun, slot: Slot | None, catch_up: bool = False) -> int:
        try:
            if self.action is not None:  # started from the jobs page (a cron fire writes none)
                self.write(lambda: actions.attach(self.action, run))
        except patience.Locked as locked:  # who started it goes unsaid; the run goes on
            say(f"job {self.plan.name}: {locked}: the run's starter is not recorded", self.stderr)
        write_header(self, run)  # --quiet: before what a failure prints (conclude)
        watch = self.monitors(enabled=not catch_up)  # one rid, one start for all attempts
        self.attempts = None  # --retries' and --after's modules: only for a run that has them
        if self.opts.retries:
            from . import retries

            self.attempts = retries.Attempts.of(self)
        run.rid = watch.rid
        ended: Ended | None = None
        if self.opts.after and slot is not None:  # upstream jobs first (ops/run/after.py)
            from . import after

            ended = after.gate(self, run, slot, now=timezone.now(), catch_up=catch_up)
            run.started_at = timezone.now()  # the wait is not the job's
        while ended is None:
            # The history and the admin show the command line: a secret passed as an argument
            # is not kept there (the admin's search box would let anyone test guesses at it).
            run.command = self.redactor.text(" ".join([self.opts.command, *self.opts.args]))[:500]
            tail = Tail(TAIL_BYTES, redactor=self.redactor)
            tee = Tee(tail, quiet=bool(self.opts.quiet))
            started = time.monotonic()
            ended = self.terminated()  # a signal while the slot was claimed: the job never starts
            if ended is None:
                ended = (
                    self._enqueue(run, slot)
                    if self.opts.enqueue
                    else self.supervise(run, slot, tee, watch)
                )
            if ended.command:
                run.command = self.redactor.text(ended.command)[:500]
            duration = time.monotonic() - started
            if self.attempts is None:  # one attempt
                break
            from . import retries

            following = retries.next_attempt(
                self, self.attempts, run, slot, ended, duration, tail.text(HISTORY_TAIL_BYTES),
                now=timezone.now(),
            )  # fmt: skip
            if following is None:
                break
            tee.close()  # a retried attempt's output is in its history row (and was printed)
            run, wait = following
            waited = retries.wait_to_retry(self, wait)
            if waited is not None:  # a signal, or the claim lost: the next attempt never starts
                tee = Tee(Tail(TAIL_BYTES, redactor=self.redactor), quiet=bool(self.opts.quiet))
                ended, duration = waited, 0.0
                break
            run.started_at, ended = timezone.now(), None
            write_header(self, run)
        else:  # the slot never ran: waiting for (or blocked by) an upstream, or a signal
            tee, duration = Tee(Tail(TAIL_BYTES, redactor=self.redactor)), 0.0
        assert ended is not None
        return self.conclude(run, slot, ended, duration, tee, watch, catch_up)

    def supervise(self, run: JobRun, slot: Slot | None, tee: Tee, watch: RunMonitors) -> Ended:
        """Fork the job (ops/run/supervisor.py) and see it to its end: its output teed, its
        heartbeat and start ping sent from here, what it left running ended."""
        held = claims.held_fields(run)  # the job makes its HeldClaim, if it asks
        before = frozenset(descendants.children_of(os.getpid()))  # not the job's: never ended
        assert self.keeper is not None
        OUTBOX.quiesce()  # the child then inherits one thread, usually (supervisor.fork_job)
        try:
            with self.keeper.paused():
                child = fork_job(
                    self.opts.command,
                    lambda: command_line(self.plan, slot),
                    claims.environment(held, process.identify()),
                    held,
                    self.signals,
                    not_inherited=(*self.signals.fds, *([self.lock_fd] if self.lock_fd else [])),
                )
        except OSError as exc:
            return Ended(Outcome.FAILED, 1, f"could not start the job: {exc.strerror or exc}")
        if child is None:  # a signal came just before the fork: the job never started
            terminated = self.terminated()
            assert terminated is not None
            return terminated
        keeper = self.keeper
        supervisor = Supervisor(
            child,
            self.signals,
            timeout=self.opts.timeout,
            kill_after=self.kill_after,
            exclude=before,
            lost=lambda: keeper.lost,
        )
        unwatched = ""
        try:
            try:
                tee.start(child.stdout, child.stderr)
            except RuntimeError as exc:  # a process limit: nothing can read its output
                unwatched = f"could not read the job's output ({exc}): the job was stopped"
                supervisor.stop(signal.SIGKILL)
            watch.start()
            supervisor.wait()
        finally:
            self.signals.job = None
        ended = supervisor.ended()
        if unwatched:
            ended = Ended(Outcome.FAILED, 1, unwatched, ended.command)
        supervisor.close()
        # Before the claim is released: they must not overlap a rerun.
        descendants.end_leftovers(self.plan.name, before, self.kill_after, self.stderr)
        tee.finish(OUTPUT_GRACE)
        return ended

    def conclude(
        self,
        run: JobRun,
        slot: Slot | None,
        ended: Ended,
        duration: float,
        tee: Tee,
        watch: RunMonitors,
        catch_up: bool,
    ) -> int:
        """Record the outcome, then the final ping (or, in catch-up, its line of the summary)."""
        outcome, exit_code, note, tail = ended.outcome, ended.exit_code, ended.note, tee.tail
        if exit_code and self.opts.quiet:
            write_header(self, run, printed=True)
            tee.replay()
        tee.settle()  # bounded: a reader that stopped reading costs output, not the record
        tee.close()
        lost_output = tee.loss_note()
        told = self.signals.received is not None and outcome == Outcome.SUCCEEDED  # then done
        # A failure says why: the last line the job wrote to stderr (ops/run/failure.py).
        line, note = explain_failure(ended, tee.last_err.text(self.redactor))
        if outcome in SAID or (told and note):
            say(f"job {self.plan.name}: {line}", self.stderr)
            self.stop = self.stop or told or outcome in (Outcome.TIMED_OUT, Outcome.TERMINATED)
        if outcome == Outcome.TAKEN_OVER:  # the heartbeat thread said so already
            note += "; the job was stopped"
        # Timeouts and signals ping their exit code (/124, /143, /130); a slot waiting for its
        # upstream is no failure (/log), one blocked by a failed upstream is (/fail).
        kind = (
            "log" if outcome == Outcome.WAITING else "fail" if outcome == Outcome.BLOCKED else None
        )
        if lost_output:
            # The log's disk is full (or the reader is gone). The job's outcome stands (a done
            # slot must not run again), but the history notes it and the ping is /fail (its
            # exit status, 0, would say success) so that monitoring says something is wrong.
            say(f"error: job {self.plan.name}: {lost_output}", self.stderr)
            note = f"{note}; {lost_output}" if note else lost_output
            kind = "fail"
        if tee.spool_problem:  # the output is not lost, only no longer quiet
            say(f"job {self.plan.name}: {tee.spool_problem}", self.stderr)
            note = f"{note}; {tee.spool_problem}" if note else tee.spool_problem
        if self.log_problem:  # said on cron's stderr at the start; monitoring hears it too
            note = f"{note}; {self.log_problem}" if note else self.log_problem
            kind = "fail"
        if self.attempts is not None and (said := self.attempts.head(outcome)):
            note = f"{said}; {note}" if note else said
            ended_by_us = outcome in (Outcome.TIMED_OUT, Outcome.TERMINATED)  # said above
            if not ended_by_us and (not self.opts.quiet or exit_code):
                say(f"job {self.plan.name}: {said}", self.stderr if exit_code else self.stdout)
        note = self.redactor.text(note)  # an error line may quote a secret
        if self.keeper is not None:
            self.keeper.recording()  # beats go on; a takeover now is the record's to report
        lost = self.record(run, outcome, exit_code, duration, note, tail)
        if self.keeper is not None:
            self.keeper.stop()  # the outcome is on the claim (or could not be written)
        if lost:
            # The database went away during the run: the outcome exists nowhere but here, so
            # say so once, fail the ping and the exit code; the claim stays "running" and the
            # next run records this attempt as abandoned and runs the slot again.
            what = f"could not record the outcome ({outcome}, exit {exit_code})"
            if lost.startswith("database unavailable: "):
                note = lost.replace(": ", f": {what}: ", 1)
            else:  # another writer held the database for the whole bound
                note = f"{lost}: {what}"
            say(f"error: job {self.plan.name}: {note}", self.stderr)
            exit_code, kind, self.stop = exit_code or 1, "fail", True
        elif run.outcome == Outcome.TAKEN_OVER:
            # The slot is another run's now: its outcome is the slot's. Not a success, not a
            # failure to alert on (the new holder pings its own); no further slots here.
            outcome, exit_code, note, kind = run.outcome, EXIT_SKIPPED, run.note, "log"
            self.stop = True
        elif run.outcome != outcome:  # its enqueue failed inside the record (enqueue.py)
            outcome, exit_code, note = run.outcome, run.exit_code or 1, run.note
            say(f"error: job {self.plan.name}: {note}", self.stderr)
        elif self.opts.enqueue:
            from . import enqueue

            if not self.opts.quiet:
                say(f"job {self.plan.name}: {run.note}", self.stdout)  # "enqueued … as <id>"
            exit_code, said = enqueue.follow(self, run, exit_code, catch_up)  # --wait-result
            if said:
                say(f"job {self.plan.name}: {said}", self.stderr if exit_code else self.stdout)
                note, kind = f"{run.note}; {said}", "log" if exit_code == EXIT_SKIPPED else None
        if catch_up:
            if outcome != Outcome.WAITING:  # a slot still waiting for its upstream is due
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
        watch.finish(
            self.catch_up_failure or exit_code,
            body,
            kind=kind,
            head=head,
            written=tail.total,
            cut=cut,
        )
        return exit_code

    def _enqueue(self, run: JobRun, slot: Slot | None) -> Ended:
        from . import enqueue  # only for --enqueue: a run's start-up stays lean

        return enqueue.put(self, run, slot)

    def record(self, run, outcome, exit_code, duration, note, tail: Tail) -> str:
        """Save the outcome; "" when saved, else why not (one line)."""
        run.outcome, run.exit_code, run.note = outcome, exit_code, note[:300]
        run.finished_at = timezone.now()
        run.duration = duration
        run.output_tail = tail.text(HISTORY_TAIL_BYTES)

        def save() -> None:
            with transaction.atomic():
                patience.in_transaction()
                # Fenced: the outcome goes onto the claim only while the claim is ours.
                undo = None
                if self.pending_enqueue is not None:  # commits with the claim's success
                    from . import enqueue

                    undo = enqueue.inside_record(self.pending_enqueue, run)
                kept = None  # a --force run that never ran (--after's) keeps a success
                if self.opts.after:
                    from .after import kept_state

                    kept = kept_state(run)
                if run.slot and run.outcome != Outcome.TAKEN_OVER and not claims.release(run, kept):
                    if undo is not None:
                        undo()  # the new holder enqueues the slot's task
                    taken_over(run, said=bool(self.lost_claim), stderr=self.stderr)
                run.save()

        for attempt in (1, 2):
            try:
                self.write(save, outcome=True)
                return ""
            except patience.Locked as locked:
                return str(locked)
            except DatabaseError as exc:
                if attempt == 1:
                    connection.close()  # a server restart meanwhile: retry once, afresh
                    continue
                return f"database unavailable: {one_line(exc)}"
        return ""


def run(argv: list[str], *, stdout=None, stderr=None) -> int:
    """Run `argv` (run_job's arguments) and return the exit code."""
    # --log first, before anything prints: every line of this run belongs in it.
    log = JobLog(log_option(argv))
    standard_streams()
    if log.problem:
        say(f"error: {log.problem}", stderr or sys.stderr)
    try:
        logged = log.path is not None and not log.problem
        return _run(argv, stdout=stdout, stderr=stderr, log_problem=log.problem, logged=logged)
    finally:
        # The record and the final ping are done, the lock released: what is still queued for
        # a slow reader is written now, before the log's descriptors are put back (Ctrl-C
        # gives the rest up).
        with contextlib.suppress(KeyboardInterrupt):
            OUTBOX.flush()
        log.close()
        settle()  # nothing unwritable left in sys.stdout/sys.stderr for the flush at exit


def exit_now(code: int) -> None:
    """End run_job's process with `code`, without the interpreter's slow shutdown (its garbage
    collection and module teardown cost about a quarter of a fire's CPU): what it printed is
    flushed, its database connections closed."""
    settle()
    connections.close_all()
    os._exit(code)


def _run(argv: list[str], *, stdout=None, stderr=None, log_problem="", logged=False) -> int:
    stderr = stderr or sys.stderr
    plan = None
    try:
        env_file_usable()
        outside_transactions()
        plan = resolve(argv, stderr, now=timezone.now())
        runner = Runner(plan, stdout=stdout, stderr=stderr, log_problem=log_problem, logged=logged)
        return runner.run()
    except (UsageError, ImproperlyConfigured) as exc:  # or a cronops setting's value: one line
        say(f"error: {exc}", stderr)
        return EXIT_USAGE
    except (LockError, patience.Locked) as exc:
        # The lock directory cannot be used (read-only or full file system, permissions), or
        # another writer held the database for the whole bound: nothing can run on this host
        # until it is fixed, so monitoring hears about it.
        say(f"error: {exc}", stderr)
        could_not_start(plan, argv, str(exc))
        return 1
    except DatabaseError as exc:
        # The tables missing (migrate forgotten) or the database unreachable: told apart from
        # the error alone, on this path only (ops/schema.py).
        message = schema.explained(exc) or f"database unavailable: {one_line(exc)}"
        say(f"error: {message}", stderr)
        could_not_start(plan, argv, message)
        return 1
