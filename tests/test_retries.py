"""--retries: failed attempts run again within the slot's claim (ops/run/retries.py)."""

import json
import os
import signal

import pytest

from ops.run.retries import JITTER, MAX_BACKOFF, backoff
from ops.schedule.options import OptionsError, parse_run_args

from .conftest import DAILY, PING_KEY, ping_to, wait_for_line

# Fails ($CODE, default 75) for its first $FAILS attempts (default 2), then succeeds; each
# attempt appends its pid to attempts.txt.
FLAKY = """
from django.conf import settings
path = settings.BASE_DIR / "attempts.txt"
n = len(path.read_text().splitlines()) + 1 if path.exists() else 1
with open(path, "a") as f:
    f.write(f"{os.getpid()}\\n")
print(f"attempt {n}", flush=True)
if n <= int(os.environ.get("FAILS", "2")):
    raise CommandError(f"transient failure {n}", returncode=int(os.environ.get("CODE", "75")))
print("all good", flush=True)
"""


def attempts_of(project, job="t_flaky"):
    return project.db.query(
        "SELECT attempt, outcome, exit_code, rid FROM ops_jobrun WHERE job = ? ORDER BY id", (job,)
    )


def job_state(project, job="t_flaky") -> str:
    result = project.manage("job_status", "--json", "--job", job)
    return json.loads(result.stdout)["jobs"][0]["state"]


def pings(server):
    return [req.path.removeprefix(f"/{PING_KEY}/") for req, _ in server.log]


@pytest.mark.process
def test_a_job_failing_twice_then_succeeding_with_retries_3_makes_3_attempts_and_one_success_ping(
    project, ping_server
):
    ping_to(project, ping_server)
    project.add_command("t_flaky", FLAKY)
    project.write_cron("t.cron", f"{DAILY} --retries=3 --retry-delay=0.1s t_flaky\n")
    result = project.run_job("t_flaky")
    assert result.returncode == 0, result.stderr
    rows = attempts_of(project)
    assert [r[:3] for r in rows] == [(1, "failed", 75), (2, "failed", 75), (3, "succeeded", 0)]
    assert len({r[3] for r in rows}) == 1  # one rid: one run for healthchecks.io
    assert "attempt 1 of 4 failed (exit 75); attempt 2 in" in result.stderr
    assert "succeeded at attempt 3 of 4; earlier attempts: exit 75, exit 75" in result.stdout
    assert pings(ping_server) == ["t_flaky/start", "t_flaky"]  # no /fail, no /75
    body = ping_server.log[-1][0].get_data(as_text=True)
    assert "earlier attempts: exit 75, exit 75" in body and "all good" in body
    assert f"rid={rows[0][3]}" in ping_server.log[-1][0].query_string.decode()
    # The slot is done: its claim holds the last attempt, and a second fire does nothing.
    [(state, run_id)] = project.db.query("SELECT state, run_id FROM ops_slotclaim")
    last = project.db.query("SELECT max(id) FROM ops_jobrun")[0][0]
    assert (state, run_id) == ("succeeded", last)
    assert job_state(project) == "ok"  # the slot is judged by its last attempt
    again = project.run_job("t_flaky")
    assert again.returncode == 0 and "already done" in again.stdout
    assert len((project.dir / "attempts.txt").read_text().splitlines()) == 3


@pytest.mark.process
def test_an_exit_code_that_retry_on_does_not_name_is_not_retried(sqlite_project, ping_server):
    project = sqlite_project
    ping_to(project, ping_server)
    project.add_command("t_flaky", FLAKY)
    project.write_cron("t.cron", f"{DAILY} --retries=3 --retry-delay=0.1s --retry-on=75 t_flaky\n")
    result = project.run_job("t_flaky", env={"CODE": "1"})
    assert result.returncode == 1
    assert "exit 1 is not retried (--retry-on=75)" in result.stderr
    assert [r[:3] for r in attempts_of(project)] == [(1, "failed", 1)]
    assert pings(ping_server) == ["t_flaky/start", "t_flaky/1"]


@pytest.mark.process
def test_sigterm_during_the_backoff_ends_the_run_at_once_with_143_and_one_line(
    sqlite_project, ping_server
):
    project = sqlite_project
    ping_to(project, ping_server)
    project.add_command("t_flaky", FLAKY)
    project.write_cron("t.cron", f"{DAILY} --retries=3 --retry-delay=30s t_flaky\n")
    proc = project.popen("run_job", "t_flaky", env={"FAILS": "9"})
    wait_for_line(proc, "attempt 2 in", stream="stderr")
    # Between attempts the next attempt holds the claim: running, not failing.
    assert job_state(project) == "running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 143  # long before the 30 s backoff
    rest = proc.stderr.read()
    assert rest.splitlines() == [
        "cronops: job t_flaky: terminated by SIGTERM while waiting to retry"
    ]
    rows = attempts_of(project)
    assert [r[:3] for r in rows] == [(1, "failed", 75), (2, "terminated", 143)]
    assert project.db.query("SELECT state FROM ops_slotclaim") == [("terminated",)]
    assert pings(ping_server) == ["t_flaky/start", "t_flaky/143"]
    # Nothing left running: the one attempt that ran is gone.
    for pid in (project.dir / "attempts.txt").read_text().split():
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


