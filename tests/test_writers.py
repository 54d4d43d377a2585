"""run_job meets another writer (issue 20, item 3): SQLite's one writer at a time, and the locks
of PostgreSQL's claim step.

Before: a job holding a write transaction for 45 s made another job that started 4 s later fail
after 31 s (`database unavailable: database is locked`, exit 1, nothing recorded, the slot not
run), a locked database at the end lost the outcome, and a claim blocked on a lock could not be
ended by SIGTERM. Now each write of run_job's own waits a short while per try and is tried
again within a bound (ops/run/patience.py), signals checked between tries.

The in-process tests shorten the settings' busy timeout (30 s) to 1 s, so that the writer holds
the database longer than it, as the 45 s job did, in a few seconds. The writer lets go once the
run has said that it waits for it (`said_waiting`), not after a time counted from its own start:
the run, wherever it met the writer, has then waited past the busy timeout and past the delay
before it says so (patience.SAY_AFTER), however slowly a loaded machine brought it there.
"""

import datetime as dt
import hashlib
import io
import re
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import time_machine
from django.core.management import call_command
from django.db import OperationalError, connection, transaction

from ops.models import JobPause, JobRun, Outcome, SlotClaim
from ops.run import patience, runner

from .conftest import PING_KEY
from .test_takeover import Lines, lock_waits, wait_for

# How long a Writer waits for `until` at most: then it lets go, the run goes on (its bound is
# 5 min), and the test fails on what the run did not say.
HOLD_AT_MOST = 60.0


class Writer:
    """Another process's write transaction on the SQLite file (BEGIN IMMEDIATE): held until
    `release()`, or until the event `until` is set (HOLD_AT_MOST at most)."""

    def __init__(self, path: str):
        self.con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.held = False
        self.lock = threading.Lock()

    def hold(self, until: threading.Event | None = None) -> "Writer":
        self.con.execute("BEGIN IMMEDIATE")
        self.con.execute("CREATE TABLE IF NOT EXISTS t_writer (x)")
        self.held = True
        if until is not None:

            def release_once_set():
                until.wait(HOLD_AT_MOST)
                self.release()

            threading.Thread(target=release_once_set, daemon=True).start()
        return self

    def release(self) -> None:
        with self.lock:
            if self.held:
                self.held = False
                self.con.execute("COMMIT")
                self.con.close()


