"""A takeover held back by a gone holder's fencing transaction (issue 20, item 2).

The holder's job is inside `still_held(lock=True)` when its machine freezes (SIGSTOP of run_job
and its job); seen from another machine its heartbeat is stale, so a run there takes the slot
over once the fencing transaction ends. Until then that run waits, without holding what the
claims of the job's other slots need, says what it waits for, gives up at its bound, and ends
at once on SIGTERM or SIGINT. Real processes on PostgreSQL (SQLite has no fencing lock).
"""

import os
import re
import signal
import threading
import time

import pytest

from ops.run.descendants import descendants

from .conftest import DAILY, wait_for_line
from .test_claims import frozen

# Fences itself, then (with HOLD set) stays inside its transaction until `go` appears.
FENCED = """
from django.conf import settings
from django.db import transaction
from ops.claims import current_claim
deadline = time.monotonic() + 120
with transaction.atomic():
    assert current_claim().still_held(lock=True)
    print("fenced", flush=True)
    while os.environ.get("HOLD") and not (settings.BASE_DIR / "go").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
print("done", flush=True)
"""


class Lines:
    """A process's stdout (or stderr), read by a thread, so a test can wait on it with a
    deadline."""

    def __init__(self, proc, stream: str = "stdout"):
        self.text = ""
        self.thread = threading.Thread(
            target=self._read, args=(getattr(proc, stream),), daemon=True
        )
        self.thread.start()

    def _read(self, stream):
        for line in stream:
            self.text += line


