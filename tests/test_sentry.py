"""Sentry Crons check-ins (issue 30): real run_job processes against a recording Sentry ingest
endpoint on 127.0.0.1 (tests/sentryserver.py), which reads every envelope with Sentry's own SDK
and holds every check-in to Relay's and Sentry's rules."""

import datetime as dt
import signal
import socket
import time
import uuid

import pytest

from .conftest import DAILY, DAILY_DATE, PING_KEY, wait_for_line, wait_until
from .sentryserver import SentryRecorder

SLEEPY = """
time.sleep(float(os.environ.get("SLEEP", "0.2")))
print("done", flush=True)
"""


@pytest.fixture
def sentry(httpserver):
    recorder = SentryRecorder(httpserver)
    yield recorder
    recorder.release.set()


def sentry_to(project, recorder, **extra):
    project.write_env(SENTRY_DSN=recorder.dsn, **extra)


def a_run(recorder, count: int = 2) -> list[dict]:
    assert recorder.problems == [], recorder.problems
    assert len(recorder.check_ins) == count, recorder.statuses()
    return recorder.check_ins


def test_a_run_that_succeeds_is_in_progress_then_ok_with_its_duration_and_monitor_config(
    sqlite_project, sentry
):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command("t_job", SLEEPY)
    project.write_cron("t.cron", f"{DAILY} --timeout=10m t_job\n")
    result = project.run_job("t_job")
    assert result.returncode == 0, result.stderr
    started, ended = a_run(sentry)
    assert (started["status"], ended["status"]) == ("in_progress", "ok")
    assert started["check_in_id"] == ended["check_in_id"]
    [(rid,)] = project.db.query("SELECT rid FROM ops_jobrun")
    assert uuid.UUID(rid).hex == started["check_in_id"]  # the history's rid, the pings' too
    assert "duration" not in started and 0.2 <= ended["duration"] < 60
    assert started["monitor_slug"] == ended["monitor_slug"] == "t_job"
    assert "environment" not in started  # Sentry's default: production
    # The monitor as sync_healthchecks would make its check: the schedule, TIME_ZONE, the grace
    # (10 minutes: the timeout) as the margin, the timeout as the maximum runtime.
    assert (
        ended["monitor_config"]
        == started["monitor_config"]
        == {
            "schedule": {"type": "crontab", "value": DAILY},
            "timezone": "UTC",
            "checkin_margin": 10,
            "max_runtime": 10,
        }
    )
    assert sentry.key not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("line", "env", "code"),
    [
        ("t_job", {"FAIL": "3"}, 3),
        ("--timeout=1s t_job", {"SLEEP": "30"}, 124),
    ],
    ids=["exit 3", "a timeout"],
)
def test_a_failure_or_a_timeout_closes_the_run_with_error(sqlite_project, sentry, line, env, code):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command(
        "t_job", "if os.environ.get('FAIL'): raise CommandError('kaput', returncode=3)\n" + SLEEPY
    )
    project.write_cron("t.cron", f"{DAILY} {line}\n")
    result = project.run_job("t_job", env=env)
    assert result.returncode == code, result.stderr
    started, ended = a_run(sentry)
    assert (started["status"], ended["status"]) == ("in_progress", "error")
    assert started["check_in_id"] == ended["check_in_id"]
    if code == 124:
        assert 1 <= ended["duration"] < 30


def test_sigterm_closes_the_run_with_error(sqlite_project, sentry):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command("t_job", 'print("working", flush=True)\ntime.sleep(60)')
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    proc = project.popen("run_job", "t_job")
    wait_for_line(proc, "working")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert [s for _, s in sentry.statuses()] == ["in_progress", "error"]
    assert sentry.problems == []