@pytest.mark.process
def test_an_attempt_ended_by_its_timeout_is_retried(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_slow_once",
        """
        from django.conf import settings
        path = settings.BASE_DIR / "attempts.txt"
        first = not path.exists()
        path.write_text("x")
        if first:
            time.sleep(60)  # ended by --timeout
        print("fast this time", flush=True)
        """,
    )
    project.write_cron(
        "t.cron", f"{DAILY} --timeout=1s --retries=1 --retry-delay=0.1s t_slow_once\n"
    )
    result = project.run_job("t_slow_once")
    assert result.returncode == 0, result.stderr
    assert "attempt 1 of 2 failed (exit 124)" in result.stderr
    assert [r[:3] for r in attempts_of(project, "t_slow_once")] == [
        (1, "timed_out", 124),
        (2, "succeeded", 0),
    ]


@pytest.mark.process
def test_no_retry_would_start_after_the_jobs_next_fire_time(sqlite_project):
    """An every-minute job with a 2-minute backoff: its next fire always comes first."""
    project = sqlite_project
    project.add_command("t_flaky", FLAKY)
    project.write_cron("t.cron", "* * * * * --retries=3 --retry-delay=2m t_flaky\n")
    result = project.run_job("t_flaky")
    assert result.returncode == 75
    assert "no retry: the next fire (" in result.stderr
    assert [r[:3] for r in attempts_of(project)] == [(1, "failed", 75)]


def test_the_backoff_doubles_with_jitter_and_is_bounded():
    assert backoff(1, 60, rand=lambda: 0) == 60
    assert backoff(2, 60, rand=lambda: 0) == 120
    assert backoff(3, 60, rand=lambda: 1) == pytest.approx(240 * (1 + JITTER))
    assert backoff(10, 60, rand=lambda: 1) == MAX_BACKOFF
    assert backoff(10**6, 1e6, rand=lambda: 1) == MAX_BACKOFF


def test_retry_options_are_parsed_and_bounded():
    opts = parse_run_args(["--retries=3", "--retry-delay=30s", "--retry-on=75,1,75", "x"])
    assert (opts.retries, opts.retry_delay, opts.retry_on) == (3, 30.0, (1, 75))
    for bad in ("--retries=11", "--retries=-1", "--retry-on=0", "--retry-on=256", "--retry-on="):
        with pytest.raises(OptionsError):
            parse_run_args([bad, "x"])


def test_failures_and_timeouts_are_retried_signals_and_takeovers_never():
    from ops.models import Outcome
    from ops.run.retries import Attempts
    from ops.run.supervisor import Ended

    attempts = Attempts(limit=2, delay=1.0, codes=None)
    assert attempts.why_not(Ended(Outcome.FAILED, 1, ""), signalled=False) is None
    assert attempts.why_not(Ended(Outcome.TIMED_OUT, 124, ""), signalled=False) is None
    assert attempts.why_not(Ended(Outcome.TERMINATED, 143, ""), signalled=True) == ""
    assert attempts.why_not(Ended(Outcome.TAKEN_OVER, 75, ""), signalled=False) == ""
    assert attempts.why_not(Ended(Outcome.FAILED, 1, ""), signalled=True) == ""  # came meanwhile
    attempts.number = 3  # the last of 1 + 2
    assert attempts.why_not(Ended(Outcome.FAILED, 1, ""), signalled=False) == ""
    only = Attempts(limit=2, delay=1.0, codes=(75, 124))
    assert only.why_not(Ended(Outcome.TIMED_OUT, 124, ""), signalled=False) is None
    assert "not retried (--retry-on=75,124)" in only.why_not(
        Ended(Outcome.FAILED, 1, ""), signalled=False
    )


@pytest.mark.process
def test_with_quiet_a_failure_a_retry_fixed_prints_nothing(sqlite_project):
    """--quiet is chronic's promise: nothing for cron to mail when the run succeeds."""
    project = sqlite_project
    project.add_command("t_flaky", FLAKY)
    project.write_cron("t.cron", f"{DAILY} --quiet --retries=3 --retry-delay=0.1s t_flaky\n")
    result = project.run_job("t_flaky")
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")
    assert [r[:3] for r in attempts_of(project)][-1] == (3, "succeeded", 0)
