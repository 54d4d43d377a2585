from django.db import models

SLOT_KEY_LENGTH = 32  # "2026-10-25 02:30+02:00" is 22; an offset with seconds adds 3


class Outcome(models.TextChoices):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out", "timed out"
    TERMINATED = "terminated"
    ABANDONED = "abandoned"
    SKIPPED = "skipped"
    # This run lost its claim while frozen or cut off from the database, and another run took
    # the slot over: the slot's outcome is that run's, never this one's (README, several servers).
    TAKEN_OVER = "taken_over", "taken over"


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
    # Not columns: the claim version a run holds, set by ops.run.claims on the run it creates (read
    # with getattr: a run loaded from the database has none); `kind` ("r"/"s"), the raw query
    # of ops.monitors.status.
    claim_version: int
    kind: str

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["job", "-started_at"], name="ops_run_job_started"),
            models.Index(fields=["job", "outcome", "-started_at"], name="ops_run_job_outcome"),
        ]

    def __str__(self) -> str:
        return f"{self.job} {self.slot or self.started_at.isoformat()} {self.outcome}"


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

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "slot"], name="ops_claim_one_per_slot"),
        ]
        indexes = [
            # catch-up's floor: a job's first claim and its latest success, by slot instant
            models.Index(fields=["job", "scheduled_at"], name="ops_claim_job_sched"),
            models.Index(fields=["job", "state", "scheduled_at"], name="ops_claim_job_state"),
            # a once-a-day slot is done when its date succeeded under any key
            models.Index(fields=["job", "logical_date"], name="ops_claim_job_date"),
        ]

    def __str__(self) -> str:
        return f"{self.job} {self.slot} {self.state}"


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

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "slot", "key"], name="ops_effect_once"),
        ]
        indexes = [models.Index(fields=["job", "created_at"], name="ops_effect_job_created")]
        verbose_name = "effect done once"
        verbose_name_plural = "effects done once"

    def __str__(self) -> str:
        return f"{self.job} {self.slot} {self.key}"


class Job(JobRun):
    """The admin's jobs page (Ops → Jobs). A proxy of the history it is drawn from: no table,
    no permissions of its own (the page asks for `ops.view_jobrun`, like the history)."""

    class Meta:
        proxy = True
        verbose_name = "job"
        default_permissions = ()
