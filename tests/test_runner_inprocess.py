"""The runner in-process with a fake clock: logical dates on DST days, end to end through the DB."""

import datetime as dt

import time_machine
from django.core.management import call_command

from commands.models import DailyCharge
from ops import runner
from ops.models import JobRun, SlotClaim


def run_at(instant: str, *argv: str) -> int:
    with time_machine.travel(instant, tick=False):
        return runner.run(list(argv))


def test_the_billing_charges_the_moscow_date_when_cron_fires_at_0030_moscow_time(
    db, settings, tmp_path
):
    settings.TIME_ZONE = "Europe/Moscow"
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "b.cron").write_text("30 0 * * * charge_daily\n")
    call_command("seed_demo")
    assert run_at("2026-11-28T21:30:05+00:00", "charge_daily") == 0
    dates = set(DailyCharge.objects.values_list("charge_date", flat=True))
    assert dates == {dt.date(2026, 11, 29)}  # UTC says Nov 28; the business day is Nov 29


def test_the_repeated_autumn_hour_does_not_run_a_job_twice_in_berlin(db, settings, tmp_path):
    settings.TIME_ZONE = "Europe/Berlin"
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text("*/30 * * * * sleep_demo --seconds=0\n")
    # cron fires the wildcard job at 02:30 CEST and again at 02:30 CET.
    assert run_at("2026-10-25T02:30:02+02:00", "sleep_demo") == 0
    assert run_at("2026-10-25T02:30:02+01:00", "sleep_demo") == 0
    runs = list(JobRun.objects.order_by("id").values_list("slot", "outcome", "note"))
    assert runs == [
        ("2026-10-25 02:30", "succeeded", ""),
        ("2026-10-25 02:30", "skipped", "already done for 2026-10-25 02:30"),
    ]


def test_the_skipped_spring_hour_still_runs_the_0230_job_once_that_day(db, settings, tmp_path):
    settings.TIME_ZONE = "Europe/Berlin"
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text("30 2 * * * sleep_demo --seconds=0\n")
    assert run_at("2026-03-29T03:00:03+02:00", "sleep_demo") == 0  # cron runs it after the jump
    assert run_at("2026-03-29T09:00:00+02:00", "sleep_demo") == 0  # a manual re-run: no-op
    claims = list(SlotClaim.objects.values_list("logical_date", "state"))
    assert [(str(d), s) for d, s in claims] == [("2026-03-29", "succeeded")]
    assert JobRun.objects.filter(outcome="skipped").count() == 1


def test_catch_up_after_three_missed_days_with_a_fake_clock(db, settings, tmp_path):
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


def test_run_job_works_through_call_command_too(db, settings, tmp_path):
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    call_command("run_job", "--timeout=90s", "sleep_demo")
    run = JobRun.objects.get()
    assert (run.job, run.outcome, run.command) == ("sleep_demo", "succeeded", "sleep_demo")
