"""The runner called in-process with a fake clock: logical dates on DST days, end to end through
the database. run_job forks its job from this process (the test's clock travels along), so the
tests use committed data (`transactional_db`): the job's child sees what its parent wrote."""

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.core.management import CommandError, call_command

from commands.models import DailyCharge
from ops.models import JobRun, SlotClaim
from ops.run import runner
from ops.run.plan import plan_slots, resolve


def run_at(instant: str, *argv: str) -> int:
    with time_machine.travel(instant, tick=False):
        return runner.run(list(argv))


def test_the_billing_charges_the_moscow_date_when_cron_fires_at_0030_moscow_time(
    transactional_db, settings, tmp_path
):
    settings.TIME_ZONE = "Europe/Moscow"
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "b.cron").write_text("30 0 * * * charge_daily\n")
    call_command("seed_demo")
    assert run_at("2026-11-28T21:30:05+00:00", "charge_daily") == 0
    dates = set(DailyCharge.objects.values_list("charge_date", flat=True))
    assert dates == {dt.date(2026, 11, 29)}  # UTC says Nov 28; the business day is Nov 29


def berlin(settings, tmp_path, cron: str) -> None:
    settings.TIME_ZONE = "Europe/Berlin"
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text(cron)


def outcomes() -> list[tuple[str, str, str]]:
    return list(JobRun.objects.order_by("id").values_list("slot", "outcome", "note"))


def test_a_wildcard_job_runs_at_both_0230s_of_the_repeated_autumn_hour(
    transactional_db, settings, tmp_path
):
    berlin(settings, tmp_path, "*/30 * * * * sleep_demo --seconds=0\n")
    # cron fires the wildcard job at 02:30 CEST and again, an hour later, at 02:30 CET.
    assert run_at("2026-10-25T02:30:02+02:00", "sleep_demo") == 0
    assert run_at("2026-10-25T02:30:02+01:00", "sleep_demo") == 0
    assert run_at("2026-10-25T02:30:40+01:00", "sleep_demo") == 0  # by hand, a moment later
    assert outcomes() == [
        ("2026-10-25 02:30+02:00", "succeeded", ""),
        ("2026-10-25 02:30+01:00", "succeeded", ""),
        ("2026-10-25 02:30+01:00", "skipped", "already done for 2026-10-25 02:30+01:00"),
    ]


def test_a_fixed_time_job_run_by_hand_in_the_second_0230_finds_it_done(
    transactional_db, settings, tmp_path
):
    berlin(settings, tmp_path, "30 2 * * * sleep_demo --seconds=0\n")
    assert run_at("2026-10-25T02:30:02+02:00", "sleep_demo") == 0
    # cron does not fire it again in the repeated hour; an operator running it by hand then
    # meets the day's claim.
    assert run_at("2026-10-25T02:30:02+01:00", "sleep_demo") == 0
    assert outcomes() == [
        ("2026-10-25", "succeeded", ""),
        ("2026-10-25", "skipped", "already done for 2026-10-25"),
    ]


def test_a_clock_stepped_back_does_not_run_a_slot_again(transactional_db, settings, tmp_path):
    berlin(settings, tmp_path, "*/15 * * * * sleep_demo --seconds=0\n")
    assert run_at("2026-06-10T02:15:03+02:00", "sleep_demo") == 0
    assert run_at("2026-06-10T03:00:03+02:00", "sleep_demo") == 0
    # NTP steps the clock back 50 minutes: cron's wildcard job fires at 02:15 again.
    assert run_at("2026-06-10T02:15:05+02:00", "sleep_demo") == 0
    assert [o for _, o, _ in outcomes()] == ["succeeded", "succeeded", "skipped"]


def test_the_skipped_spring_hour_still_runs_the_0230_job_once_that_day(
    transactional_db, settings, tmp_path
):
    berlin(settings, tmp_path, "30 2 * * * sleep_demo --seconds=0\n")
    assert run_at("2026-03-29T03:00:03+02:00", "sleep_demo") == 0  # cron runs it after the jump
    assert run_at("2026-03-29T09:00:00+02:00", "sleep_demo") == 0  # a manual re-run: no-op
    claims = list(SlotClaim.objects.values_list("logical_date", "state"))
    assert [(str(d), s) for d, s in claims] == [("2026-03-29", "succeeded")]
    assert JobRun.objects.filter(outcome="skipped").count() == 1


