"""Who may take over a running claim: only a run that can prove its holder is gone.

Real processes against a real database (SQLite and PostgreSQL): two deployed copies of the
project share one database and one OPS_HOST, as two servers set up from one Ansible group did;
a second pid namespace (`unshare --pid`) stands for another machine or container. Before
issue 9 any run from a host of the same name took a running claim over, trusting the file lock.
"""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ops.run import process
from ops.run.descendants import descendants

from .conftest import (
    DAILY,
    PING_KEY,
    Project,
    copy_tree,
    kill_a_scheduled_run_mid_command,
    ping_to,
    require,
    wait_for_line,
    wait_until,
)

pytestmark = pytest.mark.process  # real processes, and a real `ansible`

# Runs until the file `go` appears in its project directory; fails with 3 if `fail` is there.
WAITER = """
from django.conf import settings
with open(os.environ["RAN_FILE"], "a") as f:
    f.write(f"{os.getpid()}\\n")
print("working", flush=True)
deadline = time.monotonic() + 120
while not (settings.BASE_DIR / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
if (settings.BASE_DIR / "fail").exists():
    raise CommandError("told to fail", returncode=3)
print("done", flush=True)
"""
CRON = f"{DAILY} t_wait\n"  # two runs of one test serve one slot
VAULT_NAMES = ("cronops_secret_key", "healthchecks_ping_key", "healthchecks_api_key")


def with_waiter(project: Project, ran: Path) -> Project:
    project.add_command("t_wait", WAITER)
    project.write_cron("t.cron", CRON)
    project.write_env(RAN_FILE=ran)
    return project


def second_server(project: Project, tmp_path: Path, ran: Path) -> Project:
    """Another deployed copy (its own directory, lock directory, .env) on the same database,
    with the same OPS_HOST: what one group-wide OPS_HOST in the Ansible inventory made."""
    other = Project(copy_tree(tmp_path / "server-b"), project.db, dict(project.settings))
    assert other.settings["OPS_HOST"] == project.settings["OPS_HOST"]
    assert other.lock_dir != project.lock_dir
    return with_waiter(other, ran)


def executions(ran: Path) -> int:
    return len(ran.read_text().splitlines()) if ran.exists() else 0


def claim_row(project: Project) -> tuple:
    [row] = project.db.query("SELECT state, version, pid, run_id FROM ops_slotclaim")
    return row


@pytest.mark.parametrize("setup", ["two servers, one OPS_HOST", "two checkouts' lock dirs"])
def test_a_second_run_with_the_same_host_name_never_takes_a_live_claim(project, tmp_path, setup):
    ran = tmp_path / "ran.txt"
    with_waiter(project, ran)
    if setup == "two servers, one OPS_HOST":
        other, env = second_server(project, tmp_path, ran), {}
    else:
        other, env = project, {"OPS_LOCK_DIR": tmp_path / "another-lock-dir"}
    first = project.popen("run_job", "t_wait")
    wait_for_line(first, "working")
    second = other.run_job("t_wait", env=env)
    assert second.returncode == 75, second.stdout + second.stderr
    assert f"pid {first.pid}, host host-a" in second.stdout
    (project.dir / "go").touch()
    assert first.wait(60) == 0
    assert executions(ran) == 1
    assert claim_row(project)[:2] == ("succeeded", 1)


