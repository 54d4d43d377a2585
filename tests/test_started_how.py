"""Runs can be told apart: each records how it was started (issue 32; ops/run/origin.py). By
cron: tests/test_cron_e2e.py, under the real daemon; from the Jobs page through its real view:
tests/test_run_now.py. Here: by hand (at a terminal or not), retries, catch-up slots, and what
job_status, job_history and JobRun.started_how show of it."""

import datetime as dt
import json
import os
import pty
import pwd
import subprocess

import pytest

from ops.models import JobRun, Trigger

from .conftest import DAILY, DAILY_DATE, base_env

ME = pwd.getpwuid(os.getuid()).pw_name


def run_detached(project, *args) -> subprocess.CompletedProcess:
    """run_job by hand with no terminal (a session of its own, as `ssh host cmd` or a script)."""
    return subprocess.run(
        project.command("run_job", *args),
        cwd=project.dir,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )


def run_at_a_terminal(project, *args) -> tuple[int, str]:
    """run_job by hand at a terminal: a pseudo-terminal is its session's controlling terminal."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        try:
            os.chdir(project.dir)
            os.execve(project.command()[0], project.command("run_job", *args), base_env())
        finally:
            os._exit(127)
    output = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not chunk:
            break
        output += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


def origins(project, job: str) -> list[tuple]:
    return project.db.query(
        "SELECT trigger, started_by, attempt, outcome FROM ops_jobrun WHERE job = ? ORDER BY id",
        (job,),
    )


@pytest.mark.process
def test_a_run_by_hand_records_the_os_user_and_whether_it_came_from_a_terminal(sqlite_project):
    project = sqlite_project
    project.write_cron("t.cron", f"{DAILY} --name=report sleep_demo --seconds=0\n")
    detached = run_detached(project, "report")
    assert detached.returncode == 0, detached.stderr
    code, printed = run_at_a_terminal(project, "--force", "report")
    assert code == 0, printed
    assert origins(project, "report") == [
        ("hand", ME, 1, "succeeded"),
        ("terminal", ME, 1, "succeeded"),
    ]
    document = json.loads(project.manage("job_status", "--json", "--job", "report").stdout)
    last = document["jobs"][0]["last_run"]
    assert (last["trigger"], last["started_by"], last["started_how"]) == (
        "terminal",
        ME,
        f"{ME}, terminal",
    )
    history = project.manage("job_history", "--job", "report").stdout.splitlines()
    assert history[0].split()[-3:] == ["started", "by", "note"]
    assert f"{ME}, terminal" in history[1] and f"{ME}, no terminal" in history[2]


@pytest.mark.process
def test_attempts_after_the_first_are_recorded_as_retries(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_flaky",
        """
        from django.conf import settings
        path = settings.BASE_DIR / "attempts.txt"
        n = len(path.read_text().splitlines()) + 1 if path.exists() else 1
        path.write_text("x\\n" * n)
        if n < 3:
            raise CommandError(f"transient failure {n}", returncode=75)
        """,
    )
    project.write_cron("t.cron", f"{DAILY} --retries=2 --retry-delay=0.1s t_flaky\n")
    result = run_detached(project, "t_flaky")
    assert result.returncode == 0, result.stderr
    assert origins(project, "t_flaky") == [
        ("hand", ME, 1, "failed"),
        ("retry", ME, 2, "failed"),
        ("retry", ME, 3, "succeeded"),
    ]


@pytest.mark.process
def test_earlier_slots_run_by_catch_up_are_recorded_as_catch_up(project):
    project.write_cron("10-billing.cron", f"{DAILY} --catch-up=3 charge_daily\n")
    assert project.manage("seed_demo").returncode == 0
    first = DAILY_DATE - dt.timedelta(days=3)
    assert run_detached(project, f"--logical-date={first}", "charge_daily").returncode == 0
    result = run_detached(project, "charge_daily")
    assert result.returncode == 0, result.stderr
    rows = project.db.query(
        "SELECT logical_date, trigger FROM ops_jobrun WHERE job = 'charge_daily' ORDER BY id"
    )
    assert [(str(day), trigger) for day, trigger in rows] == [
        (str(first), "hand"),
        (str(first + dt.timedelta(days=1)), "catch_up"),
        (str(first + dt.timedelta(days=2)), "catch_up"),
        (str(DAILY_DATE), "hand"),
    ]


@pytest.mark.parametrize(
    ("trigger", "started_by", "attempt", "says"),
    [
        (Trigger.CRON, "", 1, "cron"),
        (Trigger.TERMINAL, "alice", 1, "alice, terminal"),
        (Trigger.HAND, "alice as app", 1, "alice as app, no terminal"),
        (Trigger.PAGE, "alice", 1, "alice (Jobs page)"),
        (Trigger.RETRY, "", 3, "retry, attempt 3"),
        (Trigger.CATCH_UP, "", 1, "catch-up"),
        ("", "alice", 1, "alice (Jobs page)"),  # before ops 0011, only the Jobs page said who
        ("", "", 1, "-"),
        (Trigger.PAGE, "a.very.long.username@example.com", 1, "a.very.long.usern… (Jobs page)"),
    ],
)
def test_started_how_says_how_a_run_was_started_in_at_most_30_characters(
    trigger, started_by, attempt, says
):
    run = JobRun(trigger=trigger, started_by=started_by, attempt=attempt)
    assert run.started_how == says
    assert len(run.started_how) <= 30
