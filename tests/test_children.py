"""A job's child processes never outlive its claim: real run_job processes, real `sh` children."""

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest

from .conftest import wait_for_line

# The job shells out as pg_dump or rsync would: a shell that sleeps, then writes "end".
SHELLS_OUT = """
import subprocess
ledger = os.environ["LEDGER"]
script = 'echo "start $$" >> "$LEDGER"; sleep "$CHILD_SLEEP"; echo "end $$" >> "$LEDGER"'
own_group = bool(os.environ.get("OWN_GROUP"))  # out of the job's process group (setsid)
child = subprocess.Popen(
    ["sh", "-c", script], env={**os.environ, "LEDGER": ledger}, start_new_session=own_group
)
print("working", flush=True)
child.wait()
"""


def carrying(run_id: int, project) -> list[int]:
    """The live processes whose environment says OPS_RUN_ID=<run_id>, of this test's project
    (its LEDGER: another test's run has the same id in its own database)."""
    ledger = f"LEDGER={project.dir / 'ledger'}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if f"OPS_RUN_ID={run_id}".encode() in environ and ledger in environ and state != b"Z":
            found.append(int(name))
    return found


def until(condition, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def ledger_lines(project) -> list[str]:
    path = project.dir / "ledger"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def started_pids(project) -> list[int]:
    return [int(line.split()[1]) for line in (project.dir / "ledger").read_text().splitlines()]


def setup(project) -> dict:
    project.add_command("t_shell", SHELLS_OUT)
    return {"LEDGER": str(project.dir / "ledger"), "CHILD_SLEEP": "30"}


@pytest.mark.parametrize("own_group", [False, True], ids=["in the job's group", "setsid"])
def test_a_timeout_ends_the_jobs_child_processes_before_the_rerun_runs_the_slot_once(
    sqlite_project, own_group
):
    """The timeout's SIGTERM goes to the job's process group, which its shell is in, and to
    every process below run_job: a child that left the group (setsid) too. (One still dying
    when the job's own end is seen may be named as a leftover: it is ended either way.)"""
    project = sqlite_project
    env = {**setup(project), **({"OWN_GROUP": "1"} if own_group else {})}
    args = ("--no-ping", "--logical-date=2026-11-25")
    first = project.run_job("--timeout=1s", *args, "t_shell", env=env)
    assert first.returncode == 124, first.stdout + first.stderr
    run_id = project.db.query("SELECT id FROM ops_jobrun")[0][0]
    # The shell and its sleep are gone: no "end" can ever reach the ledger.
    assert carrying(run_id, project) == []
    assert not Path(f"/proc/{started_pids(project)[0]}").exists()

    second = project.run_job(*args, "t_shell", env={**env, "CHILD_SLEEP": "0"})
    assert second.returncode == 0, second.stdout + second.stderr
    assert ledger_lines(project) == ["start", "start", "end"]
    assert [r[3] for r in project.db.runs()] == ["timed_out", "succeeded"]


def test_sigterm_ends_the_jobs_child_processes_too(sqlite_project):
    project = sqlite_project
    env = setup(project)
    proc = project.popen("run_job", "--no-ping", "--logical-date=2026-11-25", "t_shell", env=env)
    wait_for_line(proc, "working")
    until(lambda: ledger_lines(project) == ["start"])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 143
    assert not Path(f"/proc/{started_pids(project)[0]}").exists()
    assert [r[3] for r in project.db.runs()] == ["terminated"]


def test_a_killed_runner_whose_child_still_runs_keeps_its_slot_until_the_child_is_gone(
    sqlite_project,
):
    project = sqlite_project
    env = setup(project)
    args = ("--no-ping", "--logical-date=2026-11-25", "t_shell")
    victim = project.popen("run_job", *args, env=env)
    wait_for_line(victim, "working")
    until(lambda: ledger_lines(project) == ["start"])
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    run_id = project.db.query("SELECT id FROM ops_jobrun")[0][0]
    orphans = carrying(run_id, project)
    assert orphans, "the shell and its sleep outlive the killed runner"

    blocked = project.run_job(*args, env={**env, "CHILD_SLEEP": "0"})
    assert blocked.returncode == 75, blocked.stdout + blocked.stderr
    named = re.search(
        rf"a process of run #{run_id} \(pid (\d+), (sh|sleep)\) is still running", blocked.stdout
    )
    assert named, blocked.stdout
    assert int(named.group(1)) in orphans
    assert ledger_lines(project) == ["start"]

    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    until(lambda: carrying(run_id, project) == [])
    again = project.run_job(*args, env={**env, "CHILD_SLEEP": "0"})
    assert again.returncode == 0, again.stdout + again.stderr
    assert "recorded the dead attempt" in again.stderr
    assert ledger_lines(project) == ["start", "start", "end"]
    assert [r[3] for r in project.db.runs()] == ["abandoned", "skipped", "succeeded"]


# The shell backgrounds a worker and returns at once: the worker is orphaned while the job runs.
DAEMONISES = """
import subprocess
script = (
    '(echo "start $$" >> "$LEDGER"; sleep 30; echo "end" >> "$LEDGER") & '
    'echo "$!" > "$LEDGER.pid"'
)
subprocess.run(["sh", "-c", script], check=True)
while not os.path.exists(os.environ["LEDGER"]):
    time.sleep(0.01)
print("returned, the worker still runs", flush=True)
"""


def test_a_worker_the_job_left_running_is_ended_when_the_job_returns(sqlite_project):
    project = sqlite_project
    project.add_command("t_daemon", DAEMONISES)
    env = {"LEDGER": str(project.dir / "ledger")}
    result = project.run_job("--no-ping", "--logical-date=2026-11-25", "t_daemon", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    # Its parent shell had exited: the worker reparented to run_job (a subreaper), not init.
    assert "leftover" in result.stderr
    worker = int((project.dir / "ledger.pid").read_text())
    assert not Path(f"/proc/{worker}").exists()
    run_id = project.db.query("SELECT id FROM ops_jobrun")[0][0]
    assert carrying(run_id, project) == []
    assert [r[3] for r in project.db.runs()] == ["succeeded"]


def test_a_leftover_that_dies_while_it_is_being_looked_at_is_reaped_not_left_a_zombie(
    monkeypatch,
):
    """A leftover that dies between run_job's look at its descendants and its reap was left a
    zombie of run_job, then of init (still in /proc when run_job had exited). The death is put
    exactly there: the look finds it alive, then it is killed and waited into a zombie."""
    from ops.run import descendants

    def state(pid: int) -> str:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return stat.rsplit(b")", 1)[1].split()[0].decode()

    before = frozenset(descendants.children_of(os.getpid()))
    pid = os.posix_spawn("/bin/sleep", ["sleep", "30"], dict(os.environ))
    look = descendants.descendants

    def look_then_die(root=None, exclude=frozenset()):
        found = look(root, exclude)
        if pid in found and state(pid) != "Z":
            os.kill(pid, signal.SIGKILL)
            until(lambda: state(pid) == "Z")
        return found

    monkeypatch.setattr(descendants, "descendants", look_then_die)
    try:
        descendants.end_descendants(exclude=before, grace=5)
        assert not Path(f"/proc/{pid}").exists(), "the leftover is still a zombie"
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
