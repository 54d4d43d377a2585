"""The same crontab on three servers: one runs the slot, the others stand by.

Each "server" is a deployed copy of the project (own .env, OPS_HOST, lock directory) running
`manage.py run_job` in a network namespace and a pid namespace of its own (tests/netns.py), so
it is another machine to the holder identity: only the heartbeat tells whether its run is
alive. They share one PostgreSQL database, reached through a forwarder on each host's link, so
a host can be cut off from it (`ip link set … down`). Heartbeats every second.
"""

import json
import os
import signal
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from ops.run.descendants import descendants

from .conftest import (
    DAILY,
    DAILY_DATE,
    Project,
    base_env,
    copy_tree,
    require,
    wait_for_line,
    wait_until,
)
from .netns import Network, available, inner_pid

HEARTBEAT = 1
# Appends its host to RAN_FILE, then works while the file `hold` is in its project directory
# (the "long run" a test interrupts), for at most two minutes.
JOB = """
from django.conf import settings
from ops import conf
with open(os.environ["RAN_FILE"], "a") as f:
    f.write(f"{conf.host()}\\n")
print("working", flush=True)
deadline = time.monotonic() + 120
while (settings.BASE_DIR / "hold").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("done", flush=True)
"""
CRON = f"{DAILY} --standby t_job\n"