def test_catch_up_after_three_missed_days_with_a_fake_clock(transactional_db, settings, tmp_path):
    settings.TIME_ZONE = "Europe/Moscow"
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "b.cron").write_text("0 3 * * * --catch-up=3 charge_daily\n")
    call_command("seed_demo")
    assert run_at("2026-11-25T00:00:10+00:00", "charge_daily") == 0  # 03:00 Moscow, Nov 25
    # Down for three days; back on Nov 29 at 03:00 Moscow.
    assert run_at("2026-11-29T00:00:10+00:00", "charge_daily") == 0
    dates = [str(d) for d in JobRun.objects.order_by("id").values_list("logical_date", flat=True)]
    assert dates == ["2026-11-25", "2026-11-26", "2026-11-27", "2026-11-28", "2026-11-29"]
    assert DailyCharge.objects.count() == 15


def test_run_job_works_through_call_command_too(transactional_db, settings, tmp_path):
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    call_command("run_job", "--timeout=90s", "sleep_demo")
    run = JobRun.objects.get()
    assert (run.job, run.outcome, run.command) == ("sleep_demo", "succeeded", "sleep_demo")


def test_call_command_passes_the_commands_own_arguments_and_refuses_a_logical_date_there(
    transactional_db, settings, tmp_path
):
    """call_command() hands run_job the command's arguments as *args, not as options["args"]:
    they were dropped (sleep_demo slept its default 3 s; charge_daily's own --logical-date was
    silently ignored and today's slot ran instead of a usage error)."""
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    call_command("run_job", "--name=cc", "sleep_demo", "--seconds=0")
    run = JobRun.objects.get()
    assert (run.job, run.outcome, run.command) == ("cc", "succeeded", "sleep_demo --seconds=0")
    with pytest.raises(CommandError) as refused:
        call_command("run_job", "charge_daily", "--logical-date=2026-01-09")
    assert refused.value.returncode == 2
    assert JobRun.objects.count() == 1
    assert not DailyCharge.objects.exists()


def test_a_schedule_edit_from_0300_to_0400_runs_no_day_again(transactional_db, settings, tmp_path):
    """Issue 9, item 6: every day had been served at 03:00; after the edit to 04:00 the next
    run executed four slots (three days of catch-up and today)."""
    berlin(settings, tmp_path, "0 3 * * * --catch-up=3 sleep_demo --seconds=0\n")
    for day in range(25, 30):
        assert run_at(f"2026-11-{day}T03:00:05+01:00", "sleep_demo") == 0
    (tmp_path / "t.cron").write_text("0 4 * * * --catch-up=3 sleep_demo --seconds=0\n")
    assert run_at("2026-11-29T04:00:05+01:00", "sleep_demo") == 0
    assert run_at("2026-11-30T04:00:05+01:00", "sleep_demo") == 0
    runs = outcomes()
    assert [s for s, o, _ in runs if o == "succeeded"] == [
        "2026-11-25",
        "2026-11-26",
        "2026-11-27",
        "2026-11-28",
        "2026-11-29",
        "2026-11-30",
    ]
    assert runs[5] == ("2026-11-29", "skipped", "already done for 2026-11-29")


def test_catch_up_never_runs_a_slot_older_than_the_latest_success(
    transactional_db, settings, tmp_path
):
    berlin(settings, tmp_path, "0 */6 * * * --catch-up=4 sleep_demo --seconds=0\n")
    assert run_at("2026-11-28T00:00:05+01:00", "sleep_demo") == 0
    # 06:00 never ran (the host was down); 12:00 ran. A by-hand run of an old date succeeds
    # later on: it does not move the floor, which is the latest succeeded slot's instant.
    assert run_at("2026-11-28T12:00:05+01:00", "sleep_demo") == 0
    assert run_at("2026-11-28T13:00:00+01:00", "--logical-date=2026-11-01", "sleep_demo") == 0
    assert run_at("2026-11-29T00:00:05+01:00", "sleep_demo") == 0
    slots = [s for s, o, _ in outcomes() if o == "succeeded"]
    assert slots == [
        "2026-11-28 00:00+01:00",
        "2026-11-28 06:00+01:00",  # catch-up at 12:00: after the 00:00 success
        "2026-11-28 12:00+01:00",
        "2026-11-01 00:00+01:00",
        "2026-11-28 18:00+01:00",  # 06:00 is done; 18:00 is after the floor
        "2026-11-29 00:00+01:00",
    ]


