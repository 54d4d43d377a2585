"""prune_runs: retention for the run history, and its line in the project's own crontab.d."""

import datetime as dt
import io
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ops.models import Effect, JobRun, Outcome, SlotClaim
from ops.run.retention import prune_runs
from ops.schedule.crontabd import parse_text
from ops.schedule.slots import current_slot, time_key

REPO = Path(__file__).resolve().parent.parent
NOW = dt.datetime(2026, 11, 29, 4, 30, tzinfo=dt.UTC)


def make_run(job, days_ago, outcome=Outcome.SUCCEEDED, claim=True):
    started = NOW - dt.timedelta(days=days_ago)
    slot = time_key(started)
    run = JobRun.objects.create(
        job=job,
        slot=slot,
        logical_date=started.date(),
        scheduled_at=started,
        outcome=outcome,
        exit_code=0 if outcome == Outcome.SUCCEEDED else 1,
        started_at=started,
        finished_at=started,
        duration=1.0,
        host="h",
        pid=1,
        output_tail="x" * 1000,
    )
    if claim:
        SlotClaim.objects.create(
            job=job,
            slot=slot,
            logical_date=started.date(),
            scheduled_at=started,
            state=outcome,
            run=run,
            host="h",
            pid=1,
            started_at=started,
            heartbeat_at=started,
        )
    return run