def test_a_run_in_another_pid_namespace_waits_for_a_stale_heartbeat(project, tmp_path):
    """Another container (or machine) cannot see the holder's process: only the heartbeat
    tells, whatever OPS_HOST says."""
    require(
        os.geteuid() == 0 and shutil.which("unshare") is not None,
        "needs root and unshare(1)",
    )
    ran = tmp_path / "ran.txt"
    with_waiter(project, ran)
    other = second_server(project, tmp_path, ran)
    first = project.popen("run_job", "t_wait")
    wait_for_line(first, "working")
    container = ["unshare", "--pid", "--fork", "--mount-proc"]
    second = subprocess.run(
        [*container, *other.command("run_job", "t_wait")],
        cwd=other.dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 75, second.stdout + second.stderr
    (project.dir / "go").touch()
    assert first.wait(60) == 0
    assert executions(ran) == 1


def test_deleting_the_lock_directory_mid_run_does_not_let_a_second_run_in(project, tmp_path):
    ran = tmp_path / "ran.txt"
    with_waiter(project, ran)
    first = project.popen("run_job", "t_wait")
    wait_for_line(first, "working")
    shutil.rmtree(project.lock_dir)  # tmpfiles, or a deploy that replaces var/
    second = project.run_job("t_wait")
    assert second.returncode == 75, second.stdout + second.stderr
    assert project.lock_dir.is_dir()  # the second run made a new one, and a new lock file
    (project.dir / "go").touch()
    assert first.wait(60) == 0
    assert executions(ran) == 1


def test_twelve_runs_of_one_slot_with_one_host_and_twelve_lock_dirs_execute_once(project, tmp_path):
    """Measured before issue 9: 12 executions."""
    ran = tmp_path / "ran.txt"
    with_waiter(project, ran)
    runs = [
        project.popen("run_job", "t_wait", env={"OPS_LOCK_DIR": tmp_path / f"lock-{i}"})
        for i in range(12)
    ]
    wait_until(lambda: sum(r.poll() is not None for r in runs) >= 11, "11 runs to exit", 120)
    (project.dir / "go").touch()
    codes = sorted(r.wait(60) for r in runs)
    for r in runs:
        r.communicate()
    assert codes == [0] + [75] * 11
    assert executions(ran) == 1


def test_a_claim_whose_pid_now_belongs_to_another_process_is_taken_over(sqlite_project, tmp_path):
    """pid reuse: the pid is alive, but started at another time than the claim's holder."""
    project = sqlite_project
    kill_a_scheduled_run_mid_command(project)
    stranger = subprocess.Popen(["sleep", "120"])
    try:
        started = process.start_time(stranger.pid)
        assert started is not None
        project.db.execute(
            "UPDATE ops_slotclaim SET pid = ?, holder_started = ?", (stranger.pid, started)
        )
        alive = project.run_job("t_sleep")  # the holder is exactly that live process
        assert alive.returncode == 75, alive.stdout + alive.stderr
        assert f"pid {stranger.pid}" in alive.stdout
        project.db.execute("UPDATE ops_slotclaim SET holder_started = ?", (started - 1,))
        reused = project.run_job("t_sleep")
        assert reused.returncode == 0, reused.stdout + reused.stderr
        assert "recorded the dead attempt" in reused.stderr
    finally:
        stranger.kill()
        stranger.wait()
    assert [r[3] for r in project.db.runs("t_sleep")] == ["abandoned", "skipped", "succeeded"]
    state, version, _, _ = claim_row(project)
    assert (state, version) == ("succeeded", 2)  # taken twice: by the victim, then the next run


def test_a_run_whose_claim_was_taken_over_never_writes_onto_it(pg_project, tmp_path):
    """The claim's version fences the old holder: its final state does not overwrite the new
    holder's, and its heartbeat says it lost the claim."""
    project = pg_project
    ran = tmp_path / "ran.txt"
    with_waiter(project, ran)
    project.write_env(OPS_HEARTBEAT_SECONDS=1)
    old = project.popen("run_job", "t_wait")
    wait_for_line(old, "working")
    # The old holder's machine freezes (a suspended VM), seen from another machine: its
    # heartbeat goes stale and a run there takes the slot over.
    machine = [old.pid, *descendants(old.pid)]  # run_job and its job
    for pid in machine:
        os.kill(pid, signal.SIGSTOP)
    for pid in machine:
        frozen(pid, project.db)
    project.db.execute(
        "UPDATE ops_slotclaim SET holder_boot_id = 'another-machine', "
        "heartbeat_at = heartbeat_at - interval '10 minutes'"
    )
    other = second_server(project, tmp_path, ran)
    (other.dir / "go").touch()
    new = other.run_job("t_wait")
    assert new.returncode == 0, new.stdout + new.stderr
    assert "recorded the dead attempt" in new.stderr
    for pid in machine:
        os.kill(pid, signal.SIGCONT)  # it wakes up, still inside its command
    lost = wait_for_line(old, "was taken over by run #", stream="stderr")
    _, err = old.communicate(timeout=60)
    # Its next heartbeat finds the claim gone: it stops the job (as a timeout would), exits
    # 75 and records itself as taken over, never as the slot's outcome.
    assert old.returncode == 75, lost + err
    # At least once: a frozen holder's slot runs again once its heartbeat is stale.
    assert executions(ran) == 2
    state, version, _, run_id = claim_row(project)
    assert (state, version) == ("succeeded", 2)
    [(winner,)] = project.db.query("SELECT id FROM ops_jobrun WHERE outcome = 'succeeded'")
    assert run_id == winner
    [(outcome, note)] = project.db.query(
        "SELECT outcome, note FROM ops_jobrun WHERE pid = ?", (old.pid,)
    )
    assert outcome == "taken_over"
    assert f"taken over by run #{winner} on host-a (claim version 2)" in note


def frozen(pid: int, db, timeout: float = 30) -> None:
    """Wait until `pid` is stopped and no statement it sent is still running on the server: a
    heartbeat in flight at the SIGSTOP must not land after the test has made it stale."""
    active = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state = 'active'"
    )

    def stopped_and_quiet():
        states = set()
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.add((task / "stat").read_bytes().rsplit(b")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
        return states == {b"T"} and db.query(active) == [(0,)]

    wait_until(stopped_and_quiet, f"pid {pid} stopped with no statement in flight", timeout)


def test_a_planted_symlink_in_the_lock_directory_is_refused_and_its_target_untouched(
    sqlite_project, ping_server, tmp_path
):
    project = sqlite_project
    ping_to(project, ping_server)
    project.add_command("t_ok", "print('fine')")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious bytes\n")
    project.lock_dir.mkdir(parents=True)
    (project.lock_dir / "t_ok.lock").symlink_to(victim)
    result = project.run_job("t_ok")
    assert result.returncode == 1
    assert victim.read_bytes() == b"precious bytes\n"
    lock_file = project.lock_dir / "t_ok.lock"
    assert result.stderr.strip() == (
        f"cronops: error: lock file {lock_file} is a symbolic link: refusing to use it"
    )
    assert "fine" not in result.stdout
    assert [req.path for req, _ in ping_server.log] == [f"/{PING_KEY}/t_ok/fail"]


def test_a_lock_file_owned_by_another_user_is_refused(sqlite_project):
    require(os.geteuid() == 0, "needs root to give the file away")
    project = sqlite_project
    project.add_command("t_ok", "print('fine')")
    project.lock_dir.mkdir(parents=True)
    planted = project.lock_dir / "t_ok.lock"
    planted.write_bytes(b"")
    os.chown(planted, 65534, 65534)
    result = project.run_job("t_ok")
    assert result.returncode == 1
    assert f"lock file {planted}: owned by uid 65534" in result.stderr
    assert "fine" not in result.stdout


def test_a_process_identity_tells_a_dead_or_reused_pid_from_a_live_one():
    me = process.identify()
    assert me.boot_id and me.pid == os.getpid() and me.started is not None
    child = subprocess.Popen(["sleep", "30"])
    holder = process.identify(child.pid)
    assert not process.is_gone(holder, me)
    reused = process.Identity(me.boot_id, me.pid_ns, child.pid, holder.started + 1)
    assert process.is_gone(reused, me)
    elsewhere = process.Identity("another-boot", me.pid_ns, 999_999, 1)
    assert not process.is_gone(elsewhere, me)  # not checkable here: only its heartbeat tells
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert process.is_gone(holder, me)


def test_the_ansible_example_gives_each_host_its_own_ops_host(tmp_path):
    """It set `OPS_HOST: web1` for the whole group: every server of it claimed as web1."""
    repo = Path(__file__).resolve().parent.parent
    inventory = tmp_path / "inventory"
    shutil.copytree(repo / "ansible" / "inventory" / "example", inventory)
    (inventory / "hosts.ini").write_text("[cronops]\nweb1.example.com\nweb2.example.com\n")
    ansible = Path(sys.executable).parent / "ansible"
    result = subprocess.run(
        [str(ansible), "all", "-i", str(inventory / "hosts.ini"), "-c", "local"]
        + ["-m", "ansible.builtin.debug", "-a", "var=cronops_env.OPS_HOST"]
        + [arg for name in VAULT_NAMES for arg in ("-e", f"vault_{name}=unused")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"cronops_env.OPS_HOST": "web1.example.com"' in result.stdout
    assert '"cronops_env.OPS_HOST": "web2.example.com"' in result.stdout
