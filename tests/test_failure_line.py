"""A failed run says why: one `cronops:` line naming the job, its exit code (or signal) and the
last line its command wrote to stderr, redacted and bounded; the history keeps those words and
job_status shows them (issue 32; ops/run/failure.py)."""

import json

import pytest

from .conftest import DAILY

pytestmark = pytest.mark.process

SMTP = """
sys.stderr.write("connecting to the SMTP host\\n")
from django.conf import settings
sys.stderr.write("error: no SMTP host (key " + settings.SECRET_KEY + ")\\n")
sys.stderr.flush()
print("some stdout after it", flush=True)
sys.exit(3)
"""


def cronops_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("cronops:")]


def test_a_failed_run_prints_one_line_with_its_exit_code_and_last_stderr_line_redacted(
    sqlite_project,
):
    project = sqlite_project
    project.add_command("t_smtp", SMTP)
    result = project.run_job("--no-ping", "t_smtp")
    assert result.returncode == 3
    said = "error: no SMTP host (key <redacted SECRET_KEY>)"
    assert cronops_lines(result.stderr) == [f"cronops: job t_smtp: failed (exit 3): {said}"]
    assert project.settings["SECRET_KEY"] not in result.stderr.split("cronops:")[-1]
    [(outcome, code, note)] = [r[3:6] for r in project.db.runs("t_smtp")]
    assert (outcome, code, note) == ("failed", 3, said)


def test_job_status_shows_the_failing_jobs_error_line_not_its_exit_code_twice(sqlite_project):
    project = sqlite_project
    project.add_command("t_smtp", SMTP)
    project.write_cron("t.cron", f"{DAILY} --name=send_reminders t_smtp\n")
    for _ in range(2):
        assert project.run_job("--no-ping", "--force", "send_reminders").returncode == 3
    said = "error: no SMTP host (key <redacted SECRET_KEY>)"
    reason = f"last run failed (exit 3), 2 failures in a row: {said}"
    text = project.manage("job_status", "--job", "send_reminders")
    assert text.returncode == 1, text.stderr
    assert f"send_reminders: failing: {reason}" in text.stdout.splitlines()
    document = json.loads(project.manage("job_status", "--json", "--job", "send_reminders").stdout)
    [job] = document["jobs"]
    assert (job["state"], job["reason"], job["last_run"]["note"]) == ("failing", reason, said)


def test_a_failure_that_wrote_nothing_on_stderr_says_so(sqlite_project):
    project = sqlite_project
    project.add_command("t_quiet_exit", "print('all on stdout', flush=True); sys.exit(3)")
    result = project.run_job("--no-ping", "t_quiet_exit")
    assert result.returncode == 3
    assert cronops_lines(result.stderr) == [
        "cronops: job t_quiet_exit: failed (exit 3); nothing on stderr"
    ]
    assert [r[5] for r in project.db.runs()] == ["nothing on stderr"]


def test_a_job_killed_by_a_signal_names_the_signal_and_its_last_stderr_line(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_killed",
        "sys.stderr.write('loading 2 GB\\n'); sys.stderr.flush(); os.kill(os.getpid(), 9)",
    )
    result = project.run_job("--no-ping", "t_killed")
    assert result.returncode == 137
    assert cronops_lines(result.stderr) == [
        "cronops: job t_killed: failed (killed by SIGKILL): loading 2 GB"
    ]
    assert [r[5] for r in project.db.runs()] == ["the job was killed by SIGKILL: loading 2 GB"]


def test_a_timed_out_job_names_the_exit_code_and_its_last_stderr_line(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_stuck",
        "sys.stderr.write('waiting for the gateway\\n'); sys.stderr.flush(); time.sleep(60)",
    )
    result = project.run_job("--no-ping", "--timeout=1s", "t_stuck")
    assert result.returncode == 124
    assert cronops_lines(result.stderr) == [
        "cronops: job t_stuck: timed out after 1s (exit 124): waiting for the gateway"
    ]
    assert [r[5] for r in project.db.runs()] == ["timed out after 1s: waiting for the gateway"]


def test_the_line_is_bounded_and_an_exception_is_named_by_its_last_traceback_line(
    sqlite_project,
):
    project = sqlite_project
    project.add_command("t_long", "sys.stderr.write('x' * 50000 + '\\n'); sys.exit(5)")
    project.add_command("t_raise", "raise ValueError('no SMTP host')")
    long = project.run_job("--no-ping", "t_long")
    [line] = cronops_lines(long.stderr)
    assert line.startswith("cronops: job t_long: failed (exit 5): xxx") and line.endswith("…")
    assert len(line) < 260
    raised = project.run_job("--no-ping", "t_raise")
    assert raised.returncode == 1
    assert cronops_lines(raised.stderr) == [
        "cronops: job t_raise: failed (exit 1): ValueError: no SMTP host"
    ]


def test_quiet_prints_the_failure_line_after_the_output_and_nothing_on_success(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_maybe",
        """
        print("noise from the job", flush=True)
        if os.environ.get("FAIL"):
            raise CommandError("it failed", returncode=4)
        """,
    )
    ok = project.run_job("--quiet", "--no-ping", "t_maybe")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "", "")
    bad = project.run_job("--quiet", "--no-ping", "t_maybe", env={"FAIL": "1"})
    assert bad.returncode == 4
    assert cronops_lines(bad.stderr) == [
        "cronops: job t_maybe: failed (exit 4): CommandError: it failed"
    ]


def test_a_coloured_error_line_reads_without_its_escape_codes(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_colour",
        "sys.stderr.write('\\x1b[31mERROR\\x1b[0m: \\x1b[1mdisk full\\x1b[0m\\n\\x1b[0m\\n')\n"
        "sys.exit(3)\n",
    )
    result = project.run_job("--no-ping", "t_colour")
    assert result.returncode == 3
    said = "cronops: job t_colour: failed (exit 3): ERROR: disk full"
    assert cronops_lines(result.stderr) == [said]
