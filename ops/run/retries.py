"""--retries: a failed attempt at a slot is run again, within the same claim.

An attempt that failed (a non-zero exit, an exception, a crash, `--timeout`) is retried while
attempts are left (`--retries=N`: N more), its exit code is one `--retry-on` names (when
given), and the next attempt can begin before the job's next fire time. A signal to run_job
(SIGTERM, SIGINT, SIGHUP) is never retried, nor a claim taken over.

Each attempt is its own row of the history (`JobRun.attempt`), with its exit code and output
tail. Before the wait, the failed attempt is recorded and the next attempt's row is created
("running") and put on the claim, in one transaction: the claim stays running, heartbeating
through the wait, so no other run (another server's) takes the slot meanwhile, and job_status
sees the slot as running, not failing. The wait (the backoff) doubles from `--retry-delay`
(default 1m), with up to 10 % jitter so that jobs failing together do not retry together; a
single wait is at most MAX_BACKOFF, and no attempt is started that would begin at or after the
job's next fire time. A signal during the wait ends it at once: the waiting attempt is recorded
as terminated (128+N), never started.
"""

import datetime as dt
import random
import time
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import DatabaseError, transaction

from ..models import JobRun, Outcome
from ..schedule.durations import human_duration
from ..schedule.options import DEFAULT_AFTER_WAIT, DEFAULT_RETRY_DELAY, RunOptions
from ..schedule.slots import Slot, next_fire
from ..values import Value, field
from . import claims, patience
from .plan import say
from .supervisor import EXIT_SKIPPED, Ended

if TYPE_CHECKING:
    from .runner import Runner

MAX_BACKOFF = 3600.0  # seconds: the longest single wait between two attempts
JITTER = 0.1  # a wait is its doubled delay plus up to this fraction of it
RETRIED = (Outcome.FAILED, Outcome.TIMED_OUT)


def backoff(attempt: int, delay: float, rand=random.random) -> float:
    """Seconds to wait after failed attempt `attempt` (1, 2, ...): `delay` doubled for each
    earlier retry, plus jitter, at most MAX_BACKOFF."""
    base = delay * 2 ** min(attempt - 1, 30)
    return min(base * (1 + JITTER * rand()), MAX_BACKOFF)


def longest_run(opts: "RunOptions", per_attempt: float) -> float:
    """Seconds a run of one slot may take when each attempt takes `per_attempt`: every attempt
    (--retries), the longest waits between them, --after's wait before them and --wait-result's
    after them. The grace job_status and healthchecks.io give a job, and a CronJob's deadline,
    are built on it."""
    attempts = 1 + (opts.retries or 0)
    delay = opts.retry_delay if opts.retry_delay is not None else DEFAULT_RETRY_DELAY
    waits = sum(backoff(k, delay, rand=lambda: 1.0) for k in range(1, attempts))
    after = (opts.after_wait or DEFAULT_AFTER_WAIT) if opts.after else 0.0
    result = opts.wait_result or 0.0  # an enqueued task's, after the record
    return per_attempt * attempts + waits + after + result


class Attempts(Value):
    """The attempts of one slot within one run_job call."""

    limit: int  # --retries: attempts after the first
    delay: float
    codes: tuple[int, ...] | None
    number: int = 1  # the attempt running now
    earlier: list[int] = field(default_factory=list)  # exit codes of the failed ones

    @classmethod
    def of(cls, runner: "Runner") -> "Attempts":
        opts = runner.opts
        delay = opts.retry_delay if opts.retry_delay is not None else DEFAULT_RETRY_DELAY
        return cls(limit=opts.retries or 0, delay=delay, codes=opts.retry_on)

    @property
    def total(self) -> int:
        return self.limit + 1

    def why_not(self, ended: Ended, signalled: bool) -> str | None:
        """None when `ended` is retried; else "" (nothing to say) or why not, in a few words."""
        if ended.outcome not in RETRIED or signalled or self.number > self.limit:
            return ""
        if self.codes is not None and ended.exit_code not in self.codes:
            codes = ",".join(map(str, self.codes))
            return f"exit {ended.exit_code} is not retried (--retry-on={codes})"
        return None

    def head(self, outcome: str) -> str:
        """The final ping's and the history's words on the earlier attempts ("" for none)."""
        if self.number == 1:
            return ""
        codes = ", ".join(f"exit {c}" for c in self.earlier)
        return f"{outcome} at attempt {self.number} of {self.total}; earlier attempts: {codes}"


