from collections.abc import Callable, Sequence
from typing import TypeVar

from django.db import models

from .checkgate import model_check

SLOT_KEY_LENGTH = 32  # "2026-10-25 02:30+02:00" is 22; an offset with seconds adds 3


class Outcome:
    """A run's (and a claim's) outcome. Plain strings, not a TextChoices: an enum class costs
    every command of the project ~1 M instructions to build (bench/RESULTS.md, P9)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    TERMINATED = "terminated"
    ABANDONED = "abandoned"
    SKIPPED = "skipped"
    # This run lost its claim while frozen or cut off from the database, and another run took
    # the slot over: the slot's outcome is that run's, never this one's (docs/several-servers.md).
    TAKEN_OVER = "taken_over"
    # --after (ops/run/after.py): an upstream job had not succeeded for the slot's date within
    # --after-wait (the next fire runs the slot), or it failed for that date (not run).
    WAITING = "waiting"
    BLOCKED = "blocked"

    choices = [
        (RUNNING, "Running"),
        (SUCCEEDED, "Succeeded"),
        (FAILED, "Failed"),
        (TIMED_OUT, "timed out"),
        (TERMINATED, "Terminated"),
        (ABANDONED, "Abandoned"),
        (SKIPPED, "Skipped"),
        (TAKEN_OVER, "taken over"),
        (WAITING, "Waiting"),
        (BLOCKED, "Blocked"),
    ]
    values = [value for value, _ in choices]


class Trigger:
    """How a run was started (ops/run/origin.py): what run_job found at its start, except for
    an attempt after the first (--retries) and an earlier slot run by --catch-up."""

    CRON = "cron"
    TERMINAL = "terminal"
    HAND = "hand"
    PAGE = "page"
    RETRY = "retry"
    CATCH_UP = "catch_up"

    choices = [
        (CRON, "cron"),
        (TERMINAL, "by hand, at a terminal"),
        (HAND, "by hand, no terminal"),
        (PAGE, "the Jobs page"),
        (RETRY, "retry (--retries)"),
        (CATCH_UP, "catch-up (--catch-up)"),
    ]


WHO_CHARS = 18  # of a user's name in started_how

M = TypeVar("M", bound=models.Model)


def named(
    *, indexes: Sequence[models.Index] = (), constraints: Sequence[models.BaseConstraint] = ()
) -> Callable[[type[M]], type[M]]:
    """A concrete model's indexes and constraints, each named already, set as Django leaves
    those of its Meta: Django clones Meta's (to put the app and class into names like
    "%(class)s_x") and deep-copies the indexes once more as it builds the class, ~0.16 M
    instructions an index and 0.09 M a constraint on every command of the project
    (bench/RESULTS.md, P9). Migrations read them from _meta as they would from Meta
    (tests/test_migrations.py), and so do Django's checks (tests/test_checkgate.py); a
    `class_prepared` receiver, which runs while Django builds the class, sees none yet."""

    def give(model: type[M]) -> type[M]:
        meta = model._meta
        if meta.abstract or meta.proxy or meta.indexes or meta.constraints:
            raise ValueError(f"{model.__name__}: named() is for a concrete model without Meta's")
        items: list[models.Index | models.BaseConstraint] = [*indexes, *constraints]
        for item in items:
            if not item.name or "%(" in item.name:
                raise ValueError(f"{model.__name__}: {item!r} needs its final name")
        meta.indexes, meta.constraints = list(indexes), list(constraints)
        # how ModelState.from_model (makemigrations) knows Meta declared them
        meta.original_attrs.update(indexes=meta.indexes, constraints=meta.constraints)
        return model

    return give


@named(
    indexes=[
        models.Index(fields=["job", "-started_at"], name="ops_run_job_started"),
        models.Index(fields=["job", "outcome", "-started_at"], name="ops_run_job_outcome"),
        # job_status's last success: the latest slot that succeeded, whenever it ran
        models.Index(fields=["job", "outcome", "-scheduled_at"], name="ops_run_job_outcome_sched"),
    ],
    constraints=[
        # Every fire of a paused slot (a second server's, a retry) finds this row: one skip.
        models.UniqueConstraint(
            fields=["job", "slot"],
            condition=models.Q(paused=True) & ~models.Q(slot=""),
            name="ops_run_one_pause_per_slot",
        ),
    ],
)
class JobRun(models.Model):
    """One attempt of one job: every run, skip and dead attempt is kept (the history)."""

    job = models.CharField(max_length=100)
    # The slot's key (ops/schedule/slots.py): the logical date ("2026-11-29") for a once-a-day
    # schedule or a --logical-date run of an unscheduled command, else the fire time's wall clock
    # in TIME_ZONE plus its UTC offset ("2026-10-25 02:30+02:00"); empty: not slot-gated.
    slot = models.CharField(max_length=SLOT_KEY_LENGTH, blank=True, default="")
    logical_date = models.DateField(null=True, blank=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.RUNNING)
    note = models.CharField(max_length=300, blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    duration = models.FloatField(null=True, blank=True, help_text="seconds")
    lag = models.FloatField(null=True, blank=True, help_text="start minus slot, seconds")
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    rid = models.CharField(max_length=36, blank=True, default="")
    command = models.CharField(max_length=500, blank=True, default="")
    output_tail = models.TextField(blank=True, default="")
    # Who started it: the Jobs page's user (Run now, Run again), the OS user by hand ("alice",
    # "alice as app" under sudo); "" for cron. How: `trigger` ("" on rows before ops 0011).
    started_by = models.CharField(max_length=150, blank=True, default="", db_default="")
    trigger = models.CharField(
        max_length=16, choices=Trigger.choices, blank=True, default="", db_default=""
    )
    # A fire refused because the job was paused (ops/control/pauses.py): one per slot at most.
    paused = models.BooleanField(default=False, db_default=False)
    # Which attempt at its slot this row is (--retries, ops/run/retries.py): 1, then 2, 3...
    # within one run_job call; the slot's outcome is its last attempt's.
    attempt = models.PositiveSmallIntegerField(default=1, db_default=1)
    # A task put on its backend (--enqueue, ops/run/enqueue.py): its result's id there, and its
    # status as last seen (job_status and the jobs page read the backend's own where it tells).
    task_result_id = models.CharField(max_length=64, blank=True, default="", db_default="")
    task_status = models.CharField(max_length=16, blank=True, default="", db_default="")
    # Not columns: the claim version a run holds, set by ops.run.claims on the run it creates (read
    # with getattr: a run loaded from the database has none); `kind` ("r"/"s"), the raw query
    # of ops.monitors.status.
    claim_version: int
    claim_was: str | None  # the claim's state before this run took it (None: a new claim)
    kind: str

    check = classmethod(model_check)  # under ops/checkgate.py's commands only

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"{self.job} {self.slot or self.started_at.isoformat()} {self.outcome}"

    @property
    def started_how(self) -> str:
        """How the run was started, in a few words: `cron`, `alice, terminal`, `alice, no
        terminal`, `alice (Jobs page)`, `retry, attempt 2`, `catch-up`; `-` when unknown."""
        who = self.started_by
        if len(who) > WHO_CHARS:
            who = who[: WHO_CHARS - 1] + "…"
        how: dict[str, str] = {
            Trigger.CRON: "cron",
            Trigger.TERMINAL: f"{who}, terminal",
            Trigger.HAND: f"{who}, no terminal",
            Trigger.PAGE: f"{who} (Jobs page)",
            Trigger.RETRY: f"retry, attempt {self.attempt}",
            Trigger.CATCH_UP: "catch-up",
        }
        return how.get(self.trigger, f"{who} (Jobs page)" if who else "-")  # before ops 0011


@named(
    constraints=[models.UniqueConstraint(fields=["job", "slot"], name="ops_claim_one_per_slot")],
    indexes=[
        # catch-up's floor: a job's first claim and its latest success, by slot instant
        models.Index(fields=["job", "scheduled_at"], name="ops_claim_job_sched"),
        models.Index(fields=["job", "state", "scheduled_at"], name="ops_claim_job_state"),
        # a once-a-day slot is done when its date succeeded under any key
        models.Index(fields=["job", "logical_date"], name="ops_claim_job_date"),
    ],
)
class SlotClaim(models.Model):
    """The claim on one slot of one job: a unique row that only one run at a time can own.

    The file lock stops overlap on one host; this row is what stops a second host (or a
    re-run) from running a slot that is running or done. Its holder is recorded in terms the
    kernel can check (ops/run/process.py), and `version` goes up by one each time the claim is
    taken, so a run that lost its claim can never write onto the new holder's.
    """

    job = models.CharField(max_length=100)
    slot = models.CharField(max_length=SLOT_KEY_LENGTH)
    logical_date = models.DateField(null=True, blank=True)
    # The slot's instant (catch-up's floor compares these, never key strings); empty for a
    # --logical-date run of an unscheduled command.
    scheduled_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=Outcome.choices)
    run = models.ForeignKey(JobRun, null=True, blank=True, on_delete=models.SET_NULL)
    # db_default too: rows written by other tools (or an older cronops) get valid values
    version = models.PositiveIntegerField(
        default=1,
        db_default=1,
        help_text="fencing token: 1 when first claimed, +1 on every takeover",
    )
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    holder_boot_id = models.CharField(max_length=36, blank=True, default="", db_default="")
    holder_pid_ns = models.BigIntegerField(null=True, blank=True)
    holder_started = models.BigIntegerField(
        null=True, blank=True, help_text="the holder's start time, clock ticks after boot"
    )
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    # The holder's OPS_HEARTBEAT_SECONDS: its claim is stale after 3 of these, whatever the
    # judging run's own setting; empty on claims written before it was recorded (the judge's).
    heartbeat_interval = models.FloatField(
        null=True, blank=True, help_text="the holder's heartbeat interval, seconds"
    )

    check = classmethod(model_check)  # under ops/checkgate.py's commands only

    def __str__(self) -> str:
        return f"{self.job} {self.slot} {self.state}"


@named(
    constraints=[models.UniqueConstraint(fields=["job", "slot", "key"], name="ops_effect_once")],
    indexes=[models.Index(fields=["job", "created_at"], name="ops_effect_job_created")],
)
class Effect(models.Model):
    """An effect a job did for its slot, marked by `ops.once(key)` in the transaction that did
    it: one row per (job, slot, key), so a run that redoes the slot (a standby after a
    takeover, --force, by hand, catch-up) finds it done and does not do it again."""

    job = models.CharField(max_length=100)
    slot = models.CharField(max_length=SLOT_KEY_LENGTH)  # the claim's key (SlotClaim.slot)
    key = models.CharField(max_length=200)  # the job's name for the effect
    # The run that did it (JobRun's id) and the claim version it held; not a foreign key: the
    # row is written in the job's own transaction, and outlives the run's history.
    run_id = models.BigIntegerField(null=True, blank=True)
    version = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()

    check = classmethod(model_check)  # under ops/checkgate.py's commands only

    class Meta:
        verbose_name = "effect done once"
        verbose_name_plural = "effects done once"

    def __str__(self) -> str:
        return f"{self.job} {self.slot} {self.key}"


class Job(JobRun):
    """The admin's jobs page (Ops → Jobs). A proxy of the history it is drawn from: no table.
    Seeing it asks for `ops.view_jobrun`, like the history; its buttons (pause, resume, run
    now, run again) for a permission of their own, `ops.run_job`."""

    class Meta:
        proxy = True
        verbose_name = "job"
        default_permissions = ()
        permissions = [("run_job", "Can pause, resume and run jobs from the jobs page")]


@named(
    indexes=[models.Index(fields=["job", "-since"], name="ops_pause_job_since")],
    constraints=[
        models.UniqueConstraint(
            fields=["job"],
            condition=models.Q(ended_at__isnull=True),
            name="ops_pause_one_open_per_job",
        ),
    ],
)
class JobPause(models.Model):
    """A pause of one job (`job_pause`, the jobs page). While it lasts the job's fires run
    nothing and record their slot as a skip; it ends by `job_resume` or at `until`. Kept once
    ended: catch-up never replays a slot it covered, and the calendar shows those days paused.
    """

    job = models.CharField(max_length=100)
    paused_by = models.CharField(max_length=150)
    since = models.DateTimeField()
    until = models.DateTimeField(null=True, blank=True, help_text="the pause ends by itself then")
    reason = models.CharField(max_length=300, blank=True, default="")
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_by = models.CharField(max_length=150, blank=True, default="")
    # The job's healthchecks.io check: its UUID, whether this pause holds it paused on the
    # server now (a resume is owed), the manual_resume it had before (restored on resume),
    # and what the last call to the server did.
    check_uuid = models.CharField(max_length=36, blank=True, default="")
    check_paused = models.BooleanField(default=False)
    check_manual_resume = models.BooleanField(null=True, blank=True)
    check_note = models.CharField(max_length=300, blank=True, default="")

    check = classmethod(model_check)  # under ops/checkgate.py's commands only

    class Meta:
        ordering = ["-since", "-id"]

    def __str__(self) -> str:
        return f"{self.job} paused {self.since:%Y-%m-%d %H:%M} by {self.paused_by}"


@named(indexes=[models.Index(fields=["job", "-at"], name="ops_action_job_at")])
class JobAction(models.Model):
    """The audit trail: every pause, resume, run now and run again, by whom and when."""

    class Kind:
        PAUSE = "pause"
        RESUME = "resume"
        RUN_NOW = "run_now"
        RUN_AGAIN = "run_again"

        choices = [
            (PAUSE, "pause"),
            (RESUME, "resume"),
            (RUN_NOW, "run now"),
            (RUN_AGAIN, "run again"),
        ]

    at = models.DateTimeField()
    job = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # Who: an admin user's name; `<unix user>@<host> (command line)`; `cronops (--until)`.
    username = models.CharField(max_length=150)
    logical_date = models.DateField(null=True, blank=True)
    force = models.BooleanField(default=False)
    note = models.CharField(max_length=500, blank=True, default="")
    # A run it started (Run now, Run again): set by that run_job when it records the run.
    run = models.ForeignKey(
        JobRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    check = classmethod(model_check)  # under ops/checkgate.py's commands only

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.job} by {self.username}"
