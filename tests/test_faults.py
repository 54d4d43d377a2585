"""Regression tests for what the fault harness (bench/faults/, `make faults`) found.

Real processes against a deployed copy, like tests/test_runner.py.
"""

import sqlite3

from tests.conftest import PING_KEY

MOVES_THE_DATABASE_AWAY = """
from django.db import connection
path = connection.settings_dict["NAME"]
connection.close()
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(str(path) + suffix):
        os.rename(str(path) + suffix, str(path) + ".gone" + suffix)
self.stdout.write("done")
"""


def test_a_database_gone_before_the_outcome_is_recorded_fails_the_exit_and_the_ping(
    sqlite_project, ping_server
):
    """F3: the job succeeded, but its outcome cannot be recorded. Before the fix the runner
    printed a note, sent a *success* ping and exited 0, so nobody learnt that the history
    and the claim were stale; now it is the "database unavailable" outcome: one error line,
    /fail, exit 1, and nothing recorded as a success."""
    project = sqlite_project
    project.write_env(
        HEALTHCHECKS_PING_URL=ping_server.url_for("/"), HEALTHCHECKS_PING_KEY=PING_KEY
    )
    project.add_command("t_vanish", MOVES_THE_DATABASE_AWAY)
    project.write_cron("t.cron", "0 3 * * * t_vanish\n")

    result = project.run_job("--logical-date=2026-01-15", "t_vanish")

    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("cronops: error")]
    assert len(errors) == 1, result.stderr
    assert "database unavailable: could not record the outcome (succeeded, exit 0)" in errors[0]
    assert "Traceback" not in result.stderr
    paths = [req.path for req, _ in ping_server.log]
    assert paths == [f"/{PING_KEY}/t_vanish/start", f"/{PING_KEY}/t_vanish/fail"]
    assert b"could not record" in ping_server.log[-1][0].get_data()
    # The moved-away database still says "running": the next run will take the slot over.
    gone = project.db.url.removeprefix("sqlite:///") + ".gone"
    con = sqlite3.connect(gone)
    try:
        assert con.execute("SELECT outcome FROM ops_jobrun").fetchall() == [("running",)]
        assert con.execute("SELECT state FROM ops_slotclaim").fetchall() == [("running",)]
    finally:
        con.close()


def run_into(project, target: str, *args, env=None):
    """run_job ARGS with stdout and stderr appended to `target`, like the installed cron line."""
    import subprocess

    from tests.conftest import base_env

    with open(target, "ab") as log:
        return subprocess.run(
            project.command("run_job", *args),
            cwd=project.dir,
            env=base_env(**(env or {})),
            stdout=log,
            stderr=log,
            timeout=120,
        )


PRINTS = """
for i in range(2000):
    print(f"line {i}")
time.sleep(float(os.environ.get("SLEEP", "0")))
"""


def test_a_full_disk_under_the_log_keeps_the_outcome_notes_the_loss_and_fails_the_ping(
    sqlite_project, ping_server
):
    """F6: the job's output cannot reach the log (cron's `>> log 2>&1` on a full disk). The
    outcome stands (a done slot must not run again) and the exit code is the job's; before the
    fix nothing said that the output was lost. Now the history note says so and the ping is
    /fail with that note first (the note used to be cut off a long body)."""
    project = sqlite_project
    project.write_env(
        HEALTHCHECKS_PING_URL=ping_server.url_for("/"), HEALTHCHECKS_PING_KEY=PING_KEY
    )
    project.add_command("t_print", PRINTS)

    result = run_into(project, "/dev/full", "t_print")

    assert result.returncode == 0
    [(outcome, code, note)] = [r[3:6] for r in project.db.runs("t_print")]
    assert (outcome, code) == ("succeeded", 0)
    assert note.startswith("output lost: ") and "No space left on device" in note
    final = ping_server.log[-1][0]
    assert final.path == f"/{PING_KEY}/t_print/fail"
    assert final.get_data().startswith(b"cronops: output lost: ")


def test_a_timeout_with_a_full_log_still_exits_124_and_records_it(sqlite_project):
    """The runner's own message ("timed out after 1s") went to a full stderr and raised
    OSError before the outcome was recorded: the run and its claim stayed `running` and the
    failed flush at exit turned 124 into 120."""
    project = sqlite_project
    project.add_command("t_print", PRINTS)
    project.write_cron("t.cron", "0 3 * * * --no-ping --timeout=1s t_print\n")

    result = run_into(
        project, "/dev/full", "--logical-date=2026-01-15", "t_print", env={"SLEEP": "30"}
    )

    assert result.returncode == 124
    assert [r[3:5] for r in project.db.runs("t_print")] == [("timed_out", 124)]
    assert project.db.query("SELECT state FROM ops_slotclaim") == [("timed_out",)]


def test_an_unusable_lock_directory_is_one_error_line_a_fail_ping_and_exit_1(
    sqlite_project, ping_server, tmp_path
):
    """F6: was exit 2 with no ping, so monitoring never heard that nothing could run."""
    project = sqlite_project
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    project.write_env(
        HEALTHCHECKS_PING_URL=ping_server.url_for("/"),
        HEALTHCHECKS_PING_KEY=PING_KEY,
        OPS_LOCK_DIR=not_a_dir / "lock",
    )

    result = project.run_job("check")

    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("cronops: error: lock directory ")
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert [req.path for req, _ in ping_server.log] == [f"/{PING_KEY}/check/fail"]
    assert project.db.runs() == []


def test_f9s_job_runs_as_the_harness_runs_it_and_stamps_its_host(sqlite_project, tmp_path):
    """F9 runs for 17 minutes as root, so nothing else ran its job: it read settings.OPS_HOST,
    which the project's settings no longer define (ops.conf has the defaults), and every
    holder died at once with AttributeError."""
    import ast
    import re
    from pathlib import Path

    source = (Path(__file__).parent.parent / "bench" / "faults" / "f9_standby.py").read_text()
    constants = {
        target.id: node.value.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    project = sqlite_project
    commands = project.dir / "commands" / "management" / "commands"
    (commands / "bench_slot.py").write_text(constants["SLOT"])
    project.write_cron("f9.cron", constants["CRON"])
    stamp = tmp_path / "stamp"
    result = project.run_job("--logical-date=2001-01-01", "bench_slot", env={"BENCH_STAMP": stamp})
    assert result.returncode == 0, result.stderr
    lines = stamp.read_text().splitlines()
    assert [re.sub(r" [0-9.]+$", "", line) for line in lines] == [
        "start 2001-01-01 host-a",
        "end 2001-01-01 host-a",
    ]