@pytest.fixture
def sqlite_db(transactional_db, settings, tmp_path):
    """The test database (SQLite only) with a 1 s busy timeout; its file's path."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's one writer")
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    options = connection.settings_dict["OPTIONS"]
    before = options.get("timeout")
    options["timeout"] = 1
    connection.close()
    yield connection.settings_dict["NAME"]
    options["timeout"] = before
    connection.close()


@pytest.fixture
def said_waiting(monkeypatch) -> threading.Event:
    """Set once run_job (or job_pause, job_resume) has said that it waits for another writer,
    which it says when a wait has lasted patience.SAY_AFTER seconds. (A writer held for a fixed
    7 s from its start, the run had to meet it within 2 s to say so: a load-dependent test.)"""
    said = threading.Event()
    patiently = patience.patiently

    def saying(write, *, waiting=None, **kwargs):
        def told(reason: str, bound: float) -> None:
            waiting(reason, bound)
            said.set()

        return patiently(write, waiting=told if waiting is not None else None, **kwargs)

    monkeypatch.setattr(patience, "patiently", saying)
    return said


def run_at(instant: str, *argv: str) -> int:
    with time_machine.travel(instant, tick=False):
        return runner.run(list(argv))


def test_a_claim_that_meets_a_longer_writer_waits_for_it_and_runs_the_slot(
    sqlite_db, tmp_path, capsys, said_waiting
):
    (tmp_path / "t.cron").write_text("0 3 * * * --name=t sleep_demo --seconds=0\n")
    # longer than the busy timeout (1 s here), and than the 5 s it waits before saying so
    writer = Writer(sqlite_db).hold(until=said_waiting)
    started = time.monotonic()
    try:
        code = run_at("2026-11-29T03:00:05+00:00", "t")
    finally:
        writer.release()
    err = capsys.readouterr().err
    assert code == 0, err
    assert time.monotonic() - started >= patience.SAY_AFTER  # it waited, then said so
    assert (
        "job t: another writer holds the database; waiting for it to claim 2026-11-29 (at most "
        "5m)" in err
    )
    run = JobRun.objects.get()
    assert (run.slot, run.outcome) == ("2026-11-29", Outcome.SUCCEEDED)


def test_a_claim_locked_for_the_whole_bound_says_so_pings_fail_and_exits_1(
    sqlite_db, tmp_path, capsys, monkeypatch, settings, ping_server
):
    settings.HEALTHCHECKS_PING_URL = ping_server.url_for("/")
    settings.HEALTHCHECKS_PING_KEY = PING_KEY
    monkeypatch.setattr(patience, "LOCK_WAIT", 2.0)
    (tmp_path / "t.cron").write_text("0 3 * * * --name=t sleep_demo --seconds=0\n")
    writer = Writer(sqlite_db).hold()
    try:
        code = run_at("2026-11-29T03:00:05+00:00", "t")
    finally:
        writer.release()
    err = capsys.readouterr().err
    assert code == 1, err
    said = re.search(
        r"cronops: error: job t: database is locked by another writer for (\d+) s: could not "
        r"claim 2026-11-29 \(not recorded: nothing can be written\)",
        err,
    )
    assert said and int(said.group(1)) >= 2, err
    [(request, _)] = ping_server.log
    assert request.path == f"/{PING_KEY}/t/fail"
    assert b"database is locked by another writer for" in request.get_data()
    assert not JobRun.objects.exists() and not SlotClaim.objects.exists()


def test_the_outcome_waits_for_a_writer_that_holds_the_database_as_the_job_ends(
    sqlite_db, tmp_path, capsys, said_waiting
):
    """Before: two tries of the busy timeout, then `database unavailable: could not record the
    outcome`, exit 1: a succeeded slot left `running`, to be run again."""
    started, go = tmp_path / "started", tmp_path / "go"
    (tmp_path / "job.py").write_text(
        f"import os, time\nopen({str(started)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.02)\n"
    )
    job = f"shell --command=\"exec(open('{tmp_path}/job.py').read())\""
    (tmp_path / "t.cron").write_text(f"0 3 * * * --name=t {job}\n")
    writer = Writer(sqlite_db)
    held = []

    def hold_as_the_job_ends():
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        writer.hold(until=said_waiting)  # the run's record waits for it from here
        held.append(time.monotonic())
        go.touch()

    thread = threading.Thread(target=hold_as_the_job_ends)
    thread.start()
    try:
        exit_code = run_at("2026-11-29T03:00:05+00:00", "t")
    finally:
        thread.join()
        writer.release()
    err = capsys.readouterr().err
    assert exit_code == 0, err
    assert time.monotonic() - held[0] >= patience.SAY_AFTER  # it waited, then said so
    assert "job t: another writer holds the database; waiting for it to write its record" in err
    assert list(JobRun.objects.values_list("outcome", flat=True)) == [Outcome.SUCCEEDED]
    assert list(SlotClaim.objects.values_list("state", flat=True)) == [Outcome.SUCCEEDED]


def test_a_write_of_cronops_that_meets_another_writer_waits_its_try_instead_of_failing_at_once(
    sqlite_db, monkeypatch
):
    """SQLite fails a transaction that has read and then meets another writer at once (waiting
    could deadlock): the claim reads before it writes, so 20 jobs of one minute went round
    patiently()'s pauses up to 12 times each. Its first statement now takes the write lock,
    and a lock it does not get is waited for (a try: patience.TRY). Django's default
    transactions (startproject's settings: no transaction_mode) begin without a lock."""
    options = connection.settings_dict["OPTIONS"]
    monkeypatch.setitem(options, "transaction_mode", None)
    connection.close()
    writer = Writer(sqlite_db).hold()
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            with patience.short_lock_waits(), transaction.atomic():
                patience.in_transaction()
                SlotClaim.objects.filter(job="t").exists()  # a read first, as a claim's
                SlotClaim.objects.filter(job="t").update(heartbeat_at=None)
        assert time.monotonic() - started >= patience.TRY
    finally:
        writer.release()
        connection.close()


def test_a_write_waiting_through_several_tries_runs_again_only_once_the_lock_is_free(
    sqlite_db, monkeypatch
):
    """Twenty jobs of one minute wait for each other's writes through many tries: each try
    after the first takes SQLite's write lock and gives it back at once (BEGIN IMMEDIATE,
    ROLLBACK) instead of running the whole write (a claim's Python, a transaction begun and
    rolled back) to meet the lock again."""
    writer = Writer(sqlite_db).hold()
    probes: list[bool] = []
    lock_free = patience._write_lock_free

    def probe() -> bool:
        if len(probes) == 3:
            writer.release()  # after three tries that found it held
        probes.append(lock_free())
        return probes[-1]

    monkeypatch.setattr(patience, "_write_lock_free", probe)
    writes = []

    def write() -> int:
        writes.append(probes.copy())
        with transaction.atomic():
            patience.in_transaction()
            return SlotClaim.objects.filter(job="t").update(heartbeat_at=None)

    try:
        assert patience.patiently(write, sleep=time.sleep) == 0
    finally:
        writer.release()
        connection.close()
    assert probes == [False, False, False, True]
    assert writes == [[], probes]  # the first try, then once the lock was free


def test_the_write_lock_is_taken_only_on_the_database_cronops_writes_to(sqlite_db, monkeypatch):
    """A project's router may keep cronops' tables in another database than the default one,
    which the claim's and the record's transactions are on: locking ops_slotclaim there failed
    with "no such table" (run_job: "cronops' tables are missing", the outcome not recorded;
    job_pause refused), where the runs had worked."""
    from django.db import router
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        patience.in_transaction()
    assert any("ops_slotclaim" in q["sql"] for q in queries)

    monkeypatch.setattr(router, "db_for_write", lambda model, **hints: "elsewhere")
    connection.cursor().execute("ALTER TABLE ops_slotclaim RENAME TO ops_slotclaim_moved")
    try:
        with CaptureQueriesContext(connection) as queries, transaction.atomic():
            patience.in_transaction()  # no "no such table: ops_slotclaim"
        assert not any("ops_slotclaim" in q["sql"] for q in queries)
    finally:
        connection.cursor().execute("ALTER TABLE ops_slotclaim_moved RENAME TO ops_slotclaim")


def test_sigterm_ends_a_claim_waiting_for_another_writer_at_once(sqlite_project):
    project = sqlite_project
    project.add_command("t_job", "print('ran', flush=True)")
    project.write_cron("t.cron", "0 0 * * * t_job\n")
    writer = Writer(project.db.url.removeprefix("sqlite:///")).hold()
    try:
        proc = project.popen("run_job", "t_job")
        said = Lines(proc, stream="stderr")
        # Before: silent for the busy timeout (30 s), then `database unavailable`, exit 1.
        wait_for(
            lambda: "another writer holds the database" in said.text or proc.poll() is not None,
            60,
            what="run_job to say it waits for the writer",
        )
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        took = time.monotonic() - sent
        said.thread.join(10)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:  # a failed wait: not left to claim and run the job
            proc.kill()
        writer.release()
    assert proc.returncode == 143, said.text + out
    assert took < 10, took  # at once; before, the 30 s busy timeout or the lock holder
    assert "waiting for it to claim" in said.text
    assert "terminated by SIGTERM while waiting for a lock to claim" in out
    assert "ran" not in out
    # nothing of it left running (its skip could not be written either, and it said so)
    assert "this skip is not recorded" in said.text
    assert project.db.query("SELECT count(*) FROM ops_slotclaim") == [(0,)]


def test_sigterm_ends_a_claim_waiting_for_the_jobs_claim_lock_at_once(pg_project):
    """PostgreSQL: a claim meets a lock held by another transaction (here the job's claim
    lock, as a claim transaction frozen half-way would hold it). Before: blocked in the
    database, deaf to SIGTERM until the lock was released."""
    import psycopg

    project = pg_project
    project.add_command("t_job", "print('ran', flush=True)")
    project.write_cron("t.cron", "0 0 * * * t_job\n")
    digest = hashlib.sha256(b"cronops claim t_job").digest()
    with psycopg.connect(project.db.url) as holder:  # a transaction, open until the end
        holder.execute(
            "SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(digest[:8], "big", signed=True)]
        )
        proc = project.popen("run_job", "t_job")
        said = Lines(proc, stream="stderr")
        began = time.monotonic()
        wait_for(  # it says so after 5 s (before issue 20 it sat in the database, silent)
            lambda: (
                "holds a lock it needs" in said.text
                or (lock_waits(project.db) > 0 and time.monotonic() - began > 10)
            ),
            what="the claim at the lock",
        )
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        finally:
            holder.rollback()
        took = time.monotonic() - sent
        said.thread.join(10)
    out = proc.stdout.read()
    assert proc.returncode == 143, said.text + out
    assert took < 10, took  # at once; before, the 30 s busy timeout or the lock holder
    assert "job t_job: another transaction holds a lock it needs; waiting for it to claim" in (
        said.text
    )
    assert project.db.query("SELECT outcome, exit_code FROM ops_jobrun") == [("skipped", 143)]
    assert project.db.query("SELECT count(*) FROM ops_slotclaim") == [(0,)]


def test_a_paused_fire_waits_for_a_longer_writer_and_records_its_skip(
    sqlite_db, tmp_path, capsys, settings, ping_server, said_waiting
):
    """Issue 22, item 2. Before: `database unavailable: database is locked` after the busy
    timeout (31 s with the settings' 30 s), exit 1, nothing recorded, a /fail ping; a paused
    fire records a skip and exits 0."""
    settings.HEALTHCHECKS_PING_URL = ping_server.url_for("/")
    settings.HEALTHCHECKS_PING_KEY = PING_KEY
    (tmp_path / "t.cron").write_text("0 3 * * * --name=t sleep_demo --seconds=0\n")
    JobPause.objects.create(
        job="t", paused_by="alice", since=dt.datetime(2026, 11, 28, tzinfo=dt.UTC), reason="db"
    )
    writer = Writer(sqlite_db).hold(until=said_waiting)  # past the busy timeout and the 5 s
    started = time.monotonic()
    try:
        code = run_at("2026-11-29T03:00:05+00:00", "t")
    finally:
        writer.release()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert time.monotonic() - started >= patience.SAY_AFTER  # it waited, then said so
    assert "job t: another writer holds the database; waiting for it to write its record" in err
    assert "job t: paused by alice since 2026-11-28 00:00 UTC, until resumed: db" in out
    run = JobRun.objects.get()
    assert (run.slot, run.outcome, run.paused, run.exit_code) == (
        "2026-11-29",
        Outcome.SKIPPED,
        True,
        0,
    )
    assert [r.path for r, _ in ping_server.log] == [f"/{PING_KEY}/t/log"]


def test_job_pause_and_job_resume_wait_for_a_longer_writer(
    sqlite_db, tmp_path, settings, monkeypatch, said_waiting
):
    """Before: `database unavailable: database is locked` after the busy timeout, exit 2."""
    (tmp_path / "t.cron").write_text("0 3 * * * --name=t sleep_demo --seconds=0\n")
    # The writer lets go once the command has waited for it twice the busy timeout (1 s here).
    monkeypatch.setattr(patience, "SAY_AFTER", 2.0)
    for command in ("job_pause", "job_resume"):
        said_waiting.clear()
        writer = Writer(sqlite_db).hold(until=said_waiting)
        started = time.monotonic()
        out, err = io.StringIO(), io.StringIO()
        try:
            call_command(command, "t", stdout=out, stderr=err)
        finally:
            writer.release()
        assert out.getvalue().startswith("paused t by " if command == "job_pause" else "resumed t")
        assert time.monotonic() - started >= patience.SAY_AFTER  # it waited, then said so
        assert "another writer holds the database; waiting for it" in err.getvalue()
    pause = JobPause.objects.get()
    assert pause.ended_at is not None


@pytest.mark.process
def test_sigterm_ends_a_paused_fire_waiting_for_another_writer_at_once(sqlite_project):
    project = sqlite_project
    project.add_command("t_job", "print('ran', flush=True)")
    project.write_cron("t.cron", "0 0 * * * t_job\n")
    paused = project.manage("job_pause", "t_job")
    assert paused.returncode == 0, paused.stderr
    writer = Writer(project.db.url.removeprefix("sqlite:///")).hold()
    try:
        proc = project.popen("run_job", "t_job")
        said = Lines(proc, stream="stderr")
        wait_for(
            lambda: "another writer holds the database" in said.text or proc.poll() is not None,
            60,
            what="run_job to say it waits for the writer",
        )
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        took = time.monotonic() - sent
        said.thread.join(10)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:  # a failed wait: not left to claim and run the job
            proc.kill()
        writer.release()
    assert proc.returncode == 143, said.text + out
    assert took < 10, took  # at once; before, the 30 s busy timeout or the lock holder
    assert "terminated by SIGTERM while waiting for another writer to record its pause" in (
        said.text
    )
    assert "ran" not in out
    assert project.db.query("SELECT count(*) FROM ops_jobrun") == [(0,)]


def test_the_bound_and_the_advice_are_in_the_readme():
    readme = (Path(__file__).resolve().parent.parent / "docs" / "run_job.md").read_text()
    assert f"{patience.LOCK_WAIT / 60:.0f} minutes" in readme
    assert "PRAGMA busy_timeout" in readme
