"""End to end under the real cron daemon: install_crontab --user for a throwaway user, then
Debian's cron runs the job through run_job from its own bare environment, the run is recorded
as a success and its pings reach a server on 127.0.0.1.

Needs root, Debian's cron running and a Python the throwaway user can execute (`bash
.ci/services.sh` provides all three; CRONOPS_E2E_PYTHON names that Python). In CI
(CRONOPS_REQUIRE_ALL) a missing piece fails the test instead of skipping it.
"""

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ops.schedule.systemtz import tz_mismatch

from .conftest import PING_KEY, add_echo_args, base_env, copy_tree, require, wait_until

# `first`: started first, its wait for cron's minute overlaps the rest of the run.
pytestmark = [pytest.mark.slow, pytest.mark.first, pytest.mark.timeout(300)]
DEPS = "import django, crontab, cronsim, requests, dotenv, dj_database_url"


def python_for(user: str) -> str | None:
    """The first Python with the project's dependencies that `user` can execute."""
    candidates = [
        os.environ.get("CRONOPS_E2E_PYTHON"),
        sys.executable,
        "/opt/cronops-ci/venv/bin/python",
    ]
    for python in filter(None, candidates):
        probe = subprocess.run(
            ["runuser", "-u", user, "--", python, "-c", DEPS], capture_output=True, timeout=60
        )
        if probe.returncode == 0:
            return python
    return None


def cron_daemon_running() -> bool:
    return subprocess.run(["pgrep", "-x", "cron"], capture_output=True).returncode == 0