def prune(*args):
    out = io.StringIO()
    with time_machine.travel(NOW, tick=False):
        call_command("prune_runs", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_runs_older_than_90_days_are_deleted_and_newer_ones_kept():
    old = [make_run("daily", d) for d in (200, 150, 91)]
    recent = [make_run("daily", d) for d in (89, 10, 1)]
    out = prune("--older-than=90d")
    assert set(JobRun.objects.values_list("pk", flat=True)) == {r.pk for r in recent}
    assert out.strip() == (
        "prune_runs: deleted 3 runs started before 2026-08-31 04:30 UTC (1 jobs; each job's "
        "latest run and latest success kept) and 2 slot claims of slots before it (each job's "
        "first and latest succeeded claims and running claims kept) and 0 effects done once "
        "(ops.once) marked before it"
    )
    assert not JobRun.objects.filter(pk__in=[r.pk for r in old]).exists()


@pytest.mark.django_db
def test_old_slot_claims_go_but_the_first_the_latest_success_and_running_claims_stay():
    """Issue 9, item 17: claims were never pruned (a minutely job adds ~525,000 a year)."""
    latest_success = make_run("daily", 120)
    first = make_run("daily", 200)
    make_run("daily", 170)
    make_run("daily", 100, Outcome.FAILED)
    stuck = make_run("daily", 95, Outcome.RUNNING)
    recent = make_run("daily", 1, Outcome.FAILED)
    other_first = make_run("other", 150)
    make_run("other", 140)
    other_latest = make_run("other", 130)
    prune("--older-than=90d")
    kept = set(SlotClaim.objects.values_list("job", "slot"))
    assert kept == {
        ("daily", first.slot),
        ("daily", latest_success.slot),
        ("daily", stuck.slot),
        ("daily", recent.slot),
        ("other", other_first.slot),
        ("other", other_latest.slot),
    }
    done = SlotClaim.objects.get(slot=latest_success.slot)
    assert done.state == Outcome.SUCCEEDED and done.run_id == latest_success.pk


@pytest.mark.django_db
def test_dry_run_counts_the_claims_too():
    for d in (200, 150, 100, 5):
        make_run("daily", d)
    out = prune("--older-than=90d", "--dry-run", "-v2")
    assert "daily: 3 runs, 2 slot claims" in out  # the first claim (200 days) stays
    assert SlotClaim.objects.count() == 4


@pytest.mark.django_db(transaction=True)  # run_job's job sees only what was committed
def test_catch_up_after_a_prune_runs_no_pruned_day_again(settings, tmp_path):
    from ops.run import runner

    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text("0 3 * * * --catch-up=5 sleep_demo --seconds=0\n")
    for day in range(20, 26):
        with time_machine.travel(f"2026-11-{day}T03:00:05+00:00", tick=False):
            assert runner.run(["sleep_demo"]) == 0
    with time_machine.travel("2026-11-26T04:30:00+00:00", tick=False):
        call_command("prune_runs", "--older-than=1d", stdout=io.StringIO())
    kept = SlotClaim.objects.order_by("slot").values_list("slot", flat=True)
    assert list(kept) == ["2026-11-20", "2026-11-25"]  # the first claim, the latest success
    with time_machine.travel("2026-11-27T03:00:05+00:00", tick=False):
        assert runner.run(["sleep_demo"]) == 0
    ran = JobRun.objects.filter(outcome=Outcome.SUCCEEDED).values_list("slot", flat=True)
    # The missed 26th is caught up; none of the pruned days 20-24 runs again.
    assert sorted(ran) == ["2026-11-25", "2026-11-26", "2026-11-27"]


WEEKLY = "0 3 * * 1"


@pytest.mark.django_db
@given(
    history=st.dictionaries(
        st.integers(0, 80),  # weeks ago
        st.sampled_from([Outcome.SUCCEEDED, Outcome.FAILED, Outcome.ABANDONED]),
        max_size=15,
    )
)
@hsettings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_a_prune_never_changes_what_catch_up_runs(history, settings, tmp_path):
    """Catch-up's floor is the job's first claim and its latest succeeded slot: pruning the
    claims older than 90 days used to move the first one forward (fewer days caught up)."""
    from ops.run import runner

    settings.OPS_CRONTAB_DIR = tmp_path
    # Weekly: 100 slots of catch-up reach back past the 90-day cut-off.
    (tmp_path / "t.cron").write_text(f"{WEEKLY} --catch-up=100 sleep_demo --seconds=0\n")
    JobRun.objects.all().delete()
    SlotClaim.objects.all().delete()
    tz = ZoneInfo("UTC")
    for weeks_ago, state in history.items():
        slot = current_slot(WEEKLY, NOW - dt.timedelta(weeks=weeks_ago), tz)
        SlotClaim.objects.create(
            job="sleep_demo",
            slot=slot.key,
            logical_date=slot.logical_date,
            scheduled_at=slot.at,
            state=state,
            host="h",
            pid=1,
            started_at=slot.at,
            heartbeat_at=slot.at,
        )

    def catch_up() -> list[str]:
        plan = runner.resolve(["sleep_demo"], now=NOW)
        return [s.key for s in runner.plan_slots(plan, NOW, tz) if s is not None]

    before = catch_up()
    prune("--older-than=90d")
    assert catch_up() == before


@pytest.mark.django_db
def test_each_jobs_latest_run_and_latest_success_survive_however_old():
    success = make_run("yearly", 400)
    failure = make_run("yearly", 300, Outcome.FAILED)
    make_run("yearly", 700)
    make_run("yearly", 299, Outcome.SKIPPED, claim=False)  # a skip is not the latest attempt
    prune("--older-than=90d")
    assert set(JobRun.objects.values_list("pk", flat=True)) == {success.pk, failure.pk}


@pytest.mark.django_db
def test_dry_run_counts_and_deletes_nothing():
    for d in (200, 150, 100, 5):
        make_run("daily", d)
    out = prune("--older-than=90d", "--dry-run")
    assert out.startswith("prune_runs: would delete 3 runs started before 2026-08-31 04:30 UTC")
    assert JobRun.objects.count() == 4


@pytest.mark.django_db
def test_deletion_goes_in_batches_across_jobs():
    for job in ("a", "b"):
        for d in range(100, 111):
            make_run(job, d)
        make_run(job, 1)
    result = prune_runs(now=NOW, older_than=90 * 86400, batch=3)
    assert result.deleted == 22
    assert result.per_job == {"a": 11, "b": 11}
    assert JobRun.objects.count() == 2


@pytest.mark.django_db
def test_job_prunes_only_that_jobs_runs():
    chatty = [make_run("metrics", d) for d in (3, 2)]
    kept = make_run("metrics", 0.5)
    daily = make_run("daily", 3)
    out = prune("--older-than=1d", "--job=metrics")
    assert set(JobRun.objects.values_list("pk", flat=True)) == {kept.pk, daily.pk}
    assert out.startswith("prune_runs: deleted 2 runs started before 2026-11-28 04:30 UTC (1 jobs")
    assert not JobRun.objects.filter(pk__in=[r.pk for r in chatty]).exists()


@pytest.mark.django_db
def test_job_prunes_only_that_jobs_claims():
    """The metrics job's two-day prune must not forget which billing days were done."""
    make_run("metrics", 4)  # its first claim: kept
    make_run("metrics", 3)
    make_run("metrics", 0.5)
    billing = [make_run("daily", d) for d in (5, 4, 3)]
    prune("--older-than=1d", "--job=metrics")
    assert set(SlotClaim.objects.filter(job="daily").values_list("slot", flat=True)) == {
        r.slot for r in billing
    }
    assert SlotClaim.objects.filter(job="metrics").count() == 2


def mark_effect(job, days_ago, key="pay ann"):
    """A row `ops.once(key)` wrote in a run of `job` `days_ago` days ago."""
    marked = NOW - dt.timedelta(days=days_ago)
    return Effect.objects.create(
        job=job, slot=time_key(marked), key=key, run_id=1, version=1, created_at=marked
    )


@pytest.mark.django_db
def test_effects_done_once_go_by_the_same_cut_off_and_the_summary_counts_them():
    old = [mark_effect("daily", d) for d in (200, 91)]
    recent = [mark_effect("daily", d) for d in (89, 1)]
    other = mark_effect("metrics", 200)
    out = prune("--older-than=90d", "--dry-run", "-v2")
    assert "daily: 0 runs, 0 slot claims, 2 effects done once" in out
    assert out.strip().endswith("and 3 effects done once (ops.once) marked before it")
    assert Effect.objects.count() == 5
    out = prune("--older-than=90d", "--job=daily")
    assert out.strip().endswith("and 2 effects done once (ops.once) marked before it")
    assert set(Effect.objects.values_list("pk", flat=True)) == {
        *(e.pk for e in recent),
        other.pk,
    }
    assert not Effect.objects.filter(pk__in=[e.pk for e in old]).exists()
    result = prune_runs(now=NOW, older_than=90 * 86400, batch=1)
    assert (result.effects_deleted, result.effects_per_job) == (1, {"metrics": 1})


@pytest.mark.django_db
def test_the_effects_of_a_slot_whose_claim_is_kept_stay_marked_done():
    """A yearly job's only success is older than the cut-off: its claim is kept (catch-up's
    floor, job_status), so a --force run of that slot is still "done" and must find its
    effects done too; the effects of a slot whose claim went, go."""
    kept = make_run("yearly", 200)  # its first and latest succeeded claim: kept
    make_run("daily", 200), make_run("daily", 150), make_run("daily", 1)
    for run in (kept, *JobRun.objects.filter(job="daily")):
        Effect.objects.create(
            job=run.job, slot=run.slot, key="pay ann", run_id=run.pk, version=1,
            created_at=run.started_at,
        )  # fmt: skip
    dry = prune("--older-than=90d", "--dry-run", "-v2")
    assert (
        "yearly: " not in dry or "effects done once" not in dry.split("yearly: ")[1].split("\n")[0]
    )
    prune("--older-than=90d")
    assert SlotClaim.objects.filter(job="yearly").exists()
    left = set(Effect.objects.values_list("job", "slot"))
    daily_150 = time_key(NOW - dt.timedelta(days=150))
    assert ("yearly", kept.slot) in left  # its claim stays: so does the mark
    assert ("daily", daily_150) not in left  # neither the first nor the latest success: gone
    assert ("daily", time_key(NOW - dt.timedelta(days=1))) in left


@pytest.mark.django_db
def test_a_bad_duration_is_one_line_and_exit_2():
    with pytest.raises(CommandError) as error:
        prune("--older-than=ninety days")
    assert error.value.returncode == 2
    assert str(error.value) == (
        "--older-than: bad duration 'ninety days': use a positive number with s, m, h or d "
        "(90s, 30m, 2h)"
    )


def test_the_project_schedules_its_own_housekeeping_in_crontab_d():
    path = REPO / "crontab.d" / "95-cronops.cron"
    schedule = parse_text(path.read_text(), str(path))
    (job,) = schedule.jobs
    assert job.name == "prune-runs"
    assert job.schedule == "30 4 * * *"
    assert job.options.command == "prune_runs"
    assert job.options.args == ["--older-than=90d"]
    assert job.options.timeout == 1800
    assert job.description.startswith("cronops housekeeping")


def test_cron_runs_the_prune_through_run_job_on_the_real_database(project):
    project.write_cron("95-cronops.cron", (REPO / "crontab.d" / "95-cronops.cron").read_text())
    now = dt.datetime.now(dt.UTC)
    sqlite = project.db.backend == "sqlite"
    for i, days in enumerate((200, 120, 2)):
        started = now - dt.timedelta(days=days)
        value = started.replace(tzinfo=None).isoformat(" ") if sqlite else started
        project.db.execute(
            "INSERT INTO ops_jobrun (id, job, slot, outcome, note, exit_code, started_at, "
            "host, pid, rid, command, output_tail) VALUES (?, 'export', '', 'succeeded', '', 0, "
            "?, 'h', 1, '', 'export', 'out')",
            (1000 + i, value),
        )
    result = project.run_job("prune-runs")
    assert result.returncode == 0, result.stderr
    assert "prune_runs: deleted 2 runs started before" in result.stdout
    assert project.db.query("SELECT id FROM ops_jobrun WHERE job = 'export'") == [(1002,)]
    assert [r[3] for r in project.db.runs("prune-runs")] == ["succeeded"]
