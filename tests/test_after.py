"""--after: a job's slot runs only once its upstream succeeded for the same logical date."""

import datetime as dt
import time

import pytest

from .conftest import DAILY, DAILY_DATE, PING_KEY, ping_to, wait_for_line

# The upstream: says "working", hangs while the file `hang` exists, fails while `up_fails` does.
UPSTREAM = """
from django.conf import settings
print("working", flush=True)
while (settings.BASE_DIR / "hang").exists():
    time.sleep(0.05)
if (settings.BASE_DIR / "up_fails").exists():
    raise CommandError("rates feed unavailable")
print("rates imported", flush=True)
"""
# The dependent: notes that it ran.
DOWNSTREAM = """
from django.conf import settings
with open(settings.BASE_DIR / "sent.txt", "a") as f:
    f.write("sent\\n")
print("invoices sent", flush=True)
"""


def set_up(project, wait="1s"):
    project.add_command("t_rates", UPSTREAM)
    project.add_command("t_invoices", DOWNSTREAM)
    project.write_cron(
        "t.cron",
        f"{DAILY} t_rates\n{DAILY} --after=t_rates --after-wait={wait} t_invoices\n",
    )


def sent(project) -> int:
    path = project.dir / "sent.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def runs(project, job):
    return [(r[2], r[3], r[4]) for r in project.db.runs(job)]


@pytest.mark.process
def test_before_its_upstream_the_slot_waits_exits_75_and_runs_once_the_upstream_succeeded(
    project, ping_server
):
    ping_to(project, ping_server)
    set_up(project)
    early = project.run_job("t_invoices")
    assert early.returncode == 75
    assert early.stderr.splitlines() == [
        f"cronops: job t_invoices: waiting: t_rates has not succeeded for {DAILY_DATE} (waited "
        "1.0s); the next fire with --catch-up runs it"
    ]
    assert sent(project) == 0
    assert runs(project, "t_invoices") == [(str(DAILY_DATE), "waiting", 75)]
    assert [req.path for req, _ in ping_server.log] == [f"/{PING_KEY}/t_invoices/log"]
    assert project.run_job("t_rates").returncode == 0
    later = project.run_job("t_invoices")  # the same slot, as the next fire's catch-up runs it
    assert later.returncode == 0, later.stderr
    assert sent(project) == 1
    assert runs(project, "t_invoices")[-1] == (str(DAILY_DATE), "succeeded", 0)


@pytest.mark.process
def test_during_its_upstream_the_slot_waits_for_it_and_then_runs(sqlite_project):
    project = sqlite_project
    set_up(project, wait="60s")
    (project.dir / "hang").touch()
    upstream = project.popen("run_job", "t_rates")
    wait_for_line(upstream, "working")
    dependent = project.popen("run_job", "t_invoices")
    wait_for_line(dependent, "waiting up to")
    assert sent(project) == 0
    (project.dir / "hang").unlink()
    assert upstream.wait(30) == 0
    assert dependent.wait(30) == 0
    assert sent(project) == 1
    [(up_finished,)] = project.db.query(
        "SELECT finished_at FROM ops_jobrun WHERE job = 't_rates' AND outcome = 'succeeded'"
    )
    [(down_started,)] = project.db.query(
        "SELECT started_at FROM ops_jobrun WHERE job = 't_invoices' AND outcome = 'succeeded'"
    )
    assert up_finished <= down_started  # never before its upstream's success


@pytest.mark.process
def test_after_its_upstream_succeeded_the_slot_runs_at_once(sqlite_project):
    project = sqlite_project
    set_up(project)
    assert project.run_job("t_rates").returncode == 0
    result = project.run_job("t_invoices")
    assert result.returncode == 0, result.stderr
    assert "waiting" not in result.stdout + result.stderr
    assert sent(project) == 1


@pytest.mark.process
def test_a_failed_upstream_blocks_the_slot_with_a_fail_ping_until_it_succeeds(
    sqlite_project, ping_server
):
    project = sqlite_project
    ping_to(project, ping_server)
    set_up(project)
    (project.dir / "up_fails").touch()
    assert project.run_job("t_rates").returncode == 1
    blocked = project.run_job("t_invoices")
    assert blocked.returncode == 69
    assert f"blocked: t_rates did not succeed for {DAILY_DATE}; not run" in blocked.stderr
    assert sent(project) == 0
    assert runs(project, "t_invoices") == [(str(DAILY_DATE), "blocked", 69)]
    final = ping_server.log[-1][0]
    assert final.path == f"/{PING_KEY}/t_invoices/fail"
    assert "blocked: t_rates did not succeed" in final.get_data(as_text=True)
    # The upstream re-run by hand succeeds: the dependent's next run does the slot.
    (project.dir / "up_fails").unlink()
    assert project.run_job("t_rates").returncode == 0
    assert project.run_job("t_invoices").returncode == 0
    assert sent(project) == 1