@pytest.mark.parametrize("dispatcher", [False, True], ids=["its own line", "the dispatcher"])
def test_the_real_cron_daemon_runs_an_installed_job_through_run_job_with_pings(
    cron_user, migrated_templates, ping_server, dispatcher
):
    """Through the job's own installed line, or through the warm dispatcher's one line a
    minute (`install_crontab --dispatcher`, ops/run/dispatch.py), which forks its run_job."""
    require(cron_daemon_running(), "Debian's cron is not running (bash .ci/services.sh)")
    require(tz_mismatch("UTC") is None, "the system time zone is not UTC")
    python = python_for(cron_user.name)
    require(
        python is not None,
        f"no Python that {cron_user.name} can execute with the project's dependencies "
        "(bash .ci/services.sh builds /opt/cronops-ci/venv)",
    )
    app = copy_tree(cron_user.home / "app")
    add_echo_args(app)
    shutil.copy2(migrated_templates["sqlite"], app / "db.sqlite3")
    marker = Path(f"/tmp/cronops-e2e-pwned-{uuid.uuid4().hex}")
    words = [f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", "100% done"]
    (app / "crontab.d" / "10-e2e.cron").write_text(
        "# Proves the chain: cron, install_crontab's line, run_job, the database, the pings.\n"
        "* * * * * --timeout=1m echo_args " + shlex.join(words) + "\n"
    )
    env_file = app / ".env"
    env_file.write_text(
        f"DATABASE_URL=sqlite:///{app / 'db.sqlite3'}\n"
        "SECRET_KEY=e2e-secret-key-" + "y" * 40 + "\n"
        "TIME_ZONE=UTC\n"
        "OPS_HOST=e2e-host\n"
        f"HEALTHCHECKS_PING_URL=http://127.0.0.1:{ping_server.port}/\n"
        f"HEALTHCHECKS_PING_KEY={PING_KEY}\n"
    )
    env_file.chmod(0o600)
    subprocess.run(["chown", "-R", f"{cron_user.name}:{cron_user.name}", str(app)], check=True)

    installed = subprocess.run(
        [python, str(app / "manage.py"), "install_crontab", "--user", cron_user.name]
        + (["--dispatcher"] if dispatcher else []),
        cwd=app,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    if dispatcher:
        [line] = [x for x in cron_user.crontab().splitlines() if x and not x.startswith(b"#")]
        assert line.startswith(b"* * * * * ") and b" run_due_jobs " in line, line
    else:
        assert installed.stdout.strip() == "installed 1 job: +1 \u22120 ~0"
    assert PING_KEY.encode() not in cron_user.crontab()
    shutil.rmtree(app / "var" / "log")  # run_job --log makes it again (a shell `>>` could not)

    # The daemon reads the changed crontab at its next minute, and the job's start-up on a
    # loaded machine takes seconds: two minutes' fire times, so one read late is not a failure.
    log = app / "var" / "log" / "echo_args.log"

    def finished_and_pinged():
        runs = query(app, "SELECT outcome, exit_code, host, output_tail FROM ops_jobrun")
        finished = {p.split("?")[0] for p in pinged_paths(ping_server)}
        done = runs and runs[0][0] != "running" and f"/{PING_KEY}/echo_args" in finished
        # run_job's own output reaches --log when the runner exits, after the final ping
        return runs if done and "ARGS" in read(log) else None

    try:
        runs = wait_until(finished_and_pinged, "cron to run the job, ping and log it", 150)
    except AssertionError as error:
        raise AssertionError(f"{error}; log: {read(log)!r}") from None
    outcome, exit_code, host, tail = runs[0]
    assert (outcome, exit_code, host) == ("succeeded", 0, "e2e-host"), read(log)
    printed = dict(line.split(" ", 1) for line in tail.splitlines() if " " in line)
    assert json.loads(printed["ARGS"]) == words  # literal text, `%` included
    environment = json.loads(printed["ENV"])
    assert environment["PATH"] == "/usr/bin:/bin"  # cron's own minimal environment
    assert environment["LOGNAME"] == cron_user.name
    assert environment["VIRTUAL_ENV"] is None
    assert not marker.exists()
    assert "ARGS" in read(log)  # the line's `run_job --log=OPS_LOG_DIR/<job>.log`
    # How it was started (issue 32): cron, found among run_job's ancestors; the installed
    # line is unchanged. Each run in the log begins with its header.
    # (A fire whose --log could not be opened yet, or that could not record its run, may come
    # first: each run that logged has its header, before its output.)
    recorded = query(app, "SELECT id, slot, trigger, started_by FROM ops_jobrun ORDER BY id")
    assert {(trigger, by) for _, _, trigger, by in recorded} == {("cron", "")}, recorded
    lines = read(log).splitlines()
    ends = [
        f" UTC  echo_args  slot {slot}  run #{run_id}  cron ===" for run_id, slot, *_ in recorded
    ]
    headers = [
        i for i, line in enumerate(lines) if line[:4] == "=== " and line.endswith(tuple(ends))
    ]
    assert headers, (ends, lines)
    assert headers[0] < next(i for i, line in enumerate(lines) if line.startswith("ARGS ")), lines

    paths = [p.split("?")[0] for p in pinged_paths(ping_server)]
    assert f"/{PING_KEY}/echo_args/start" in paths
    assert f"/{PING_KEY}/echo_args" in paths
    assert all(r.remote_addr == "127.0.0.1" for r, _ in ping_server.log)
    if dispatcher:
        # cron's virtual minute, kept for the next minute (ops/run/virtual_minute.py): the app
        # user's own, noting the real daemon (not the child it forks for the line)
        state = app / "var" / "lock" / "run_due_jobs.state"
        info = state.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (pwd.getpwnam(cron_user.name).pw_uid, 0o600)
        daemon = json.loads(state.read_text())["cron"].split(":")[0]
        found = subprocess.run(["pgrep", "-x", "cron"], capture_output=True, text=True)
        crons = found.stdout.split()
        parent = Path(f"/proc/{daemon}/stat").read_text().rsplit(") ", 1)[1].split()[1]
        assert daemon in crons and parent not in crons


def query(app: Path, sql: str):
    import sqlite3

    con = sqlite3.connect(app / "db.sqlite3", timeout=30)
    try:
        return con.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def pinged_paths(server) -> list[str]:
    return [request.full_path for request, _ in server.log]


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