def wait_for(condition, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def lock_waits(db) -> int:
    """Backends of this database waiting for an advisory lock."""
    return db.query(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE NOT l.granted AND l.locktype = 'advisory' AND a.datname = current_database()"
    )[0][0]


@pytest.fixture
def started(request):
    """Processes a test started: killed at its end, whatever happened (by pid)."""
    procs = []

    def kill():
        for proc in procs:
            if proc.poll() is None:
                for target in [*descendants(proc.pid), proc.pid]:
                    for sig in (signal.SIGCONT, signal.SIGKILL):
                        try:
                            os.kill(target, sig)
                        except ProcessLookupError:
                            pass
                proc.wait(30)

    request.addfinalizer(kill)
    return procs


def frozen_in_its_fence(project, started):
    """The holder of today's slot, frozen inside its fencing transaction; its heartbeat made
    stale as another machine sees it. Returns (its Popen, its processes)."""
    project.add_command("t_fence", FENCED)
    project.write_cron("t.cron", f"{DAILY} t_fence\n")  # far from its fire: one slot for all
    holder = project.popen("run_job", "t_fence", env={"HOLD": "1"})
    started.append(holder)
    wait_for_line(holder, "fenced")
    machine = [holder.pid, *descendants(holder.pid)]  # run_job and its job
    for pid in machine:
        os.kill(pid, signal.SIGSTOP)
    for pid in machine:
        frozen(pid, project.db)
    project.db.execute(
        "UPDATE ops_slotclaim SET holder_boot_id = 'another-machine', "
        "heartbeat_at = heartbeat_at - interval '10 minutes'"
    )
    return holder, machine


def resume(machine) -> None:
    for pid in machine:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def other_server(tmp_path, name: str) -> dict:
    """A run on another server of this machine: its own lock directory (the holder keeps its
    file lock while frozen)."""
    return {"OPS_LOCK_DIR": tmp_path / f"lock-{name}", "OPS_HOST": name}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_waiting_takeover_holds_back_no_other_slot_and_a_signal_ends_it_at_once(
    pg_project, tmp_path, sig, started
):
    """Before: the taker held the job's lock while it waited on the holder's; a run of
    another slot hung behind it (10 minutes, until the holder resumed), and SIGTERM did not
    end the wait."""
    project = pg_project
    holder, machine = frozen_in_its_fence(project, started)
    try:
        taker = project.popen("run_job", "--standby", "t_fence", env=other_server(tmp_path, "b"))
        started.append(taker)
        said = Lines(taker)
        wait_for(
            lambda: "waiting" in said.text or lock_waits(project.db),
            what="the taker at the takeover (before issue 20: blocked on the holder's lock)",
        )
        other_slot = project.run_job(
            "--logical-date=2026-01-01", "t_fence", env=other_server(tmp_path, "c"), timeout=60
        )
        assert other_slot.returncode == 0, other_slot.stdout + other_slot.stderr
        assert "done" in other_slot.stdout
        sent = time.monotonic()
        taker.send_signal(sig)
        taker.wait(timeout=20)
        took = time.monotonic() - sent
        said.thread.join(10)
        err = taker.stderr.read()
    finally:
        resume(machine)
    assert taker.returncode == 128 + sig, said.text + err
    assert took < 10, took  # at once (a loaded machine's exit included); before, never
    # It said what it waited for, and for how long at most.
    [waiting] = [line for line in said.text.splitlines() if "waiting up to" in line]
    assert "run #1 on host-a (pid " in waiting and "fencing transaction" in waiting, waiting
    assert waiting.endswith("for that transaction to end before taking the slot over"), waiting
    name = signal.Signals(sig).name
    rows = project.db.query(
        "SELECT host, outcome, exit_code, note FROM ops_jobrun WHERE host = 'b' ORDER BY id"
    )
    assert [(o, c) for _, o, c, _ in rows] == [("skipped", 128 + sig)], rows
    assert rows[0][3].startswith(f"terminated by {name} while waiting to take ")
    # Nothing of the taker's is left running: the holder's claim is as it was.
    assert project.db.query(
        "SELECT host, state, version FROM ops_slotclaim WHERE slot <> ?", ("2026-01-01",)
    ) == [("host-a", "running", 1)]
    (project.dir / "go").touch()  # resumed, the holder commits and ends as the slot's holder
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, out + err


def test_a_waiting_takeover_gives_up_at_its_bound_and_names_the_holder(
    pg_project, tmp_path, started
):
    project = pg_project
    holder, machine = frozen_in_its_fence(project, started)
    try:
        taker = project.run_job(
            "--standby=4s", "t_fence", env=other_server(tmp_path, "b"), timeout=60
        )
    finally:
        resume(machine)
    assert taker.returncode == 75, taker.stdout + taker.stderr
    [pid] = project.db.query("SELECT pid FROM ops_jobrun WHERE host = 'host-a'")[0]
    skipped = [line for line in taker.stdout.splitlines() if "skipped" in line]
    assert len(skipped) == 1, taker.stdout
    assert f"run #1 on host-a (pid {pid})" in skipped[0], skipped
    assert "fencing transaction" in skipped[0] and "4s" in skipped[0], skipped
    (project.dir / "go").touch()
    assert holder.wait(60) == 0


def test_a_run_without_standby_waits_takeover_wait_then_exits_75_naming_the_holder(
    transactional_db, settings, tmp_path, monkeypatch, capsys
):
    """In-process, with the bound made short: a fencing transaction held by a thread's own
    connection, its holder another machine whose heartbeat is an hour old."""
    import datetime as dt

    import time_machine
    from django.db import connection, transaction

    from ops.run import claims, claimstep, runner
    from ops.schedule import slots

    from .test_slot_instants import another_machine

    if connection.vendor != "postgresql":
        pytest.skip("SQLite has one writer at a time: no fencing lock to share")
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text("0 3 * * * --name=t sleep_demo --seconds=0\n")
    slot = slots.make_slot("0 3 * * *", dt.datetime(2026, 12, 1, 3, 0, tzinfo=dt.UTC))
    held = claims.claim(
        "t", slot, host="host-a", pid=4242, now=dt.datetime(2026, 12, 1, 3, 0, 1, tzinfo=dt.UTC),
        stale_after=90.0, force=False, command="sleep_demo", identity=another_machine(),
        heartbeat=30.0,
    )  # fmt: skip
    fence = claims.held_claim(held.run)
    fenced, done = threading.Event(), threading.Event()

    def holder():
        try:
            with transaction.atomic():
                assert fence.still_held(lock=True)
                fenced.set()
                done.wait(60)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert fenced.wait(30)
        monkeypatch.setattr(claimstep, "TAKEOVER_WAIT", 1.5)
        started = time.monotonic()
        with time_machine.travel("2026-12-01T04:00:00+00:00", tick=False):
            code = runner.run(["t"])
        took = time.monotonic() - started
    finally:
        done.set()
        thread.join()
    out = capsys.readouterr().out
    assert code == 75, out
    assert 1.5 <= took < 10, took
    # What is left of the 1.5 s bound when the wait begins (less on a loaded machine).
    waited = re.search(r"waiting up to ([\d.]+)(ms|s) for that transaction to end", out)
    assert waited, out
    assert 0 < float(waited[1]) / (1000 if waited[2] == "ms" else 1) <= 1.5, out
    assert (
        f"skipped: run #{held.run.pk} on host-a (pid 4242) stopped heartbeating inside a "
        "fencing transaction of its job, which had not ended when this run's bound (1.5s) "
        "passed; 2026-12-01 is taken over once it ends"
    ) in out
    assert claims.peek("t", "2026-12-01").version == 1  # still the frozen holder's
