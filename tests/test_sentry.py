"""Sentry Crons check-ins (issue 30): real run_job processes against a recording Sentry ingest
endpoint on 127.0.0.1 (tests/sentryserver.py), which reads every envelope with Sentry's own SDK
and holds every check-in to Relay's and Sentry's rules."""

import datetime as dt
import signal
import socket
import time
import uuid

import pytest

from .conftest import DAILY, DAILY_DATE, PING_KEY, wait_for_line, wait_until
from .sentryserver import SentryRecorder

SLEEPY = """
time.sleep(float(os.environ.get("SLEEP", "0.2")))
print("done", flush=True)
"""


@pytest.fixture
def sentry(httpserver):
    recorder = SentryRecorder(httpserver)
    yield recorder
    recorder.release.set()


def sentry_to(project, recorder, **extra):
    project.write_env(SENTRY_DSN=recorder.dsn, **extra)


def a_run(recorder, count: int = 2) -> list[dict]:
    assert recorder.problems == [], recorder.problems
    assert len(recorder.check_ins) == count, recorder.statuses()
    return recorder.check_ins


def test_a_run_that_succeeds_is_in_progress_then_ok_with_its_duration_and_monitor_config(
    sqlite_project, sentry
):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command("t_job", SLEEPY)
    project.write_cron("t.cron", f"{DAILY} --timeout=10m t_job\n")
    result = project.run_job("t_job")
    assert result.returncode == 0, result.stderr
    started, ended = a_run(sentry)
    assert (started["status"], ended["status"]) == ("in_progress", "ok")
    assert started["check_in_id"] == ended["check_in_id"]
    [(rid,)] = project.db.query("SELECT rid FROM ops_jobrun")
    assert uuid.UUID(rid).hex == started["check_in_id"]  # the history's rid, the pings' too
    assert "duration" not in started and 0.2 <= ended["duration"] < 60
    assert started["monitor_slug"] == ended["monitor_slug"] == "t_job"
    assert "environment" not in started  # Sentry's default: production
    # The monitor as sync_healthchecks would make its check: the schedule, TIME_ZONE, the grace
    # (10 minutes: the timeout) as the margin, the timeout as the maximum runtime.
    assert (
        ended["monitor_config"]
        == started["monitor_config"]
        == {
            "schedule": {"type": "crontab", "value": DAILY},
            "timezone": "UTC",
            "checkin_margin": 10,
            "max_runtime": 10,
        }
    )
    assert sentry.key not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("line", "env", "code"),
    [
        ("t_job", {"FAIL": "3"}, 3),
        ("--timeout=1s t_job", {"SLEEP": "30"}, 124),
    ],
    ids=["exit 3", "a timeout"],
)
def test_a_failure_or_a_timeout_closes_the_run_with_error(sqlite_project, sentry, line, env, code):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command(
        "t_job", "if os.environ.get('FAIL'): raise CommandError('kaput', returncode=3)\n" + SLEEPY
    )
    project.write_cron("t.cron", f"{DAILY} {line}\n")
    result = project.run_job("t_job", env=env)
    assert result.returncode == code, result.stderr
    started, ended = a_run(sentry)
    assert (started["status"], ended["status"]) == ("in_progress", "error")
    assert started["check_in_id"] == ended["check_in_id"]
    if code == 124:
        assert 1 <= ended["duration"] < 30


def test_sigterm_closes_the_run_with_error(sqlite_project, sentry):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command("t_job", 'print("working", flush=True)\ntime.sleep(60)')
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    proc = project.popen("run_job", "t_job")
    wait_for_line(proc, "working")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert [s for _, s in sentry.statuses()] == ["in_progress", "error"]
    assert sentry.problems == []