class Server:
    """One deployed copy on one namespaced host."""

    def __init__(self, project: Project, host, ran: Path, job: str = "t_job"):
        self.project, self.host, self.ran, self.job = project, host, ran, job
        self.proc: subprocess.Popen | None = None
        self.pid = 0  # run_job's pid in the root namespace

    @property
    def name(self) -> str:
        return self.host.name

    def start(self, *args: str) -> "Server":
        argv = self.host.wrap(self.project.command("run_job", *args, self.job))
        self.proc = subprocess.Popen(
            argv,
            cwd=self.project.dir,
            env=base_env(RAN_FILE=self.ran),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = inner_pid(self.proc)
        return self

    def wait(self, timeout: float = 90) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def hold(self) -> None:
        (self.project.dir / "hold").touch()

    def release(self) -> None:
        (self.project.dir / "hold").unlink(missing_ok=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass
            self.proc.kill()
            self.proc.communicate(timeout=30)


def three_servers(pg_project, tmp_path, request, prepare, job: str = "t_job") -> list[Server]:
    """Three servers sharing pg_project's database, each in its own namespaces; `prepare`
    gives each copy its job."""
    reason = available()
    require(not reason, reason)
    network = Network()
    request.addfinalizer(network.close)
    db_url = urllib.parse.urlsplit(pg_project.db.url)
    ran = tmp_path / "ran.txt"
    made: list[Server] = []
    request.addfinalizer(lambda: [server.kill() for server in made])
    for i in range(3):
        host = network.add_host()
        address, port = host.forward(db_url.hostname, db_url.port)
        url = pg_project.db.url.replace(db_url.netloc, f"{db_url.username}@{address}:{port}")
        copy = Project(copy_tree(tmp_path / host.name), pg_project.db, dict(pg_project.settings))
        copy.write_env(DATABASE_URL=url, OPS_HOST=host.name, OPS_HEARTBEAT_SECONDS=HEARTBEAT)
        prepare(copy)
        made.append(Server(copy, host, ran, job))
    return made


@pytest.fixture
def servers(pg_project, tmp_path, request):
    def prepare(copy: Project) -> None:
        copy.add_command("t_job", JOB)
        copy.write_cron("t.cron", CRON)

    return three_servers(pg_project, tmp_path, request, prepare)


def freeze(pid: int, sig: int) -> None:
    """SIGSTOP or SIGCONT to a whole machine's run: run_job and the job it forked."""
    for target in [pid, *descendants(pid)]:
        os.kill(target, sig)


def executions(servers) -> list[str]:
    ran = servers[0].ran
    return ran.read_text().split() if ran.exists() else []


def history(db) -> list[tuple]:
    return db.query("SELECT host, outcome, exit_code, note FROM ops_jobrun ORDER BY id")


def outcomes(db) -> list[str]:
    return sorted(row[1] for row in history(db))


def holding(servers, db) -> Server:
    """The server whose run holds the claim, once its command works."""
    wait_until(lambda: len(executions(servers)) == 1, "the first execution", 60)
    [name] = executions(servers)
    return next(s for s in servers if s.name == name)


def heartbeat(db):
    [(at,)] = db.query("SELECT heartbeat_at FROM ops_slotclaim")
    return at


def claim(db) -> tuple:
    [row] = db.query("SELECT state, version, host FROM ops_slotclaim")
    return row


def test_three_servers_firing_together_run_the_slot_once_and_the_others_exit_0(servers):
    db = servers[0].project.db
    for server in servers:
        server.hold()  # whichever wins works until the other two stand by behind it
    for server in servers:
        server.start()
    holder = holding(servers, db)
    for server in servers:
        if server is not holder:  # under load a fixed work time ended before they had claimed
            wait_for_line(server.proc, "standing by", timeout=60)
    holder.release()
    results = {s.name: s.wait() for s in servers}
    assert [code for code, _, _ in results.values()] == [0, 0, 0], results
    [winner] = executions(servers)
    for name, (_, out, _) in results.items():
        if name != winner:
            assert f"done on {winner} for " in out, out
    rows = history(db)
    assert sorted((host, outcome) for host, outcome, _, _ in rows) == sorted(
        [(winner, "succeeded")] + [(s.name, "skipped") for s in servers if s.name != winner]
    )
    assert claim(db) == ("succeeded", 1, winner)


def test_a_holder_killed_mid_run_is_taken_over_by_a_standby(servers):
    db = servers[0].project.db
    first = servers[0]
    first.hold()
    first.start()
    holding(servers, db)
    standbys = [s.start() for s in servers[1:]]
    for standby in standbys:  # they stand by behind a live holder (they said so)
        wait_for_line(standby.proc, "standing by", timeout=60)
    # and keep standing by while it heartbeats: two more beats, seen in the database
    beats = [heartbeat(db)]

    def two_more_beats():
        if heartbeat(db) != beats[-1]:
            beats.append(heartbeat(db))
        return len(beats) >= 3

    wait_until(two_more_beats, "the holder to heartbeat twice more", 30)
    assert all(s.proc.poll() is None for s in standbys)
    os.kill(first.pid, signal.SIGKILL)  # power cut, OOM kill: no record, no last word
    results = {s.name: s.wait() for s in standbys}
    assert [code for code, _, _ in results.values()] == [0, 0], results
    ran = executions(servers)
    assert ran[0] == first.name and len(ran) == 2
    taker = ran[1]
    assert "recorded the dead attempt" in results[taker][2]
    other = next(s.name for s in standbys if s.name != taker)
    assert f"done on {taker} for " in results[other][1]
    assert outcomes(db) == ["abandoned", "skipped", "succeeded"]
    [(note,)] = db.query("SELECT note FROM ops_jobrun WHERE outcome = 'abandoned'")
    assert note.startswith("heartbeat stopped (pid 1 on host-0")  # pid 1 of its namespace
    assert claim(db) == ("succeeded", 2, taker)


def frozen_while_taken_over(servers):
    """The first server holds the slot and is frozen (SIGSTOP: a suspended VM, a stalled
    hypervisor: run_job and its job); the standbys take it over, one succeeds; then it is
    resumed. (The first server, the taker's name.)"""
    db = servers[0].project.db
    first = servers[0]
    first.hold()
    first.start()
    holding(servers, db)
    freeze(first.pid, signal.SIGSTOP)
    standbys = [s.start() for s in servers[1:]]
    results = {s.name: s.wait() for s in standbys}
    assert [code for code, _, _ in results.values()] == [0, 0], results
    taker = executions(servers)[1]
    assert claim(db) == ("succeeded", 2, taker)
    freeze(first.pid, signal.SIGCONT)
    return first, taker


def test_a_frozen_holder_resumed_after_the_takeover_records_taken_over(servers):
    db = servers[0].project.db
    first, taker = frozen_while_taken_over(servers)
    code, out, err = first.wait()
    assert code == 75, out + err
    said = [line for line in err.splitlines() if "was taken over" in line]
    assert len(said) == 1, err
    assert "taken over by run #" in said[0] and f"on {taker} (claim version 2)" in said[0]
    assert outcomes(db) == ["skipped", "succeeded", "taken_over"]
    # exactly one success, and the claim is still the new holder's
    assert claim(db) == ("succeeded", 2, taker)
    [(note, exit_code)] = db.query(
        "SELECT note, exit_code FROM ops_jobrun WHERE outcome = 'taken_over'"
    )
    assert exit_code == 75 and "the job was stopped" in note


def test_a_holder_cut_off_from_the_database_is_taken_over_and_finds_out_when_the_link_returns(
    servers,
):
    db = servers[0].project.db
    first = servers[0]
    first.hold()
    first.start()
    holding(servers, db)
    first.host.cut()
    standbys = [s.start() for s in servers[1:]]
    results = {s.name: s.wait() for s in standbys}
    assert [code for code, _, _ in results.values()] == [0, 0], results
    taker = executions(servers)[1]
    # While cut off, the old holder cannot write anything: the new holder recorded its run
    # abandoned, and it is still running (blocked in its heartbeat's database call).
    assert first.proc.poll() is None
    assert outcomes(db) == ["abandoned", "skipped", "succeeded"]
    first.host.restore()
    code, out, err = first.wait(timeout=120)
    assert code == 75, out + err
    assert "was taken over by run #" in err
    assert outcomes(db) == ["skipped", "succeeded", "taken_over"]
    assert claim(db) == ("succeeded", 2, taker)
    assert len(executions(servers)) == 2  # at least once: the cut holder had started it too


# Succeeds, leaving behind a shell (and its sleep) that ignores SIGTERM: run_job's end of the
# job's leftovers then takes its whole grace (SIGTERM, 5 s, SIGKILL) before the record.
LEAVES_A_STUBBORN_CHILD = """
import subprocess
from django.conf import settings
from ops import conf
with open(os.environ["RAN_FILE"], "a") as f:
    f.write(f"{conf.host()}\\n")
ready = settings.BASE_DIR / "stubborn"
subprocess.Popen(["sh", "-c", f"trap '' TERM; touch {ready}; sleep 60"])
deadline = time.monotonic() + 60
while not ready.exists() and time.monotonic() < deadline:  # it ignores SIGTERM from here on
    time.sleep(0.01)
while (settings.BASE_DIR / "hold").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("done", flush=True)
"""


def test_a_standby_does_not_run_again_a_slot_whose_holder_is_ending_its_leftovers(servers):
    """The claim heartbeats from the take to the record: the 5 s run_job spends ending a
    SIGTERM-ignoring leftover (more than the 3 s after which a heartbeat is stale) is not a
    dead holder to a standby on another server."""
    db = servers[0].project.db
    first, standby = servers[0], servers[1]
    for server in (first, standby):
        server.project.add_command("t_job", LEAVES_A_STUBBORN_CHILD)
    first.hold()
    first.start()
    holding(servers, db)
    standby.start()
    wait_for_line(standby.proc, "standing by", timeout=60)
    first.release()  # the job ends; its leftover does not
    code, out, err = first.wait()
    assert code == 0, out + err
    assert "ended 2 leftover processes of the command: sh" in err, err
    assert "taken over" not in err, err
    code, out, err = standby.wait()
    assert code == 0, out + err
    assert f"done on {first.name} for " in out, out + err
    assert executions(servers) == [first.name]  # the job ran once
    assert outcomes(db) == ["skipped", "succeeded"]
    assert claim(db) == ("succeeded", 1, first.name)


def test_a_holder_whose_heartbeat_waits_on_a_table_lock_keeps_its_slot(servers):
    """A lock on the claims table (a migration's) holds up the holder's heartbeat past 3
    intervals, and the standby, which can still read the stale stamp, tries to take the slot
    over. The beat in flight holds its claim's holder lock: the takeover waits for it to land,
    stamped when it is written, finds the claim alive, and the job runs once."""
    import psycopg

    db = servers[0].project.db
    first, standby = servers[0], servers[1]
    first.hold()
    first.start()
    holding(servers, db)
    standby.start()
    wait_for_line(standby.proc, "standing by", timeout=60)

    def a_beat_waits_on_the_lock() -> bool:
        return bool(
            db.query(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE ?",
                ('LOCK TABLE "ops_slotclaim" IN ROW EXCLUSIVE MODE',),
            )
        )

    with psycopg.connect(db.url) as lock:
        lock.execute("LOCK TABLE ops_slotclaim IN SHARE MODE")
        wait_until(a_beat_waits_on_the_lock, "the holder's heartbeat to wait")
        # The stamp on the claim turns stale (3 intervals), and the standby tries to take over.
        wait_for_line(standby.proc, "heartbeat the database holds up", timeout=30)
        lock.commit()
    first.release()
    code, out, err = first.wait()
    assert code == 0, out + err
    assert "taken over" not in err, err
    code, out, err = standby.wait()
    assert code == 0, out + err
    assert f"done on {first.name} for " in out, out + err
    assert executions(servers) == [first.name]
    assert claim(db) == ("succeeded", 1, first.name)


# --- a Django task enqueued once per slot (issue 31) --------------------------------------------

# django-tasks-db's backend, which writes the task's row in run_job's record transaction, then
# appends its host to RAN_FILE and waits while the file `hold` is in the project directory: the
# "long enqueue" a test kills or freezes, its row written and not yet committed.
HELD_BACKEND = """
import os
import time

from django.conf import settings
from django_tasks_db import DatabaseBackend

from ops import conf


class HeldBackend(DatabaseBackend):
    def enqueue(self, task, args, kwargs):
        result = super().enqueue(task, args, kwargs)
        with open(os.environ["RAN_FILE"], "a") as f:
            f.write(f"{conf.host()}\\n")
        deadline = time.monotonic() + 120
        while (settings.BASE_DIR / "hold").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return result
"""
TASK = """
try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def summarise(logical_date: str) -> None:
    pass
"""


@pytest.fixture
def task_servers(pg_project, tmp_path, request):
    """Three servers whose job enqueues a task on a (held) database backend, standing by."""

    def prepare(copy: Project) -> None:
        (copy.dir / "commands" / "held_backend.py").write_text(HELD_BACKEND)
        (copy.dir / "commands" / "cron_tasks.py").write_text(TASK)
        settings = copy.dir / "config" / "settings.py"
        settings.write_text(
            settings.read_text()
            + "\nTASKS = {'default': {'BACKEND': 'commands.held_backend.HeldBackend'}}\n"
        )
        copy.write_cron(
            "t.cron", f"{DAILY} --standby --enqueue --name=t-task commands.cron_tasks.summarise\n"
        )

    return three_servers(pg_project, tmp_path, request, prepare, job="t-task")


def enqueued(db) -> list[tuple]:
    """(id, logical_date) of every task the backend holds, committed."""
    rows = db.query("SELECT id, args_kwargs FROM django_tasks_database_dbtaskresult")
    return [(str(i), (a if isinstance(a, dict) else json.loads(a))["kwargs"]) for i, a in rows]


def recorded_task(db, host: str) -> str:
    [(result_id,)] = db.query(
        "SELECT task_result_id FROM ops_jobrun WHERE outcome = 'succeeded' AND host = ?", (host,)
    )
    return result_id


def test_three_servers_firing_together_enqueue_the_task_once(task_servers):
    servers = task_servers
    db = servers[0].project.db
    for server in servers:
        server.hold()
    for server in servers:
        server.start()
    holder = holding(servers, db)  # inside its enqueue, in the record's transaction
    for server in servers:
        if server is not holder:
            wait_for_line(server.proc, "standing by", timeout=60)
    holder.release()
    results = {s.name: s.wait() for s in servers}
    assert [code for code, _, _ in results.values()] == [0, 0, 0], results
    [(result_id, kwargs)] = enqueued(db)
    assert kwargs == {"logical_date": str(DAILY_DATE)}
    assert recorded_task(db, holder.name) == result_id
    assert outcomes(db) == ["skipped", "skipped", "succeeded"]
    assert claim(db) == ("succeeded", 1, holder.name)


def test_a_holder_killed_inside_its_enqueue_leaves_no_task_and_a_standby_enqueues_it(
    task_servers,
):
    servers = task_servers
    db = servers[0].project.db
    first = servers[0]
    first.hold()
    first.start()
    holding(servers, db)  # its task's row written, not committed
    standbys = [s.start() for s in servers[1:]]
    os.kill(first.pid, signal.SIGKILL)
    results = {s.name: s.wait() for s in standbys}
    assert [code for code, _, _ in results.values()] == [0, 0], results
    ran = executions(servers)
    assert ran[0] == first.name and len(ran) == 2
    taker = ran[1]
    [(result_id, _)] = enqueued(db)  # the killed holder's row went with its transaction
    assert recorded_task(db, taker) == result_id
    assert outcomes(db) == ["abandoned", "skipped", "succeeded"]
    assert claim(db) == ("succeeded", 2, taker)


def test_a_frozen_holder_resumed_after_the_takeover_takes_its_enqueue_back(task_servers):
    """Its record finds the claim taken over after its task's row is written: the row goes
    back with the savepoint, the new holder's task is the slot's only one."""
    servers = task_servers
    db = servers[0].project.db
    first, taker = frozen_while_taken_over(servers)
    first.release()
    code, out, err = first.wait()
    assert code == 75, out + err
    assert "was taken over" in err, err
    [(result_id, _)] = enqueued(db)
    assert recorded_task(db, taker) == result_id
    assert db.query("SELECT task_result_id FROM ops_jobrun WHERE outcome = 'taken_over'") == [("",)]
    assert outcomes(db) == ["skipped", "succeeded", "taken_over"]