def test_a_failed_slot_older_than_the_latest_success_is_left_to_a_run_by_hand(
    transactional_db, settings, tmp_path
):
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text("0 3 * * * --catch-up=3 sleep_demo --seconds=0\n")
    # fails: time.sleep(-1) raises (arguments its parser refuses would be exit 2, not a run)
    assert run_at("2026-11-26T03:00:05+00:00", "sleep_demo", "--seconds=-1") != 0
    assert run_at("2026-11-27T03:00:05+00:00", "--catch-up=0", "sleep_demo") == 0
    assert run_at("2026-11-29T03:00:05+00:00", "sleep_demo") == 0  # down on the 28th
    runs = [(s, o) for s, o, _ in outcomes()]
    assert runs == [
        ("2026-11-26", "failed"),
        ("2026-11-27", "succeeded"),
        ("2026-11-28", "succeeded"),  # caught up: after the latest success
        ("2026-11-29", "succeeded"),
    ]
    # The 26th stays failed (job_status and the history show it): run it by hand.
    assert run_at("2026-11-29T09:00:00+00:00", "--logical-date=2026-11-26", "sleep_demo") == 0
    assert SlotClaim.objects.get(slot="2026-11-26").state == "succeeded"


def test_a_yearly_job_with_catch_up_100_never_crashes(transactional_db, settings, tmp_path):
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text("@yearly --catch-up=100 sleep_demo --seconds=0\n")
    assert run_at("2024-01-01T00:00:05+00:00", "sleep_demo") == 0
    assert run_at("2026-06-01T00:00:05+00:00", "sleep_demo") == 0
    assert run_at("2026-06-02T00:00:05+00:00", "sleep_demo") == 0
    runs = outcomes()
    assert [s for s, o, _ in runs if o == "succeeded"] == ["2024-01-01", "2025-01-01", "2026-01-01"]
    assert runs[-1][1] == "skipped"


def test_planning_a_far_catch_up_stops_at_the_first_claim_instead_of_raising(
    transactional_db, settings, tmp_path
):
    """`@yearly --catch-up=5000` crashed every run with OverflowError (year < 1) before the
    runner recorded anything; the walk back now stops at the job's first claim."""
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text("@yearly sleep_demo --seconds=0\n")
    assert run_at("2025-01-01T00:00:05+00:00", "sleep_demo") == 0
    plan = resolve(["sleep_demo"])
    plan.options.catch_up = 5000  # past any documented maximum: the maths must hold anyway
    now = dt.datetime(2026, 1, 1, 0, 0, 5, tzinfo=dt.UTC)
    slots = plan_slots(plan, now, ZoneInfo("UTC"))
    assert [s.key for s in slots] == ["2026-01-01"]


def test_the_claim_is_in_the_jobs_environment_and_never_in_run_jobs_own(
    transactional_db, settings, tmp_path
):
    """The claim's OPS_* variables are written in the job's child process, where no thread of
    run_job runs: adding them while a ping's getaddrinfo read the environment once crashed
    run_job (SIGSEGV in glibc's getenv, CI, Python 3.13)."""
    import os

    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    names = "OPS_JOB OPS_SLOT OPS_CLAIM_VERSION OPS_RUN_ID".split()
    code = f"import os; print(' '.join(n + '=' + os.environ[n] for n in {names!r}))"
    (tmp_path / "t.cron").write_text(f'0 9 * * * --name=env-probe shell -c "{code}"\n')
    assert run_at("2026-11-29T09:00:05+00:00", "env-probe") == 0
    run = JobRun.objects.get()
    assert f"OPS_JOB=env-probe OPS_SLOT=2026-11-29 OPS_CLAIM_VERSION=1 OPS_RUN_ID={run.pk}" in (
        run.output_tail
    )
    assert not [name for name in os.environ if name in names]


def test_call_command_inside_a_transaction_is_refused_before_anything_is_claimed(
    transactional_db, settings, tmp_path, capsys
):
    from django.db import transaction

    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    with transaction.atomic(), pytest.raises(CommandError) as refused:
        call_command("run_job", "sleep_demo", "--seconds=0")
    assert refused.value.returncode == 2
    assert "run_job cannot run inside transaction.atomic()" in capsys.readouterr().err
    assert not JobRun.objects.exists()
