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