def test_a_retry_that_succeeds_is_one_run_closed_ok(sqlite_project, sentry, tmp_path):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command(
        "t_job",
        """
        marker = os.path.join(os.environ["MARKS"], "failed-once")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise CommandError("first attempt fails", returncode=75)
        print("second attempt", flush=True)
        """,
    )
    project.write_cron("t.cron", f"{DAILY} --retries=2 --retry-delay=1s t_job\n")
    result = project.run_job("t_job", env={"MARKS": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    started, ended = a_run(sentry)
    assert (started["status"], ended["status"]) == ("in_progress", "ok")
    assert started["check_in_id"] == ended["check_in_id"]
    assert ended["duration"] >= 1  # the retry's wait is the run's


def test_catch_up_is_one_run_and_skips_and_pauses_send_nothing(sqlite_project, sentry):
    project = sqlite_project
    sentry_to(project, sentry)
    project.add_command("t_job", "print('ran')")
    project.write_cron("t.cron", f"{DAILY} --catch-up=3 t_job\n")
    first = project.run_job(f"--logical-date={DAILY_DATE - dt.timedelta(days=3)}", "t_job")
    assert first.returncode == 0, first.stderr
    assert len(a_run(sentry)) == 2
    caught_up = project.run_job("t_job")  # two missed days, then the current slot
    assert caught_up.returncode == 0, caught_up.stderr
    assert [r[3] for r in project.db.runs()] == ["succeeded"] * 4
    statuses = sentry.statuses()[2:]
    assert [s for _, s in statuses] == ["in_progress", "ok"]  # one run: the current slot's
    assert statuses[0][0] == statuses[1][0]
    # the slot already done, a run by hand of a paused job, a run without monitors: nothing
    assert "already done" in project.run_job("t_job").stdout
    paused = project.manage("job_pause", "t_job", "--reason=maintenance")
    assert paused.returncode == 0, paused.stderr
    assert "Sentry: the monitor 't_job' is not paused (a DSN cannot pause it)" in paused.stdout
    nine_days_ago = f"--logical-date={DAILY_DATE - dt.timedelta(days=9)}"
    assert "paused" in project.run_job(nine_days_ago, "t_job").stdout
    assert project.manage("job_resume", "t_job").returncode == 0
    assert project.run_job("--no-ping", "--force", "t_job").returncode == 0
    assert len(sentry.check_ins) == 4 and sentry.problems == []


def test_a_command_without_a_schedule_sends_no_monitor_config_and_the_environment_is_sent(
    sqlite_project, sentry
):
    project = sqlite_project
    sentry_to(project, sentry, SENTRY_ENVIRONMENT="staging")
    result = project.run_job("sleep_demo", "--seconds=0")  # not declared in crontab.d
    assert result.returncode == 0, result.stderr
    started, ended = a_run(sentry)
    assert "monitor_config" not in started and "monitor_config" not in ended
    assert started["environment"] == ended["environment"] == "staging"


def test_ops_sentry_dsn_set_empty_keeps_the_projects_sentry_dsn_from_the_monitors(
    sqlite_project, sentry
):
    project = sqlite_project
    sentry_to(project, sentry, OPS_SENTRY_DSN="")
    project.write_cron("t.cron", f"{DAILY} sleep_demo --seconds=0\n")
    assert project.run_job("sleep_demo").returncode == 0
    assert sentry.requests == []


def test_a_bad_dsn_of_cronops_own_is_one_line_exit_2_and_never_shows_its_key(sqlite_project):
    project = sqlite_project
    project.write_env(OPS_SENTRY_DSN="https://s3cretpublickey@sentry.example.com/not-a-project")
    result = project.run_job("sleep_demo", "--seconds=0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "cronops: error: OPS_SENTRY_DSN: the value does not end with a project id "
        "(https://<key>@<host>/<project id>)"
    ]
    assert project.db.runs() == []
    check = project.manage("check")
    assert "ops.E006" in check.stderr and "s3cretpublickey" not in check.stderr


def test_sentry_settings_of_the_projects_own_never_stop_a_job(sqlite_project, sentry):
    """SENTRY_DSN and SENTRY_ENVIRONMENT are the project's (sentry-sdk reads them): one that
    cronops cannot use turns its check-ins off, or sends them without the environment, with a
    warning from `manage.py check` (ops.W012); the job runs."""
    project = sqlite_project
    project.write_env(SENTRY_DSN="https://s3cretpublickey@sentry.example.com/not-a-project")
    result = project.run_job("sleep_demo", "--seconds=0")
    assert result.returncode == 0, result.stderr
    check = project.manage("check")
    assert "ops.W012" in check.stderr and "ops.E006" not in check.stderr
    assert "SENTRY_DSN does not end with a project id" in check.stderr
    assert "s3cretpublickey" not in check.stderr + result.stderr
    # a DSN with a query sentry-sdk ignores works; an environment Sentry refuses is left out
    sentry_to(project, sentry, SENTRY_ENVIRONMENT="eu/prod")
    project.write_env(SENTRY_DSN=sentry.dsn + "?timeout=5")
    assert project.run_job("sleep_demo", "--seconds=0").returncode == 0
    started, ended = a_run(sentry)
    assert "environment" not in started and "environment" not in ended
    assert "SENTRY_ENVIRONMENT is not a name Sentry takes" in project.manage("check").stderr


def test_the_duration_is_the_runs_not_the_wait_for_a_late_in_progress(sqlite_project, sentry):
    project = sqlite_project
    sentry_to(project, sentry)
    sentry.mode, sentry.delay = "slow start", 3.0
    result = project.run_job("sleep_demo", "--seconds=0")
    assert result.returncode == 0, result.stderr
    ended = next(c for c in a_run(sentry) if c["status"] == "ok")
    assert ended["duration"] < 2.5  # the job took no time; the in_progress took 3 s to answer


def test_a_name_longer_than_a_monitor_slug_sends_nothing_and_says_so(sqlite_project, sentry):
    project = sqlite_project
    sentry_to(project, sentry)
    name = "a-very-long-ad-hoc-name-for-a-job-that-sentry-would-cut"  # 55 characters
    result = project.run_job(f"--name={name}", "sleep_demo", "--seconds=0")
    assert result.returncode == 0, result.stderr
    assert sentry.requests == []
    assert "no Sentry check-ins: the name is longer than the 50 characters" in result.stderr


def test_no_secret_reaches_sentry(sqlite_project, sentry):
    project = sqlite_project
    sentry_to(project, sentry, HEALTHCHECKS_PING_KEY=PING_KEY)
    project.add_command(
        "t_job", "print(os.environ['SECRET_KEY'], os.environ['SENTRY_DSN'])\nraise SystemExit(1)"
    )
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    result = project.run_job("t_job")
    assert result.returncode == 1
    sent = b"".join(body for _, body in sentry.requests)
    for secret in (project.settings["SECRET_KEY"], PING_KEY):
        assert secret.encode() not in sent
    assert sentry.key in result.stdout  # the job's own output to cron's log stays the job's
    [(tail,)] = project.db.query("SELECT output_tail FROM ops_jobrun")
    assert sentry.key not in tail and "<redacted the Sentry DSN>" in tail


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("failure", ["hold", "429", "500", "refused"])
def test_a_broken_sentry_endpoint_never_changes_the_exit_code_and_costs_at_most_the_budget(
    sqlite_project, sentry, tmp_path, failure
):
    project = sqlite_project
    budget = 3
    dsn = sentry.dsn
    if failure == "refused":
        dsn = dsn.replace(f":{sentry.server.port}/", f":{_closed_port()}/")
    else:
        sentry.mode = failure
    project.write_env(SENTRY_DSN=dsn, OPS_PING_BUDGET_SECONDS=budget)
    stamp = tmp_path / "started"
    project.add_command(
        "t_job", "open(os.environ['STAMP'], 'w').close()\nraise CommandError('no', returncode=3)"
    )
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    proc = project.popen("run_job", "t_job", env={"STAMP": str(stamp)})
    out, err = proc.communicate(timeout=120)
    ended = time.time()
    assert proc.returncode == 3, err
    # "hold" never answers its in_progress: the job ran while it was still unanswered.
    assert stamp.exists(), "the job never started"
    [(finished,)] = project.db.query("SELECT finished_at FROM ops_jobrun")
    finished = dt.datetime.fromisoformat(str(finished)).replace(tzinfo=dt.UTC).timestamp()
    # From the record to run_job's end: the final check-in's budget (with room for a loaded
    # machine's process exit). Unbounded, a black hole costs 5 s an attempt, three attempts.
    assert ended - finished < budget + 4, f"{ended - finished:.1f} s after the record"
    said = "rate-limited by Sentry (HTTP 429, retry after 60 s)" if failure == "429" else "failed ("
    assert "job t_job: Sentry " in err and said in err, err
    assert sentry.key not in out + err
    assert [r[3:5] for r in project.db.runs()] == [("failed", 3)]


def test_a_monitor_config_never_has_a_margin_or_runtime_sentry_refuses(settings):
    """Sentry's validator caps both at 40320 minutes, and a config it refuses drops every
    check-in of a new monitor after Relay's 200."""
    from ops.monitors.sentry import monitor_config
    from ops.schedule.crontabd import parse_text

    from .sentryserver import invalid_config

    text = "0 3 1 * * --timeout=30d --name=monthly sleep_demo\n@yearly --timeout=365d sleep_demo\n"
    for job in parse_text(text, "t.cron").jobs:
        config = monitor_config(job, "UTC")
        assert config["checkin_margin"] == config["max_runtime"] == 40320
        assert invalid_config(config) == ""


def test_an_ipv6_dsn_reaches_its_server(settings):
    """The endpoint is built with the host in brackets (http://[::1]:port/): without them the
    check-ins went nowhere, with a traceback per run."""
    import http.server
    import threading

    from ops.monitors.sentry import CheckIns, SentryConfig, parse_dsn

    got = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(self.path)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    try:
        server = Server(("::1", 0), Handler)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dsn = parse_dsn(f"http://{'k' * 32}@[::1]:{server.server_address[1]}/42")
        assert dsn.endpoint == f"http://[::1]:{server.server_address[1]}/api/42/envelope/"
        check_ins = CheckIns(SentryConfig(dsn=dsn, budget=5.0), "t_job", str(uuid.uuid4()))
        assert check_ins.finish(0) is True
        assert got == ["/api/42/envelope/"]
    finally:
        server.shutdown()


def test_a_projects_own_sentry_still_gets_the_jobs_exception_and_logged_errors(
    sqlite_project, sentry
):
    """A project whose settings call sentry_sdk.init: an exception its command lets out reached
    Sentry through the interpreter's excepthook when the command ran alone. In run_job's child
    it is caught, and os._exit skipped the SDK's queue: both are handled there now."""
    project = sqlite_project
    sentry_to(project, sentry, OPS_SENTRY_DSN="")  # the project's errors only, no check-ins
    settings = project.dir / "config" / "settings.py"
    settings.write_text(
        settings.read_text()
        + "\nimport sentry_sdk\nsentry_sdk.init(dsn=os.environ['SENTRY_DSN'])\n"
    )
    project.add_command(
        "t_job",
        "import logging\nlogging.getLogger('shop').error('a logged error')\n"
        "raise RuntimeError('the job broke')",
    )
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    result = project.run_job("t_job")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "RuntimeError: the job broke" in result.stderr

    def reported():
        texts = [str(e) for e in sentry.events]
        return any("the job broke" in t for t in texts) and any(
            "a logged error" in t for t in texts
        )

    wait_until(reported, "the project's two events at its Sentry", timeout=10)
    assert sentry.check_ins == []


def test_a_job_name_longer_than_a_sentry_slug_is_a_warning_with_sentry_on(
    settings, tmp_path, monkeypatch
):
    from ops.checks import check_crontabd

    monkeypatch.setattr("sys.argv", ["manage.py", "check"])  # the command that reads crontab.d
    settings.OPS_CRONTAB_DIR = tmp_path
    name = "nightly-export-of-every-invoice-to-the-accounting-system"  # 55 characters
    (tmp_path / "t.cron").write_text(f"0 3 * * * --name={name} sleep_demo --seconds=0\n")
    settings.SENTRY_DSN = ""
    assert [m.id for m in check_crontabd() if m.id == "ops.W011"] == []
    settings.SENTRY_DSN = f"https://{'k' * 32}@o1.ingest.sentry.io/7"
    [warning] = [m for m in check_crontabd() if m.id == "ops.W011"]
    assert "longer than 50 characters (nightly-export-of-ev…)" in warning.msg
    assert "k" * 32 not in warning.msg + warning.hint


class DripServer:
    """Answers every request with a status line, then one header line every half second and
    never an end: each read is prompt, their sum is not."""

    def __init__(self):
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.done = threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        import threading

        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.drip, args=(conn,), daemon=True).start()

    def drip(self, conn):
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not self.done.wait(0.5):
                    conn.sendall(b"X-Drip: 1\r\n")
            except OSError:
                return

    def close(self):
        self.done.set()
        self.sock.close()


def test_a_server_that_answers_a_byte_at_a_time_costs_both_monitors_one_budget(sqlite_project):
    """A socket timeout bounds each read, not their sum: a slow drip held a run's end for
    30 s and more, the job's lock with it. Both monitors at such a server: one budget."""
    project = sqlite_project
    drip = DripServer()
    budget = 3
    try:
        project.write_env(
            HEALTHCHECKS_PING_URL=f"http://127.0.0.1:{drip.port}/",
            HEALTHCHECKS_PING_KEY=PING_KEY,
            SENTRY_DSN=f"http://{'k' * 32}@127.0.0.1:{drip.port}/42",
            OPS_PING_BUDGET_SECONDS=budget,
        )
        project.write_cron("t.cron", f"{DAILY} sleep_demo --seconds=0\n")
        proc = project.popen("run_job", "sleep_demo")
        _, err = proc.communicate(timeout=120)
        ended = time.time()
    finally:
        drip.close()
    assert proc.returncode == 0, err
    [(finished,)] = project.db.query("SELECT finished_at FROM ops_jobrun")
    finished = dt.datetime.fromisoformat(str(finished)).replace(tzinfo=dt.UTC).timestamp()
    # The start ping is never given up while the job runs; the final requests are, by the
    # deadline (room for a loaded machine's process exit).
    assert ended - finished < budget + 4, f"{ended - finished:.1f} s after the record"
    assert "ok check-in to" in err and "success ping failed (TimeoutError)" in err, err


def test_the_job_sends_only_what_it_reports_not_what_run_job_had_queued(sqlite_project, sentry):
    """The job's process is a fork of run_job's: the project's sentry_sdk queue came with it.
    The job gets a transport of its own: what the settings logged in run_job's process is sent
    once (by run_job's), what the job reports once (by the job's)."""
    project = sqlite_project
    sentry_to(project, sentry, OPS_SENTRY_DSN="")
    sentry.mode, sentry.delay = "slow start", 0.0
    settings = project.dir / "config" / "settings.py"
    settings.write_text(
        settings.read_text()
        + "\nimport logging, sentry_sdk\nsentry_sdk.init(dsn=os.environ['SENTRY_DSN'])\n"
        + "for i in range(3):\n    logging.getLogger('shop').error('at start-up %s', i)\n"
    )
    project.add_command("t_job", "raise RuntimeError('the job broke')")
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    assert project.run_job("t_job").returncode == 1

    def ids():
        return [e.get("event_id") for e in sentry.events if e.get("type") == "event"]

    # run_job's process sends its three, the job's its three (settings ran once, before the
    # fork) and its exception; the queue the fork copied is never sent again.
    wait_until(lambda: len(ids()) >= 4, "the events at the project's Sentry", timeout=10)
    assert len(ids()) == len(set(ids())), ids()
