"""run_job as cron runs it: real processes, a real database, real signals and a real ping server."""

import datetime as dt
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import (
    DAILY,
    DAILY_DATE,
    PING_KEY,
    SLEEPER,
    kill_a_scheduled_run_mid_command,
    ping_to,
    wait_for_line,
    wait_until,
)

# A job that notes its pid in ran.txt, says "working", then waits for the file `go` in its
# project directory (and fails with 9 if it never comes): a runner that holds its lock and its
# claim until the test lets it go, however long the machine takes to start the other processes.
GATED = """
from django.conf import settings
with open(settings.BASE_DIR / "ran.txt", "a") as f:
    f.write(f"{os.getpid()}\\n")
print("working", flush=True)
deadline = time.monotonic() + 120
while not (settings.BASE_DIR / "go").exists():
    if time.monotonic() > deadline:
        raise CommandError("never let go: no go file after 120 s", returncode=9)
    time.sleep(0.02)
print("done", flush=True)
"""


def ran_count(project) -> int:
    path = project.dir / "ran.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def today_utc() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


def first_to_exit(*procs: subprocess.Popen) -> subprocess.Popen | None:
    return next((p for p in procs if p.poll() is not None), None)


def waits_for_lock(proc: subprocess.Popen, lock: Path) -> bool:
    """Whether `proc` has the lock file `lock` open: run_job opens it just before its first try
    of the lock (ops/run/lock.py), so a run that finds the lock held has it open while it
    waits for it (--wait). Fails at once when `proc` has ended."""
    if proc.poll() is not None:
        out, err = proc.communicate()
        raise AssertionError(f"pid {proc.pid} ended ({proc.returncode}): {out + err}")
    target = os.path.realpath(lock)
    fds = Path(f"/proc/{proc.pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == target:
                return True
        except FileNotFoundError:  # closed since the listing
            pass
    return False


def stop(*procs: subprocess.Popen) -> None:
    """Kill what a failed test left running (a run_job's job dies with it)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_two_runners_started_together_run_the_command_once_and_the_other_exits_75(project):
    project.add_command("t_gated", GATED)
    project.write_cron("t.cron", f"{DAILY} t_gated\n")
    a = project.popen("run_job", "t_gated")
    b = project.popen("run_job", "t_gated")
    try:
        # The winner's command waits for `go`: the loser finds it inside its command however
        # long the machine takes to start either process, and must exit without waiting.
        loser = wait_until(lambda: first_to_exit(a, b), "one of the two runners to exit", 60)
        winner = b if loser is a else a
        out, err = loser.communicate()
        assert loser.returncode == 75, out + err
        assert winner.poll() is None, "the winner ended before it was let go"
        assert "skipped: running since" in out and f"pid {winner.pid}" in out
        (project.dir / "go").touch()
        winner_out, winner_err = winner.communicate(timeout=60)
        assert winner.returncode == 0, winner_out + winner_err
    finally:
        (project.dir / "go").touch()
        stop(a, b)
    assert ran_count(project) == 1
    outcomes = sorted((o, c) for _, _, _, o, c, _ in project.db.runs("t_gated"))
    assert outcomes == [("skipped", 75), ("succeeded", 0)]


def test_the_same_slot_run_twice_charges_the_billing_once(project):
    # DAILY fires twelve hours from now: the three runs cannot straddle a fire time.
    project.write_cron("10-billing.cron", f"{DAILY} charge_daily\n")
    assert project.manage("seed_demo").returncode == 0
    first = project.run_job("charge_daily")
    second = project.run_job("charge_daily")
    forced = project.run_job("--force", "charge_daily")
    assert (first.returncode, second.returncode, forced.returncode) == (0, 0, 0)
    assert "charged 3" in first.stdout
    assert "already done for" in second.stdout
    assert "charged 0, already charged 3" in forced.stdout
    assert project.db.query("SELECT count(*) FROM commands_dailycharge") == [(3,)]
    balances = project.db.query("SELECT customer, balance FROM commands_subscription ORDER BY id")
    assert [(c, float(b)) for c, b in balances] == [("alice", 90.1), ("bob", 80.1), ("carol", 95.5)]
    # The forced run was stopped by ops.once, before DailyCharge's constraint
    marks = project.db.query("SELECT job, key FROM ops_effect ORDER BY id")
    assert marks == [("charge_daily", f"charge subscription {n}") for n in (1, 2, 3)]


def test_a_run_killed_with_sigkill_is_recorded_abandoned_and_the_next_run_completes_the_slot(
    project,
):
    victim = kill_a_scheduled_run_mid_command(project)

    again = project.run_job("t_sleep")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "recorded the dead attempt" in again.stderr
    runs = project.db.runs("t_sleep")
    assert [r[3] for r in runs] == ["abandoned", "succeeded"]
    assert runs[0][1] == runs[1][1]  # the same slot
    assert f"pid {victim.pid}" in runs[0][5]
    assert project.db.query("SELECT state FROM ops_slotclaim WHERE job = 't_sleep'") == [
        ("succeeded",)
    ]
    assert project.run_job("t_sleep").stdout.count("already done") == 1


def test_two_hosts_sharing_postgresql_run_a_slot_once(pg_project, tmp_path):
    project = pg_project
    project.add_command("t_gated", GATED)
    project.write_cron("t.cron", f"{DAILY} t_gated\n")
    host_b = {"OPS_HOST": "host-b", "OPS_LOCK_DIR": tmp_path / "lock-b"}
    a = project.popen("run_job", "t_gated")
    b = project.popen("run_job", "t_gated", env=host_b)
    try:
        # The winner's command waits for `go`: the other host finds the slot running (not
        # done), however long the machine takes to start it.
        loser = wait_until(lambda: first_to_exit(a, b), "one of the two hosts' runs to exit", 60)
        out, err = loser.communicate()
        assert loser.returncode == 75, out + err
        (project.dir / "go").touch()
        winner = b if loser is a else a
        winner_out, winner_err = winner.communicate(timeout=60)
        assert winner.returncode == 0, winner_out + winner_err
    finally:
        (project.dir / "go").touch()
        stop(a, b)
    assert ran_count(project) == 1
    hosts = project.db.query("SELECT host, outcome FROM ops_jobrun ORDER BY outcome")
    assert {h for h, _ in hosts} == {"host-a", "host-b"}


def test_a_claim_left_by_a_killed_run_on_another_host_is_taken_over_once_its_heartbeat_is_stale(
    pg_project, tmp_path
):
    project = pg_project
    victim = kill_a_scheduled_run_mid_command(project)
    host_b = {"OPS_HOST": "host-b", "OPS_LOCK_DIR": tmp_path / "lock-b"}
    # The victim ran on another machine: host-b cannot look its process up, only its heartbeat.
    project.db.execute("UPDATE ops_slotclaim SET holder_boot_id = 'boot-of-host-a'")

    fresh = project.run_job("t_sleep", env=host_b)
    assert fresh.returncode == 75
    assert f"pid {victim.pid}, host host-a" in fresh.stdout

    # Time passes: the heartbeat is older than 3 intervals (90 s by default).
    project.db.execute(
        "UPDATE ops_slotclaim SET heartbeat_at = heartbeat_at - interval '10 minutes'"
    )
    stale = project.run_job("t_sleep", env=host_b)
    assert stale.returncode == 0, stale.stdout + stale.stderr
    outcomes = [(r[3]) for r in project.db.runs("t_sleep")]
    assert outcomes == ["abandoned", "skipped", "succeeded"]
    assert project.db.query("SELECT state, host FROM ops_slotclaim") == [("succeeded", "host-b")]


def test_a_timeout_ends_the_job_with_124_and_records_and_pings_a_failure(
    sqlite_project, ping_server
):
    project = sqlite_project
    ping_to(project, ping_server)
    project.add_command("t_sleep", SLEEPER)
    started = time.monotonic()
    result = project.run_job("--timeout=1s", "t_sleep", env={"SLEEP": "30"})
    assert result.returncode == 124
    # A cold start of manage.py on a loaded machine included: what this guards against is a
    # timeout that never ends the job (its 30 s sleep, or more).
    assert time.monotonic() - started < 25
    assert "timed out after 1s" in result.stderr
    assert [r[3:5] for r in project.db.runs()] == [("timed_out", 124)]
    paths = [req.path for req, _ in ping_server.log]
    assert paths[-1] == f"/{PING_KEY}/t_sleep/124"  # the exit code (tests/test_pings.py)


def test_sigterm_ends_the_job_with_143_and_records_it_terminated(sqlite_project, ping_server):
    project = sqlite_project
    ping_to(project, ping_server)
    project.add_command("t_sleep", SLEEPER)
    proc = project.popen("run_job", "t_sleep", env={"SLEEP": "30"})
    wait_for_line(proc, "working")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 143
    assert [r[3:5] for r in project.db.runs()] == [("terminated", 143)]
    assert [req.path for req, _ in ping_server.log][-1].endswith("/t_sleep/143")


def test_a_command_error_with_returncode_3_exits_3_and_pings_3_with_the_output_tail(
    project, ping_server
):
    ping_to(project, ping_server)
    project.add_command(
        "t_fail",
        """
        print("step 1 ok")
        print("step 2 about to fail", file=sys.stderr)
        raise CommandError("invoice 42 is broken", returncode=3)
    """,
    )
    result = project.run_job("t_fail")
    assert result.returncode == 3
    assert "step 1 ok" in result.stdout and "step 2 about to fail" in result.stderr
    final = [(req, _) for req, _ in ping_server.log if req.path.endswith("/t_fail/3")]
    assert len(final) == 1
    body = final[0][0].get_data(as_text=True)
    assert "step 1 ok" in body and "invoice 42 is broken" in body
    [(outcome, code, tail)] = project.db.query(
        "SELECT outcome, exit_code, output_tail FROM ops_jobrun"
    )
    assert (outcome, code) == ("failed", 3) and "invoice 42 is broken" in tail


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("raise SystemExit(5)", 5),
        ("raise SystemExit()", 0),
        ("raise ValueError('boom')", 1),
        ("sys.exit('fatal: no input')", 1),
    ],
)
def test_exit_codes_pass_through_from_the_command(sqlite_project, code, expected):
    sqlite_project.add_command("t_exit", code)
    result = sqlite_project.run_job("t_exit")
    assert result.returncode == expected
    if "ValueError" in code:
        assert "Traceback" in result.stderr and "ValueError: boom" in result.stderr


def _refusing():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now
    return None, f"http://127.0.0.1:{port}/"


class BrokenPingServer:
    """A broken ping server that tells, from the order of events and not from timings, whether
    the job started while its start ping was unanswered: "500" and "429" hold /start until the
    job's stamp file exists (then answer that status), "blackhole" holds every request and
    answers none, "refused" refuses connections until the job has started and then answers
    500, so a /start that arrives is a retry that went on beside the job. `starts` lists what
    each /start saw."""

    def __init__(self, stamp, failure: str, deadline: float = 60.0):
        self.stamp, self.failure, self.deadline = stamp, failure, deadline
        self.starts: list[str] = []
        self.last = 0.0  # when the last request was answered or hung up on (time.time())
        self.answers: list[threading.Thread] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.closed = threading.Event()
        if failure != "refused":
            self.sock.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        """Stop listening, and see every request to its end (`last` is final then)."""
        self.closed.set()
        self.sock.close()
        for answer in self.answers:
            answer.join(10)

    def _until(self, condition) -> bool:
        end = time.monotonic() + self.deadline
        while not condition():
            if self.closed.is_set() or time.monotonic() > end:
                return False
            time.sleep(0.005)
        return True

    def _serve(self) -> None:
        if self.failure == "refused" and not self._until(self.stamp.exists):
            return
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            answer = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self.answers.append(answer)
            answer.start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(self.deadline)
            try:
                path = self._read_request(conn)
                start = path.endswith(b"/start")
                if start and self.failure == "refused":
                    self.starts.append("retried beside the job")
                if self.failure == "blackhole" or (start and self.failure != "refused"):
                    seen = "held beside the job" if self._held(conn) else "given up before the job"
                    if start:
                        self.starts.append(seen)
                    if self.failure == "blackhole":
                        conn.recv(1)  # never answer: until the runner hangs up
                        return
                status = 500 if self.failure == "refused" else int(self.failure)
                conn.sendall(b"HTTP/1.1 %d Oops\r\nContent-Length: 4\r\n\r\noops" % status)
            except OSError:
                pass
            finally:
                self.last = max(self.last, time.time())

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("the runner hung up mid-request")
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.lower().split(b"\r\n")
        length = next((int(h[15:]) for h in lines if h.startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("the runner hung up mid-body")
            body += chunk
        return head.split(b" ")[1].split(b"?")[0]

    def _held(self, conn: socket.socket) -> bool:
        """Hold the request until the job has started (True) or the runner hangs up (False)."""
        gone = False

        def started_or_gone() -> bool:
            nonlocal gone
            if self.stamp.exists():
                return True
            if select.select([conn], [], [], 0)[0]:
                try:
                    gone = not conn.recv(1, socket.MSG_PEEK)
                except OSError:
                    gone = True
            return gone

        return self._until(started_or_gone) and not gone


START_STAMP = """
from pathlib import Path
Path(os.environ["STAMP"]).write_text(str(time.time()))
raise CommandError("failing on purpose", returncode=3)
"""


@pytest.mark.parametrize("failure", ["refused", "blackhole", "500", "429"])
def test_a_broken_ping_server_never_changes_the_exit_code_or_delays_the_start(
    sqlite_project, tmp_path, failure
):
    project = sqlite_project
    project.add_command("t_job", START_STAMP)
    # The half of it the final ping waits for /start (4 s) lets a refused /start's third
    # attempt (3 s of backoff) go out.
    budget = 8
    project.write_env(HEALTHCHECKS_PING_KEY=PING_KEY, OPS_PING_BUDGET_SECONDS=budget)
    baseline = project.run_job("--no-ping", "t_job", env={"STAMP": str(tmp_path / "baseline")})
    stamp = tmp_path / "started"
    server = BrokenPingServer(stamp, failure)
    try:
        broken = project.run_job(
            "t_job", env={"HEALTHCHECKS_PING_URL": server.url, "STAMP": str(stamp)}
        )
    finally:
        server.close()
    assert baseline.returncode == broken.returncode == 3
    assert stamp.exists(), "the job never started"
    # The job is forked before /start goes out, so it starts while /start is still unanswered
    # (or still being retried: a refused one's last retry goes 3 s after the fork, a window
    # only for the forked child's first lines), however loaded the machine.
    seen = "retried beside the job" if failure == "refused" else "held beside the job"
    assert server.starts[:1] == [seen], f"the job waited for its start ping: {server.starts}"
    # From the outcome's record to the last ping's end: the final ping's budget. Pings that
    # ignored it would take 22 s on a black hole (the wait for /start, then three 5 s attempts
    # and 3 s of backoff).
    assert server.last, "no ping reached the server"
    [(finished,)] = project.db.query("SELECT finished_at FROM ops_jobrun ORDER BY id DESC LIMIT 1")
    finished = dt.datetime.fromisoformat(str(finished)).replace(tzinfo=dt.UTC).timestamp()
    took = server.last - finished
    assert took < budget + 1, f"the pings took longer than their budget ({took:.1f} s)"
    # 429 is not retried (a retry counts against the per-minute limit again) and says so.
    assert ("rate-limited" if failure == "429" else " failed (") in broken.stderr
    assert PING_KEY not in broken.stdout + broken.stderr
    assert [r[3:5] for r in project.db.runs()] == [("failed", 3), ("failed", 3)]


def test_pings_carry_one_fresh_rid_per_run_and_201_created_counts_as_success(
    sqlite_project, httpserver
):
    project = sqlite_project
    httpserver.expect_request("").respond_with_data("Created", status=201)
    ping_to(project, httpserver, HEALTHCHECKS_AUTO_CREATE=1)
    project.add_command("t_ok", "print('fine')")
    first, second = project.run_job("t_ok"), project.run_job("t_ok")
    assert first.returncode == second.returncode == 0
    assert "ping" not in first.stderr  # no warning: 201 is a success
    requests = [
        (req.path, req.args.get("rid"), req.args.get("create")) for req, _ in httpserver.log
    ]
    assert [p for p, _, _ in requests] == [f"/{PING_KEY}/t_ok/start", f"/{PING_KEY}/t_ok"] * 2
    rids = [r for _, r, _ in requests]
    assert rids[0] == rids[1] and rids[2] == rids[3] and rids[0] != rids[2]
    assert {c for _, _, c in requests} == {"1"}
    stored = project.db.query("SELECT rid FROM ops_jobrun ORDER BY id")
    assert [r for (r,) in stored] == [rids[0], rids[2]]


def test_the_ping_body_is_the_output_tail_cut_to_the_servers_body_limit(sqlite_project, httpserver):
    project = sqlite_project
    httpserver.expect_request("").respond_with_data("OK", headers={"Ping-Body-Limit": "1000"})
    ping_to(project, httpserver)
    # The start ping must have answered (it carries the limit) before the job ends: the job
    # waits for `go`, given once the server has answered /start.
    project.add_command(
        "t_loud_slow",
        """
        from django.conf import settings
        deadline = time.monotonic() + 120
        while not (settings.BASE_DIR / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        for i in range(5000):
            print(f"line {i}")
        print("the last line")
    """,
    )
    proc = project.popen("run_job", "t_loud_slow")
    try:
        wait_until(
            lambda: any(req.path.endswith("/t_loud_slow/start") for req, _ in httpserver.log),
            "the server to answer the start ping",
        )
        (project.dir / "go").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        (project.dir / "go").touch()
        stop(proc)
    assert proc.returncode == 0, err
    final = [req for req, _ in httpserver.log if req.path.endswith("/t_loud_slow")]
    body = final[0].get_data()
    assert len(body) <= 1000 and body.endswith(b"the last line\n")
    total = sum(len(f"line {i}\n") for i in range(5000)) + len("the last line\n")
    notice = f"[cronops] output truncated: only the end of {total} bytes is shown\n".encode()
    assert body.startswith(notice)


def test_no_output_in_ping_and_a_ping_override_by_uuid(sqlite_project, ping_server):
    project = sqlite_project
    project.write_env(HEALTHCHECKS_PING_URL=ping_server.url_for("/"))
    project.add_command("t_ok", "print('private stuff')")
    uuid = "5bf66975-d4c7-4bf5-bcc8-b8d8a82ea278"
    assert project.run_job(f"--ping={uuid}", "--no-output-in-ping", "t_ok").returncode == 0
    assert [req.path for req, _ in ping_server.log] == [f"/{uuid}/start", f"/{uuid}"]
    assert ping_server.log[-1][0].get_data() == b""
    assert project.run_job("--no-ping", "t_ok").returncode == 0
    assert len(ping_server.log) == 2  # and without a key nothing is pinged either
    assert project.run_job("t_ok").returncode == 0
    assert len(ping_server.log) == 2


def test_a_skipped_slot_sends_a_log_ping(sqlite_project, ping_server):
    project = sqlite_project
    ping_to(project, ping_server)
    project.add_command("t_ok", "print('fine')")
    project.write_cron("t.cron", f"{DAILY} t_ok\n")
    assert project.run_job("t_ok").returncode == 0
    assert project.run_job("t_ok").returncode == 0
    last = ping_server.log[-1][0]
    assert last.path.endswith("/t_ok/log")
    assert last.get_data(as_text=True).startswith("already done for ")


def test_wait_takes_the_lock_when_the_first_run_ends(sqlite_project):
    project = sqlite_project
    project.add_command("t_gated", GATED)
    first = project.popen("run_job", "t_gated")
    second = None
    try:
        wait_for_line(first, "working")
        second = project.popen("run_job", "--wait=60s", "t_gated")
        # The first run ends only once the second waits for the lock, however slow its start.
        lock = project.lock_dir / "t_gated.lock"
        wait_until(lambda: waits_for_lock(second, lock), "the second run to wait for the lock")
        (project.dir / "go").touch()
        assert first.wait(60) == 0
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0, out + err
    finally:
        (project.dir / "go").touch()
        stop(first, *([second] if second else []))
    assert ran_count(project) == 2  # unscheduled: no slot, so both run


def test_catch_up_runs_missed_days_oldest_first_with_their_own_dates(project):
    project.write_cron("10-billing.cron", f"{DAILY} --catch-up=3 charge_daily\n")
    assert project.manage("seed_demo").returncode == 0
    today = DAILY_DATE
    days = [today - dt.timedelta(days=n) for n in (4, 3, 2, 1, 0)]
    # The job last ran four days ago; the machine was down since.
    assert project.run_job(f"--logical-date={days[0]}", "charge_daily").returncode == 0
    result = project.run_job("charge_daily")
    assert result.returncode == 0, result.stderr
    runs = project.db.runs("charge_daily")
    assert [r[2] for r in runs] == [d.isoformat() for d in days]
    assert all(r[3] == "succeeded" for r in runs)
    charged = project.db.query(
        "SELECT charge_date, count(*) FROM commands_dailycharge GROUP BY charge_date "
        "ORDER BY charge_date"
    )
    assert [(str(d), n) for d, n in charged] == [(d.isoformat(), 3) for d in days]
    # Nothing before the first recorded run, and nothing twice.
    assert project.run_job("--catch-up=10", "charge_daily").stdout.count("already done") == 1


def test_run_as_cron_runs_it_finds_and_loads_the_env_file(sqlite_project):
    project = sqlite_project
    project.write_env(CRONOPS_GREETING="hello-from-dotenv")
    project.add_command("t_env", "print('greeting:', os.environ.get('CRONOPS_GREETING'))")
    result = subprocess.run(
        [
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            sys.executable,
            str(project.dir / "manage.py"),
            "run_job",
            "t_env",
        ],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "greeting: hello-from-dotenv" in result.stdout
    assert [r[3] for r in project.db.runs("t_env")] == ["succeeded"]


def test_quiet_prints_the_output_only_when_the_job_fails(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_maybe",
        """
        print("noise from the job")
        if os.environ.get("FAIL"):
            raise CommandError("it failed", returncode=4)
    """,
    )
    ok = project.run_job("--quiet", "t_maybe")
    bad = project.run_job("--quiet", "t_maybe", env={"FAIL": "1"})
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "", "")
    assert bad.returncode == 4
    assert "noise from the job" in bad.stdout and "it failed" in bad.stdout


def test_output_of_child_processes_passes_through_and_reaches_the_history(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_child",
        """
        import subprocess
        print("from python", flush=True)
        subprocess.run(["sh", "-c", "echo from-a-child; echo child-error >&2"], check=True)
    """,
    )
    result = project.run_job("t_child")
    assert result.returncode == 0
    assert "from python" in result.stdout and "from-a-child" in result.stdout
    assert "child-error" in result.stderr
    [(tail,)] = project.db.query("SELECT output_tail FROM ops_jobrun")
    assert "from-a-child" in tail and "child-error" in tail


def test_memory_stays_flat_when_the_job_prints_hundreds_of_megabytes(sqlite_project):
    project = sqlite_project
    project.add_command(
        "t_flood",
        """
        n = int(os.environ["MB"])
        chunk = ("x" * 1023 + "\\n") * 1024
        for _ in range(n):
            sys.stdout.write(chunk)
        print("end of flood")
    """,
    )

    def peak_rss_kib(mb: int) -> int:
        code = (
            "import resource, subprocess, sys;"
            f"subprocess.run([sys.executable, {str(project.dir / 'manage.py')!r}, 'run_job',"
            " 't_flood'], stdout=subprocess.DEVNULL, check=True);"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
        )
        env = dict(os.environ, MB=str(mb))
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=project.dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return int(out.stdout.strip())

    quiet, flood = peak_rss_kib(0), peak_rss_kib(256)
    assert flood - quiet < 10 * 1024, f"peak RSS grew by {(flood - quiet) / 1024:.1f} MiB"
    [(tail,)] = project.db.query("SELECT output_tail FROM ops_jobrun ORDER BY id DESC LIMIT 1")
    assert tail.rstrip().endswith("end of flood") and "truncated" in tail


def test_usage_errors_exit_2_with_one_line_and_record_nothing(sqlite_project, ping_server):
    project = sqlite_project
    ping_to(project, ping_server)
    for args, message in [
        (["no_such_command"], "unknown command 'no_such_command'"),
        (["--timeout=soon", "check"], "bad duration 'soon'"),
        (["--bogus", "check"], "unrecognized arguments: --bogus"),
        ([], "no command given"),
    ]:
        result = project.run_job(*args)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.stderr
    assert project.db.runs() == []
    assert ping_server.log == []


def test_an_unreachable_database_gives_one_line_a_failure_ping_and_exit_1(
    sqlite_project, ping_server
):
    project = sqlite_project
    ping_to(project, ping_server)
    _, url = _refusing()
    dead = url.replace("http://", "postgres://nobody:pw@").rstrip("/") + "/db"
    project.add_command("t_ok", "print('fine')")
    result = project.run_job("t_ok", env={"DATABASE_URL": dead})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cronops: error: database unavailable:")
    assert "pw@" not in result.stderr
    assert [req.path for req, _ in ping_server.log] == [f"/{PING_KEY}/t_ok/fail"]


def test_no_secret_from_the_env_file_appears_in_output_history_or_ping_bodies(
    sqlite_project, httpserver
):
    project = sqlite_project
    secret_key = project.settings["SECRET_KEY"]
    httpserver.expect_request("").respond_with_data("boom", status=500)
    ping_to(project, httpserver, OPS_PING_BUDGET_SECONDS=2)
    project.add_command("t_boom", "print('working'); raise RuntimeError('kaput')")
    project.write_cron("t.cron", f"{DAILY} t_boom\n@daily --name=ok-job sleep_demo --seconds=0\n")
    outputs = [project.run_job("t_boom"), project.run_job("ok-job"), project.run_job("ok-job")]
    text = "".join(r.stdout + r.stderr for r in outputs)
    text += json.dumps(project.db.query("SELECT * FROM ops_jobrun"), default=str)
    text += "".join(req.get_data(as_text=True) for req, _ in httpserver.log)
    assert "kaput" in text  # the check below looks at real output
    for secret in (PING_KEY, secret_key):
        assert secret not in text


def test_a_nul_byte_in_the_output_is_recorded_and_the_slot_is_not_run_again(project):
    project.add_command("t_nul", "sys.stdout.write('before\\x00after\\n')")
    project.write_cron("t.cron", f"{DAILY} t_nul\n")
    first, second = project.run_job("t_nul"), project.run_job("t_nul")
    assert first.returncode == 0, first.stderr
    assert "already done" in second.stdout
    [(tail,)] = project.db.query("SELECT output_tail FROM ops_jobrun WHERE outcome = 'succeeded'")
    assert "before\ufffdafter" in tail


def test_a_nul_byte_in_a_failures_message_is_recorded_and_the_claim_released(project):
    """PostgreSQL's text cannot hold NUL: a CommandError quoting one made the outcome
    unrecordable ("database unavailable"), the claim stayed running and the slot ran again."""
    project.add_command("t_nul", "raise CommandError('bad byte \\x00 in the input file')")
    project.write_cron("t.cron", f"{DAILY} --no-ping t_nul\n")
    result = project.run_job("t_nul")
    assert result.returncode == 1, result.stderr
    assert "database unavailable" not in result.stderr, result.stderr
    [(outcome, note)] = project.db.query("SELECT outcome, note FROM ops_jobrun")
    assert (outcome, note) == ("failed", "CommandError: bad byte \ufffd in the input file")
    assert project.db.query("SELECT state FROM ops_slotclaim") == [("failed",)]


def test_a_signal_while_the_claim_waits_for_the_database_ends_it_and_never_starts_the_command(
    sqlite_project, ping_server
):
    """The claim waits for the database (the test holds SQLite's write lock), and SIGTERM
    arrives then: the wait ends at once (issue 20; before, the claim was written once the lock
    was free, then recorded terminated), nothing is claimed, the command never starts."""
    import sqlite3

    from .test_takeover import Lines, wait_for

    project = sqlite_project
    ping_to(project, ping_server)
    project.add_command("t_claimed", "print('the command ran')")
    project.write_cron("t.cron", f"{DAILY} t_claimed\n")
    blocker = sqlite3.connect(project.db.url.removeprefix("sqlite:///"), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # run_job's claim waits on this
    try:
        proc = project.popen("run_job", "t_claimed")
        err = Lines(proc, stream="stderr")
        wait_for(lambda: "another writer holds the database" in err.text, what="the wait")
        proc.send_signal(signal.SIGTERM)
        out = proc.stdout.read()
        proc.wait(30)
        err.thread.join(10)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert proc.returncode == 143, err.text
    assert "the command ran" not in out
    assert "terminated by SIGTERM while waiting for a lock to claim" in out
    assert project.db.query("SELECT count(*) FROM ops_slotclaim") == [(0,)]
    assert not [r for r in project.db.runs() if r[3] != "skipped"]
    assert not ping_server.log  # a skip ended by a signal pings nothing, as a standby's


def test_a_future_logical_date_is_refused(sqlite_project):
    project = sqlite_project
    project.write_cron("10-billing.cron", "0 3 * * * charge_daily\n")
    tomorrow = today_utc() + dt.timedelta(days=2)
    result = project.run_job(f"--logical-date={tomorrow}", "charge_daily")
    assert result.returncode == 2
    assert f"--logical-date {tomorrow} is in the future" in result.stderr
    assert project.db.runs() == []


def test_an_exit_code_a_shell_cannot_carry_becomes_1(sqlite_project):
    sqlite_project.add_command("t_exit", "raise SystemExit(256)")
    result = sqlite_project.run_job("t_exit")
    assert result.returncode == 1
    assert [r[3:6] for r in sqlite_project.db.runs()] == [("failed", 1, "exit 256")]


def test_a_failed_run_keeps_its_error_line_in_the_history(sqlite_project):
    sqlite_project.add_command("t_fail", "raise CommandError('payment gateway: 503', returncode=3)")
    assert sqlite_project.run_job("t_fail").returncode == 3
    [(outcome, code, note)] = [r[3:6] for r in sqlite_project.db.runs()]
    assert (outcome, code, note) == ("failed", 3, "CommandError: payment gateway: 503")


def test_a_run_that_cannot_start_pings_the_check_declared_in_crontab_d(sqlite_project, ping_server):
    project = sqlite_project
    ping_to(project, ping_server)
    uuid = "0e8c9c4a-8c7b-4f57-9d2a-2f2b1f0a6a11"
    project.add_command("t_ok", "print('fine')")
    project.write_cron(
        "t.cron", f"{DAILY} --ping={uuid} t_ok\n@daily --no-ping --name=quiet t_ok\n"
    )
    _, url = _refusing()
    dead = url.replace("http://", "postgres://nobody:pw@").rstrip("/") + "/db"
    assert project.run_job("t_ok", env={"DATABASE_URL": dead}).returncode == 1
    assert project.run_job("--name=quiet", "t_ok", env={"DATABASE_URL": dead}).returncode == 1
    assert [req.path for req, _ in ping_server.log] == [f"/{uuid}/fail"]


def test_a_bad_line_in_crontab_d_stops_only_its_own_job(sqlite_project):
    project = sqlite_project
    project.add_command("t_ok", "print('fine')")
    project.write_cron("10-good.cron", f"{DAILY} t_ok\n")
    bad = project.write_cron("20-bad.cron", f"{DAILY} --timeout=soon --name=broken t_ok\n")
    good = project.run_job("t_ok")
    assert good.returncode == 0, good.stderr
    assert f"warning: {bad}:1: runner options" in good.stderr
    assert [(r[0], r[3]) for r in project.db.runs()] == [("t_ok", "succeeded")]
    broken = project.run_job("--name=broken", "t_ok")
    assert broken.returncode == 2
    assert f"{bad}:1" in broken.stderr
    assert len(project.db.runs()) == 1


def test_job_status_sees_that_a_killed_ad_hoc_run_is_dead(sqlite_project):
    project = sqlite_project
    project.add_command("t_sleep", SLEEPER)
    victim = project.popen("run_job", "t_sleep", env={"SLEEP": "60"})
    wait_for_line(victim, "working")
    running = json.loads(project.manage("job_status", "--json", "--job", "t_sleep").stdout)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    dead = json.loads(project.manage("job_status", "--json", "--job", "t_sleep").stdout)
    assert running["jobs"][0]["state"] == "running"
    assert dead["jobs"][0]["state"] == "failing"


def test_a_job_declared_again_on_a_broken_line_does_not_run_from_its_other_line(sqlite_project):
    project = sqlite_project
    project.add_command("t_ok", "print('fine')")
    project.write_cron("10-good.cron", f"{DAILY} t_ok\n")
    project.write_cron("20-bad.cron", "0 4 * * * --timeout=zz t_ok\n")
    result = project.run_job("t_ok")
    assert result.returncode == 2
    assert project.db.runs() == []


def test_a_job_that_catches_its_timeout_and_returns_is_still_recorded_timed_out(sqlite_project):
    """SIGTERM with a handler of the job's own (here: one that lets it finish): the job ends
    as it likes, and the run is what the runner made it: timed out."""
    sqlite_project.add_command(
        "t_swallow",
        """
        import signal
        def stop(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, stop)
        try:
            time.sleep(60)
        except BaseException:
            print("caught it", flush=True)
        """,
    )
    # 5 s: the SIGTERM must come after the job installed its handler, also on a loaded machine
    # (at 1 s the newest-pair stage once sent it before: the default disposition killed it).
    result = sqlite_project.run_job("--timeout=5s", "t_swallow")
    assert result.returncode == 124
    assert "caught it" in result.stdout
    assert [r[3:5] for r in sqlite_project.db.runs()] == [("timed_out", 124)]


def test_a_job_told_to_stop_that_finishes_its_work_and_exits_0_has_done_its_slot(
    sqlite_project,
):
    """SIGTERM to run_job is passed on to the job; one that handles it by finishing its work
    and exiting 0 has done the slot. Recorded terminated (143), the slot was run again by the
    next fire or a standby on another server: its work twice."""
    sqlite_project.add_command(
        "t_finish",
        """
        import signal
        told = []
        signal.signal(signal.SIGTERM, lambda *a: told.append(True))
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while not told and time.monotonic() < deadline:
            time.sleep(0.01)
        print("finished the work", flush=True)
        """,
    )
    sqlite_project.write_cron("t.cron", f"{DAILY} --no-ping t_finish\n")
    proc = sqlite_project.popen("run_job", "t_finish")
    wait_for_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "finished the work" in out
    assert "cronops: job t_finish: SIGTERM passed to the job, which then finished (exit 0)" in err
    assert [r[3:5] for r in sqlite_project.db.runs()] == [("succeeded", 0)]
    again = sqlite_project.run_job("t_finish")
    assert again.returncode == 0 and "already done" in again.stdout, again.stdout + again.stderr


@pytest.mark.parametrize(
    "alarm",
    [
        "old = signal.signal(signal.SIGALRM, lambda *a: None); signal.alarm(5); "
        "signal.alarm(0); signal.signal(signal.SIGALRM, old)",
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)",
    ],
    ids=["a per-call signal.alarm of its own", "SIGALRM ignored"],
)
def test_a_job_that_uses_sigalrm_itself_still_times_out(sqlite_project, alarm):
    """Libraries time single calls out with signal.alarm; the job's handler replaced the
    runner's, and --timeout silently never fired (recorded succeeded after 8 s of a 2 s limit)."""
    sqlite_project.add_command(
        "t_alarm", f"import signal\n{alarm}\ntime.sleep(20)\nprint('ran on')"
    )
    result = sqlite_project.run_job("--timeout=1s", "t_alarm")
    assert result.returncode == 124, result.stdout + result.stderr
    assert "ran on" not in result.stdout
    assert [r[3:5] for r in sqlite_project.db.runs()] == [("timed_out", 124)]


def test_sigterm_ends_a_wait_for_the_lock_at_once(sqlite_project):
    project = sqlite_project
    project.add_command("t_sleep", SLEEPER)
    (project.dir / "hang").touch()  # the holder holds the lock until stopped (60 s at most)
    holder = project.popen("run_job", "t_sleep")
    waiter = None
    try:
        wait_for_line(holder, "working")
        waiter = project.popen("run_job", "--wait=60s", "t_sleep")
        # Not before it waits: a SIGTERM during Django's start-up ends it the same way.
        lock = project.lock_dir / "t_sleep.lock"
        wait_until(lambda: waits_for_lock(waiter, lock), "the waiter to wait for the lock")
        started = time.monotonic()
        waiter.send_signal(signal.SIGTERM)
        assert waiter.wait(30) == -signal.SIGTERM
        assert time.monotonic() - started < 10  # at once: before, it waited for the lock
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(15) == 143
    finally:
        stop(holder, *([waiter] if waiter else []))


def test_a_command_whose_module_cannot_import_is_recorded_failed(sqlite_project):
    project = sqlite_project
    project.add_command("t_broken", "print('never')")
    path = project.dir / "commands/management/commands/t_broken.py"
    path.write_text("import no_such_package_here\n" + path.read_text())
    project.write_cron("t.cron", f"{DAILY} t_broken\n")
    result = project.run_job("t_broken")
    assert result.returncode == 1
    assert "ModuleNotFoundError" in result.stderr
    assert [r[3:5] for r in project.db.runs()] == [("failed", 1)]
    assert project.db.query("SELECT state FROM ops_slotclaim") == [("failed",)]