def _a_cycle(project):
    """t_rates and t_invoices, each declared --after the other: the crontab.d file's path."""
    project.add_command("t_rates", UPSTREAM)
    project.add_command("t_invoices", DOWNSTREAM)
    return project.write_cron(
        "t.cron",
        f"{DAILY} --after=t_invoices t_rates\n{DAILY} --after=t_rates t_invoices\n",
    )


@pytest.mark.process
def test_a_cycle_is_refused_by_install_crontab_and_check_with_its_file_and_line(sqlite_project):
    project = sqlite_project
    path = _a_cycle(project)
    result = project.manage("check")
    assert result.returncode != 0
    assert f"{path}:1: --after makes a cycle: t_rates → t_invoices → t_rates" in result.stderr


def test_after_without_a_slot_is_a_usage_error(db, settings, tmp_path):
    from ops.run.plan import UsageError, resolve

    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "10-billing.cron").write_text("0 3 * * * charge_daily\n")
    with pytest.raises(UsageError, match="--after needs a logical date"):
        resolve(["--after=charge_daily", "sleep_demo"])
    resolve(["--after=charge_daily", "--logical-date=2026-01-05", "sleep_demo"])  # a slot: fine
    with pytest.raises(UsageError, match="--after names 't_rates', which no crontab"):
        resolve(["--after=t_rates", "--logical-date=2026-01-05", "sleep_demo"])


def set_up_catching_up(project):
    project.add_command("t_rates", UPSTREAM)
    project.add_command("t_invoices", DOWNSTREAM)
    project.write_cron(
        "t.cron",
        f"{DAILY} t_rates\n{DAILY} --after=t_rates --after-wait=30s --catch-up=2 t_invoices\n",
    )
    yesterday = DAILY_DATE - dt.timedelta(days=1)
    first = project.run_job(f"--logical-date={yesterday}", "--after-wait=0.1s", "t_invoices")
    assert first.returncode == 75
    return yesterday


@pytest.mark.process
def test_the_next_fire_with_catch_up_runs_a_waiting_slot_once_its_upstream_succeeded(
    sqlite_project,
):
    project = sqlite_project
    yesterday = set_up_catching_up(project)
    assert project.run_job(f"--logical-date={yesterday}", "t_rates").returncode == 0
    assert project.run_job("t_rates").returncode == 0
    fire = project.run_job("t_invoices")
    assert fire.returncode == 0, fire.stderr
    assert sent(project) == 2
    assert runs(project, "t_invoices")[1:] == [
        (str(yesterday), "succeeded", 0),
        (str(DAILY_DATE), "succeeded", 0),
    ]


@pytest.mark.process
def test_a_catch_up_slot_whose_upstream_is_not_done_does_not_wait(sqlite_project):
    project = sqlite_project
    yesterday = set_up_catching_up(project)
    assert project.run_job("t_rates").returncode == 0  # today's upstream, not yesterday's
    started = time.monotonic()
    fire = project.run_job("t_invoices")
    assert time.monotonic() - started < 20  # not its 30 s --after-wait
    assert fire.returncode == 75  # yesterday's slot still waits; today's ran
    assert f"waiting: t_rates has not succeeded for {yesterday} (a catch-up slot)" in fire.stderr
    assert sent(project) == 1
    # Today's success is now the catch-up floor: yesterday's slot is run by hand.
    assert project.run_job(f"--logical-date={yesterday}", "t_rates").returncode == 0
    assert project.run_job(f"--logical-date={yesterday}", "t_invoices").returncode == 0
    assert sent(project) == 2


@pytest.mark.process
def test_a_forced_rerun_blocked_by_its_upstream_leaves_the_slot_done(sqlite_project):
    """Found by the property test: --force took the claim of a done slot, the upstream had
    failed since, and the slot (recorded blocked) would have run again at the next fire."""
    project = sqlite_project
    set_up(project)
    assert project.run_job("t_rates").returncode == 0
    assert project.run_job("t_invoices").returncode == 0
    (project.dir / "up_fails").touch()
    assert project.run_job("--force", "t_rates").returncode == 1
    forced = project.run_job("--force", "t_invoices")
    assert forced.returncode == 69
    assert "the slot's earlier success stands" in forced.stderr
    assert project.db.query("SELECT state FROM ops_slotclaim WHERE job = 't_invoices'") == [
        ("succeeded",)
    ]
    again = project.run_job("t_invoices")
    assert again.returncode == 0 and "already done" in again.stdout
    assert sent(project) == 1


@pytest.mark.process
def test_an_after_given_on_the_command_line_is_held_to_crontab_d_rules(sqlite_project):
    """An unknown upstream, or the job itself, would wait --after-wait and exit 75 on every
    run: refused at once, as a crontab.d line would be, and nothing recorded."""
    project = sqlite_project
    set_up(project)
    unknown = project.run_job("--after=nosuch", "t_rates")
    assert unknown.returncode == 2
    assert "--after names 'nosuch', which no crontab.d line declares" in unknown.stderr
    itself = project.run_job("--after=t_rates", "t_rates")
    assert itself.returncode == 2
    assert "job 't_rates' cannot run --after itself" in itself.stderr
    assert project.db.runs() == []