def test_a_retry_that_succeeds_is_one_run_closed_ok(sqlite_project, sentry, tmp_path):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command(
        "t_job",
        """
        marker = os.path.join(os.environ["MARKS"], "failed-once")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise CommandError("first attempt fails", returncode=75)
        print("second attempt", flush=True)
        """,
    )
    project.write_cron("t.cron", f"{DAILY} --retries=2 --retry-delay=1s t_job\n")
    result = project.run_job("t_job", env={"MARKS": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    started, ended = a_run(sentry)
    assert (started["status"], ended["status"]) == ("in_progress", "ok")
    assert started["check_in_id"] == ended["check_in_id"]
    assert ended["duration"] >= 1  # the retry's wait is the run's


def test_catch_up_is_one_run_and_skips_and_pauses_send_nothing(sqlite_project, sentry):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command("t_job", "print('ran')")
    project.write_cron("t.cron", f"{DAILY} --catch-up=3 t_job\n")
    first = project.run_job(f"--logical-date={DAILY_DATE - dt.timedelta(days=3)}", "t_job")
    assert first.returncode == 0, first.stderr
    assert len(a_run(sentry)) == 2
    caught_up = project.run_job("t_job")  # two missed days, then the current slot
    assert caught_up.returncode == 0, caught_up.stderr
    assert [r[3] for r in project.db.runs()] == ["succeeded"] * 4
    statuses = sentry.statuses()[2:]
    assert [s for _, s in statuses] == ["in_progress", "ok"]  # one run: the current slot's
    assert statuses[0][0] == statuses[1][0]
    # the slot already done, a run by hand of a paused job, a run without monitors: nothing
    assert "already done" in project.run_job("t_job").stdout
    paused = project.manage("job_pause", "t_job", "--reason=maintenance")
    assert paused.returncode == 0, paused.stderr
    assert "Sentry: the monitor 't_job' is not paused (a DSN cannot pause it)" in paused.stdout
    nine_days_ago = f"--logical-date={DAILY_DATE - dt.timedelta(days=9)}"
    assert "paused" in project.run_job(nine_days_ago, "t_job").stdout
    assert project.manage("job_resume", "t_job").returncode == 0
    assert project.run_job("--no-ping", "--force", "t_job").returncode == 0
    assert len(sentry.check_ins) == 4 and sentry.problems == []


def test_a_command_without_a_schedule_sends_no_monitor_config_and_the_environment_is_sent(
    sqlite_project, sentry
):
    project = sqlite_project
    sentry_to(project, sentry, SENTRY_ENVIRONMENT="staging")
    result = project.run_job("sleep_demo", "--seconds=0")  # not declared in crontab.d
    assert result.returncode == 0, result.stderr
    started, ended = a_run(sentry)
    assert "monitor_config" not in started and "monitor_config" not in ended
    assert started["environment"] == ended["environment"] == "staging"


def test_ops_sentry_dsn_set_empty_keeps_the_projects_sentry_dsn_from_the_monitors(
    sqlite_project, sentry
):
    project = sqlite_project
    sentry_to(project, sentry, OPS_SENTRY_DSN="")
    project.write_cron("t.cron", f"{DAILY} sleep_demo --seconds=0\n")
    assert project.run_job("sleep_demo").returncode == 0
    assert sentry.requests == []


def test_a_bad_dsn_is_one_line_exit_2_and_never_shows_its_key(sqlite_project):
    project = sqlite_project
    project.write_env(SENTRY_DSN="https://s3cretpublickey@sentry.example.com/not-a-project")
    result = project.run_job("sleep_demo", "--seconds=0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "cronops: error: SENTRY_DSN: the value does not end with a project id "
        "(https://<key>@<host>/<project id>)"
    ]
    assert project.db.runs() == []
    check = project.manage("check")
    assert "ops.E006" in check.stderr and "s3cretpublickey" not in check.stderr


def test_no_secret_reaches_sentry(sqlite_project, sentry):
    project = sqlite_project
    sentry_to(project, sentry, HEALTHCHECKS_PING_KEY=PING_KEY)
    project.add_command(
        "t_job", "print(os.environ['SECRET_KEY'], os.environ['SENTRY_DSN'])\nraise SystemExit(1)"
    )
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    result = project.run_job("t_job")
    assert result.returncode == 1
    sent = b"".join(body for _, body in sentry.requests)
    for secret in (project.settings["SECRET_KEY"], PING_KEY):
        assert secret.encode() not in sent
    assert sentry.key in result.stdout  # the job's own output to cron's log stays the job's
    [(tail,)] = project.db.query("SELECT output_tail FROM ops_jobrun")
    assert sentry.key not in tail and "<redacted the Sentry DSN>" in tail


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("failure", ["hold", "429", "500", "refused"])
def test_a_broken_sentry_endpoint_never_changes_the_exit_code_and_costs_at_most_the_budget(
    sqlite_project, sentry, tmp_path, failure
):
    project = sqlite_project
    budget = 3
    dsn = sentry.dsn
    if failure == "refused":
        dsn = dsn.replace(f":{sentry.server.port}/", f":{_closed_port()}/")
    else:
        sentry.mode = failure
    project.write_env(SENTRY_DSN=dsn, OPS_PING_BUDGET_SECONDS=budget)
    stamp = tmp_path / "started"
    project.add_command(
        "t_job", "open(os.environ['STAMP'], 'w').close()\nraise CommandError('no', returncode=3)"
    )
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    proc = project.popen("run_job", "t_job", env={"STAMP": str(stamp)})
    out, err = proc.communicate(timeout=120)
    ended = time.time()
    assert proc.returncode == 3, err
    # "hold" never answers its in_progress: the job ran while it was still unanswered.
    assert stamp.exists(), "the job never started"
    [(finished,)] = project.db.query("SELECT finished_at FROM ops_jobrun")
    finished = dt.datetime.fromisoformat(str(finished)).replace(tzinfo=dt.UTC).timestamp()
    # From the record to run_job's end: the final check-in's budget (with room for a loaded
    # machine's process exit). Unbounded, a black hole costs 5 s an attempt, three attempts.
    assert ended - finished < budget + 4, f"{ended - finished:.1f} s after the record"
    said = "rate-limited by Sentry (HTTP 429, retry after 60 s)" if failure == "429" else "failed ("
    assert "job t_job: Sentry " in err and said in err, err
    assert sentry.key not in out + err
    assert [r[3:5] for r in project.db.runs()] == [("failed", 3)]


def test_a_projects_own_sentry_still_gets_the_jobs_exception_and_logged_errors(
    sqlite_project, sentry
):
    """A project whose settings call sentry_sdk.init: an exception its command lets out reached
    Sentry through the interpreter's excepthook when the command ran alone. In run_job's child
    it is caught, and os._exit skipped the SDK's queue: both are handled there now."""
    project = sqlite_project
    sentry_to(project, sentry, OPS_SENTRY_DSN="")  # the project's errors only, no check-ins
    settings = project.dir / "config" / "settings.py"
    settings.write_text(
        settings.read_text()
        + "\nimport sentry_sdk\nsentry_sdk.init(dsn=os.environ['SENTRY_DSN'])\n"
    )
    project.add_command(
        "t_job",
        "import logging\nlogging.getLogger('shop').error('a logged error')\n"
        "raise RuntimeError('the job broke')",
    )
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    result = project.run_job("t_job")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "RuntimeError: the job broke" in result.stderr

    def reported():
        texts = [str(e) for e in sentry.events]
        return any("the job broke" in t for t in texts) and any(
            "a logged error" in t for t in texts
        )

    wait_until(reported, "the project's two events at its Sentry", timeout=10)
    assert sentry.check_ins == []


def test_a_job_name_longer_than_a_sentry_slug_is_a_warning_with_sentry_on(
    settings, tmp_path, monkeypatch
):
    from ops.checks import check_crontabd

    monkeypatch.setattr("sys.argv", ["manage.py", "check"])  # the command that reads crontab.d
    settings.OPS_CRONTAB_DIR = tmp_path
    name = "nightly-export-of-every-invoice-to-the-accounting-system"  # 55 characters
    (tmp_path / "t.cron").write_text(f"0 3 * * * --name={name} sleep_demo --seconds=0\n")
    settings.SENTRY_DSN = ""
    assert [m.id for m in check_crontabd() if m.id == "ops.W011"] == []
    settings.SENTRY_DSN = f"https://{'k' * 32}@o1.ingest.sentry.io/7"
    [warning] = [m for m in check_crontabd() if m.id == "ops.W011"]
    assert "longer than 50 characters (nightly-export-of-ev…)" in warning.msg
    assert "k" * 32 not in warning.msg + warning.hint
