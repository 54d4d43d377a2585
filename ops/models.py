from django.db import models


class Outcome(models.TextChoices):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out", "timed out"
    TERMINATED = "terminated"
    ABANDONED = "abandoned"
    SKIPPED = "skipped"


class JobRun(models.Model):
    """One attempt of one job: every run, skip and dead attempt is kept (the history)."""

    job = models.CharField(max_length=100)
    # The slot is the scheduled fire time as wall-clock text in TIME_ZONE ("2026-11-29 03:00"),
    # or a bare date for a --logical-date run of an unscheduled command; empty: not slot-gated.
    slot = models.CharField(max_length=20, blank=True, default="")
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

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["job", "-started_at"], name="ops_run_job_started"),
            models.Index(fields=["job", "outcome", "-started_at"], name="ops_run_job_outcome"),
        ]

    def __str__(self):
        return f"{self.job} {self.slot or self.started_at.isoformat()} {self.outcome}"


class SlotClaim(models.Model):
    """The claim on one slot of one job: a unique row that only one run at a time can own.

    The file lock stops overlap on one host; this row is what stops a second host (or a
    re-run) from running a slot that is running or done.
    """

    job = models.CharField(max_length=100)
    slot = models.CharField(max_length=20)
    logical_date = models.DateField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=Outcome.choices)
    run = models.ForeignKey(JobRun, null=True, blank=True, on_delete=models.SET_NULL)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "slot"], name="ops_claim_one_per_slot"),
        ]

    def __str__(self):
        return f"{self.job} {self.slot} {self.state}"