@pytest.mark.process
def test_a_job_in_a_cycle_does_not_run_when_another_line_of_crontab_d_is_broken(
    sqlite_project,
):
    """run_job steps over another line's error: the cycle's own jobs are still refused."""
    project = sqlite_project
    path = _a_cycle(project)
    result = project.run_job("t_invoices")
    assert result.returncode == 2
    assert f"{path}:2: job t_invoices: --after makes a cycle" in result.stderr
    assert project.db.runs() == [] and sent(project) == 0


@pytest.mark.process
def test_a_job_in_a_cycle_across_files_is_refused_in_one_line_not_said_to_run_first(
    sqlite_project,
):
    """Issue 29, item 4: job-a → job-b → job-c → job-a over three files. Before, run_job
    job-a warned that job-a `is declared validly and runs`, then refused it (exit 2)."""
    project = sqlite_project
    project.add_command("t_rates", UPSTREAM)
    project.add_command("t_invoices", DOWNSTREAM)
    a = project.write_cron("10-a.cron", f"{DAILY} --name=job-a --after=job-c t_rates\n")
    project.write_cron("20-b.cron", f"{DAILY} --name=job-b --after=job-a t_invoices\n")
    project.write_cron("30-c.cron", f"{DAILY} --name=job-c --after=job-b t_rates\n")
    project.write_cron("40-d.cron", f"{DAILY} --name=job-d t_invoices\n")
    cycle = "--after makes a cycle: job-a → job-c → job-b → job-a"
    result = project.run_job("job-a")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"cronops: error: {a}:1: job job-a: {cycle}"]
    assert result.stdout == ""
    # A job outside the cycle steps over it, as over any other line's error, and says so.
    other = project.run_job("job-d")
    assert other.returncode == 0, other.stderr
    assert other.stderr.splitlines() == [
        f"cronops: warning: {a}:1: {cycle} (in: {DAILY} --name=job-a --after=job-c t_rates) "
        "(job job-d is declared validly: that error does not stop it)"
    ]
    assert [(r[0], r[3]) for r in project.db.runs()] == [("job-d", "succeeded")]


# Issue 29, item 5: the same days, spelt differently (the three pairs first), and cron's
# rule that a day matching either restricted day field fires.
SAME_DAYS = [
    ("0 2 * * mon-fri", "0 3 * * 1-5"),
    ("0 2 * * 0", "0 3 * * 7"),
    ("0 2 */1 * *", "0 3 * * *"),
    ("0 2 * * sun,mon,tue,wed,thu,fri,sat", "0 3 * * *"),
    ("0 2 1-31 * 1", "0 3 * * *"),  # both restricted: any day of the month, or a Monday
    ("0 2 */1 * 1", "0 3 * * mon"),  # day of month starts with `*`: Mondays only
    ("0 2 * * 1-5", "0 3 * * 1"),  # every weekday covers each Monday the job runs
    ("0 2 1 * 1", "0 3 1 * mon"),
]
OTHER_DAYS = [
    ("0 2 * * 1-5", "0 3 * * *", "Sunday 1 January"),
    ("0 2 * * 1", "0 3 1 * 1", "Sunday 1 January"),  # the job also runs on the 1st
    ("0 2 1-30 * *", "0 3 * * *", "Sunday 31 January"),
    ("0 2 * 1-11 *", "0 3 * * *", "Sunday 1 December"),
]


@pytest.mark.parametrize("upstream, dependent", SAME_DAYS)
def test_an_upstream_on_the_same_days_spelt_differently_lines_up(upstream, dependent, tmp_path):
    from ops.schedule.crontabd import load_schedule

    (tmp_path / "t.cron").write_text(
        f"{upstream} --name=rates sleep_demo\n{dependent} --after=rates clearsessions\n"
    )
    schedule = load_schedule(tmp_path)
    assert [job.name for job in schedule.jobs] == ["rates", "clearsessions"]


@pytest.mark.parametrize("upstream, dependent, missed", OTHER_DAYS)
def test_an_upstream_missing_a_day_the_job_runs_is_refused_naming_such_a_day(
    upstream, dependent, missed, tmp_path
):
    from ops.schedule.crontabd import CrontabError, load_schedule

    path = tmp_path / "t.cron"
    path.write_text(
        f"{upstream} --name=rates sleep_demo\n{dependent} --after=rates clearsessions\n"
    )
    with pytest.raises(CrontabError) as refused:
        load_schedule(tmp_path)
    assert str(refused.value).startswith(
        f"{path}:2: --after rates: its schedule `{upstream}` does not run on every day this "
        f"job's `{dependent}` runs (not on a {missed}, for one)"
    )


@pytest.mark.process
def test_a_catch_up_slot_still_waiting_does_not_fail_the_final_ping(sqlite_project, ping_server):
    project = sqlite_project
    set_up_catching_up(project)
    assert project.run_job("t_rates").returncode == 0
    ping_to(project, ping_server)
    project.run_job("t_invoices")
    final = ping_server.log[-1][0].path
    assert final.endswith("/t_invoices"), final  # a success: today's slot ran; yesterday's waits