def fire_bound(runner: "Runner", now: dt.datetime) -> dt.datetime | None:
    """The job's next fire time after `now`: no attempt starts at or after it."""
    expr = runner.plan.job.cron_expr if runner.plan.job else None
    if expr is None:
        return None
    return next_fire(expr, now, ZoneInfo(settings.TIME_ZONE))


def next_attempt(
    runner: "Runner",
    attempts: Attempts,
    run: JobRun,
    slot: Slot | None,
    ended: Ended,
    duration: float,
    tail_text: str,
    *,
    now: dt.datetime,
) -> tuple[JobRun, float] | None:
    """After a failed attempt: (the next attempt's row, seconds to wait first), with the failed
    attempt recorded and the claim moved to the new row; None when it is not retried (the
    caller concludes the run with `ended`)."""
    why = attempts.why_not(ended, runner.signals.received is not None)
    if why is None:
        wait = backoff(attempts.number, attempts.delay)
        bound = fire_bound(runner, now)
        if bound is not None and now + dt.timedelta(seconds=wait) >= bound:
            when = bound.astimezone(ZoneInfo(settings.TIME_ZONE)).strftime("%Y-%m-%d %H:%M %Z")
            why = f"no retry: the next fire ({when}) comes before attempt {attempts.number + 1}"
    if why is not None:
        if why:
            say(f"job {runner.plan.name}: {why}", runner.stderr)
        return None
    failed_note = ended.note or f"exit {ended.exit_code}"
    run.outcome, run.exit_code = ended.outcome, ended.exit_code
    run.note = runner.redactor.text(
        f"attempt {attempts.number} of {attempts.total}: {failed_note}; retried"
    )[:300]
    run.finished_at, run.duration, run.output_tail = now, duration, tail_text

    def switch() -> JobRun | None:
        with transaction.atomic():
            patience.in_transaction()
            following = claims.new_run(
                run.job, slot, host=runner.host, pid=runner.pid, now=now, command=run.command,
                attempt=attempts.number + 1, rid=run.rid,
                **runner.origin.fields(attempt=attempts.number + 1),
            )  # fmt: skip
            # The claim moves to the next attempt only while it is still ours.
            if run.slot and not claims.pass_on(run, following):
                transaction.set_rollback(True)
                return None
            run.save()
        return following

    try:
        following = runner.write(switch, outcome=True)
    except (patience.Locked, DatabaseError) as exc:
        say(f"job {runner.plan.name}: no retry: could not record attempt: {exc}", runner.stderr)
        return None
    if following is None:  # taken over: the caller records this attempt as such
        return None
    attempts.earlier.append(ended.exit_code)
    attempts.number += 1
    if not runner.opts.quiet:  # --quiet: a failure a retry fixes mails nobody
        say(
            f"job {runner.plan.name}: attempt {attempts.number - 1} of {attempts.total} failed "
            f"(exit {ended.exit_code}); attempt {attempts.number} in {human_duration(wait)}",
            runner.stderr,
        )
    return following, wait


def wait_to_retry(runner: "Runner", seconds: float) -> Ended | None:
    """The backoff before the next attempt (the claim heartbeats meanwhile); None when it
    passed, else how the run ends instead (a signal, the claim taken over)."""
    deadline = time.monotonic() + seconds
    while runner.lost_claim is None and runner.signals.received is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        runner.signals.wait([], left)
    if (lost := runner.lost_claim) is not None:
        return Ended(Outcome.TAKEN_OVER, EXIT_SKIPPED, lost)
    ended = runner.terminated()
    assert ended is not None
    return Ended(ended.outcome, ended.exit_code, f"{ended.note} while waiting to retry")
