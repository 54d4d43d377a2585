"""Shared fixtures: a deployed copy of the project run as real processes, on SQLite and PostgreSQL.

`project` copies manage.py and the apps into a temporary directory with its own `.env`,
database, lock and log directories, so each test runs `manage.py run_job` exactly as cron
would, against a database migrated once per run (shared by the xdist workers).

Markers (README, "Working on cronops"): a test that starts a process or a service of its own
(a deployed copy, Debian's crontab or cron, PostgreSQL, a browser, ansible) is `process`,
given here from the fixtures it uses or by its module; `make check` runs the others, which
may start no subprocess at all (a guard below fails one that does). `newest` marks the
process tests that also run on the newest Python and Django (`make test-newest`).
"""

import datetime as dt
import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from cronsim import CronSim

REPO = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("CRONOPS_TEST_PG_URL", "")
REQUIRE_ALL = bool(os.environ.get("CRONOPS_REQUIRE_ALL"))
PING_KEY = "pk-" + "s3cr3t" * 4  # looks like a real key; tests assert it never leaks

T = TypeVar("T")


def _sleep_by_select(seconds: float) -> None:
    import select

    if seconds < 0:
        raise ValueError("sleep length must be non-negative")  # as time.sleep says it
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


if os.environ.get("FAKETIME"):
    # Under libfaketime 0.9.10 (Debian 12/13) with DONT_FAKE_MONOTONIC=1, the way make
    # check-clocks runs the suite (the wall clock faked, the monotonic one left alone: timed
    # waits hang when both are faked), time.sleep fails with EINVAL: its absolute
    # CLOCK_MONOTONIC clock_nanosleep is mistranslated. select() waits the same time.
    try:
        time.sleep(0.001)
    except OSError:
        time.sleep = _sleep_by_select


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """Poll `predicate` until it returns something true, and return that; after `timeout`
    seconds fail saying what was awaited. The one way a test waits for another process."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def wait_for_line(
    proc: subprocess.Popen, text: str, timeout: float = 30.0, stream: str = "stdout"
) -> str:
    """Read `proc`'s stdout (or stderr; text mode) until a line holding `text`; return all it
    read. After `timeout` seconds the process is killed (its output ends) and the test fails,
    naming what it waited for and what the process printed."""
    import threading

    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    seen = ""
    try:
        for line in iter(getattr(proc, stream).readline, ""):
            seen += line
            if text in line:
                return seen
    finally:
        timer.cancel()
    raise AssertionError(
        f"pid {proc.pid} never printed {text!r} (it ended, or {timeout:g} s passed); "
        f"it printed {seen!r}"
    )


def ping_to(project, server, **extra) -> None:
    """Point a deployed copy's pings at `server` (pytest-httpserver) with the test ping key."""
    project.write_env(
        HEALTHCHECKS_PING_URL=server.url_for("/"), HEALTHCHECKS_PING_KEY=PING_KEY, **extra
    )


def daily_far_from_now(now: dt.datetime | None = None) -> tuple[str, dt.date]:
    """A once-a-day schedule (UTC) whose fire time is twelve hours away from `now`, and the
    logical date of its current slot: a test that runs such a job twice, or compares its slot
    with its own idea of the date, cannot straddle a fire time (CI runs at any hour)."""
    now = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    hour = (now.hour + 12) % 24
    expr = f"{now.minute} {hour} * * *"
    fire = next(CronSim(expr, now + dt.timedelta(minutes=1), reverse=True))
    return expr, fire.date()


# Once per run: every daily job of the process tests that needs "today" uses these.
DAILY, DAILY_DATE = daily_far_from_now()

# A job for the runner's tests: notes its pid in ran.txt, says "working", hangs while the file
# `hang` is in its project directory, then sleeps $SLEEP seconds.
SLEEPER = """
from django.conf import settings
with open(settings.BASE_DIR / "ran.txt", "a") as f:
    f.write(f"{os.getpid()}\\n")
print("working", flush=True)
if (settings.BASE_DIR / "hang").exists():
    time.sleep(60)
time.sleep(float(os.environ.get("SLEEP", "0")))
print("done", flush=True)
"""


def kill_a_scheduled_run_mid_command(project) -> subprocess.Popen:
    """A daily job (DAILY) killed with SIGKILL while its command runs; returns the dead run."""
    import signal

    project.add_command("t_sleep", SLEEPER)
    project.write_cron("t.cron", f"{DAILY} t_sleep\n")
    (project.dir / "hang").touch()
    victim = project.popen("run_job", "t_sleep")
    wait_for_line(victim, "working")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    (project.dir / "hang").unlink()
    return victim


TEST_COMMAND = """\
import os, sys, time
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    def add_arguments(self, parser):
{arguments}

    def handle(self, *args, **options):
{body}
"""


IN_PROCESS_DB = {"db", "transactional_db", "live_server", "django_db_setup", "admin_client"}
# Fixtures that start processes or services: a test using one is a `process` test.
PROCESS_FIXTURES = {
    "project", "sqlite_project", "pg_project", "migrated_templates", "cron_user",
    "live_server", "debian_crontab", "node_exporter", "dist", "fresh_venv",
}  # fmt: skip
# Tests in files this suite's maintainers do not own that start a process without such a
# fixture (until those files mark them themselves).
PROCESS_TESTS = {
    "test_a_socket_opened_just_after_the_job_closed_fd_1_is_moved_above_the_standard_fds",
}
# The process tests that also run on the newest Python and Django (besides every in-process
# test, which all do): those whose subject is what a new Python or Django changes. The runner's
# processes, signals and output (on SQLite: the database is not their subject); claims racing
# through Django's two database backends, and migrations (on both); and the tests of
# tests/test_run_job_arguments.py marked `newest` (Django's command line, argparse's
# messages). Deploys, crontab installs, pings, standby and the rest exercise code the
# in-process tests already run on the newest pair; they run on the default pair only.
NEWEST_PROCESS_FILES = {
    "test_runner.py", "test_runner_output.py", "test_signals.py", "test_children.py",
    "test_claims.py", "test_migrations.py",
}  # fmt: skip
NEWEST_BOTH_DATABASES = {"test_claims.py", "test_migrations.py"}


def pytest_configure(config):
    # One name per run, shared by the xdist workers (they inherit the environment): the
    # PostgreSQL template and the migrated SQLite file are made once for all of them.
    os.environ.setdefault("CRONOPS_TEST_RUN", uuid.uuid4().hex[:12])


# The files whose tests share one expensive module-scoped set-up (a deployed copy, a fresh
# virtualenv with the built wheel): with xdist, each runs whole on one worker, so the set-up is
# made once. Every other test is handed out on its own.
SHARED_SET_UP_FILES = {"test_deploy.py", "test_deploy_startproject.py", "test_adopt.py"}
# Tests that leave processes carrying OPS_RUN_ID=<id> behind (a job's children outliving a
# killed runner), and tests that take over the claim of a dead runner on this machine, which
# run_job refuses while any process carries that run's id (ops/run/descendants.survivor). Every
# test database numbers its runs from 1, and survivor() matches the id alone, so one test's
# leftover `sh` made another's takeover exit 75 when they ran at the same time: they run one
# after another, on one worker; and they hold a lock of this machine (RUN_ID_LOCK), since
# `make test` runs the newest-pair stage beside the main one, with the same tests. (Two
# projects on one machine share that blind spot.)
RUN_ID_LOCK = Path("/tmp/cronops-tests-run-ids.lock")
RUN_ID_UNIT = (
    "tests/test_children.py::",
    "tests/test_claims.py::test_a_claim_whose_pid_now_belongs_to_another_process_is_taken_over",
    "tests/test_runner.py::test_a_run_killed_with_sigkill_is_recorded_abandoned_and_the_next",
    "tests/test_runner.py::test_a_claim_left_by_a_killed_run_on_another_host_is_taken_over",
    "tests/test_runner.py::test_job_status_sees_that_a_killed_ad_hoc_run_is_dead",
    "tests/test_status.py::test_a_run_whose_holder_process_is_gone_on_this_machine_is_failing",
)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`, by file: a file of SHARED_SET_UP_FILES is one unit of work, so are
    the RUN_ID_UNIT tests, any other test a unit of its own; the units with the most tests (the
    deploys) go out first.
    (xdist's own loadgroup reads `xdist_group` marks from node ids it rewrites, which pytest
    9.2 no longer lets it do: pytest-dev/pytest-xdist#1386, the groups silently split.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetUpScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if Path(path).name in SHARED_SET_UP_FILES:
                return path
            return "run ids" if nodeid.startswith(RUN_ID_UNIT) else nodeid

    return SharedSetUpScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Mark the tests that use Django's own test database, so `make test` can run them again
    with DATABASE_URL pointing at PostgreSQL (the `project` fixture covers both by itself);
    mark `process` and `newest` (above); and put the tests that mostly wait (`first`: the
    cron daemon's minute) first, so their waits overlap the rest of the run."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if IN_PROCESS_DB & names or item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.inprocess_db)
        if (
            PROCESS_FIXTURES & names
            or item.get_closest_marker("slow")
            or item.originalname in PROCESS_TESTS
        ):
            item.add_marker(pytest.mark.process)
        if item.get_closest_marker("process") and item.path.name in NEWEST_PROCESS_FILES:
            params = getattr(item, "callspec", None)
            backend = params.params.get("project") if params else None
            if backend != "pg" or item.path.name in NEWEST_BOTH_DATABASES:
                item.add_marker(pytest.mark.newest)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: 0 if item.get_closest_marker("first") else 1)
        return

    # Under xdist every other test is a unit of work of its own, handed out in this order:
    # mixed by a hash of its id, so that the tests that mostly wait (standby, takeover,
    # writers: alphabetically last) do not all come at the end, when the side stages are done
    # and half the CPU idled (the last 80 s of a `make test`). A shared set-up keeps its file's
    # order (the sort is stable).
    def order(item):
        group = (
            item.nodeid.split("::", 1)[0] if item.path.name in SHARED_SET_UP_FILES else item.nodeid
        )
        return (0 if item.get_closest_marker("first") else 1, zlib.crc32(group.encode()))

    items.sort(key=order)


@pytest.fixture(autouse=True)
def _one_run_id_test_at_a_time(request):
    """RUN_ID_UNIT's tests, one at a time on this machine, whichever pytest session runs them."""
    if not request.node.nodeid.startswith(RUN_ID_UNIT):
        yield
        return
    with open(RUN_ID_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(autouse=True)
def _in_process_tests_start_no_subprocess(request, monkeypatch):
    """`make check` runs the tests not marked `process`: keep them free of processes."""
    if request.node.get_closest_marker("process"):
        return
    nodeid = request.node.nodeid

    def refuse(self, args, *rest, **kwargs):
        raise AssertionError(
            f"{nodeid} starts a subprocess ({str(args)[:80]}): mark it "
            "`pytest.mark.process` (make check runs only the tests that start none)"
        )

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    """Django's SQLite test database in a file, not in memory: run_job forks its job, and a
    child process sees a file (what its parent committed), never a copy of an in-memory one."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.sqlite3":
        path = tmp_path_factory.mktemp("django-db") / "test.sqlite3"
        database.setdefault("TEST", {})["NAME"] = str(path)


def untracked_ignore():
    """A copytree `ignore=` for what a git checkout of REPO would not have: .git and what
    .gitignore lists (the suite writes caches into REPO; a copy must not carry them)."""
    patterns = [line.rstrip("/") for line in (REPO / ".gitignore").read_text().split()]
    return shutil.ignore_patterns(".git", ".venv-*", *(p for p in patterns if p[0] != "#"))


def require(condition: bool, reason: str) -> None:
    """Skip when a real service is missing on a developer machine; fail in CI."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


TREE = ("config", "ops", "commands")
# The tree the copies are made of: set once per run (migrated_templates) to a snapshot of
# REPO compiled to bytecode, so that no `manage.py` of a copy compiles the app again
# (base_env sets PYTHONDONTWRITEBYTECODE: a copy never writes bytecode of its own).
_source: Path = REPO


def copy_tree(dest: Path) -> Path:
    """A deployed copy of the project: manage.py, config/, ops/, commands/, an empty
    crontab.d/. Modification times are kept: the snapshot's bytecode stays valid."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = None if _source != REPO else shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in TREE:
        shutil.copytree(_source / name, dest / name, ignore=ignore)
    shutil.copy2(_source / "manage.py", dest / "manage.py")
    (dest / "crontab.d").mkdir()
    return dest


def _manage(directory: Path, env: dict, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def base_env(**extra) -> dict:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Database:
    """One test's database: a fresh copy of a migrated template."""

    def __init__(self, backend: str, url: str):
        self.backend, self.url = backend, url

    def query(self, sql: str, params=()):
        if self.backend == "sqlite":
            con = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30)
            try:
                return con.execute(sql, params).fetchall()
            finally:
                con.close()
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as con:
            return con.execute(sql.replace("?", "%s"), params).fetchall()

    def execute(self, sql: str, params=()):
        if self.backend == "sqlite":
            con = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30)
            try:
                con.execute(sql, params)
                con.commit()
            finally:
                con.close()
            return
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as con:
            con.execute(sql.replace("?", "%s"), params)

    def runs(self, job: str | None = None):
        """[(job, slot, logical_date, outcome, exit_code, note)] oldest first."""
        sql = (
            "SELECT job, slot, logical_date, outcome, exit_code, note FROM ops_jobrun"
            + (" WHERE job = ?" if job else "")
            + " ORDER BY id"
        )
        return [
            tuple(str(v) if v is not None and i == 2 else v for i, v in enumerate(row))
            for row in self.query(sql, (job,) if job else ())
        ]


def shared_dir(tmp_path_factory) -> Path:
    """A directory all the xdist workers of this run share (the run's base temp dir)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name: str, make: Callable[[Path], dict]) -> dict:
    """`make(directory)` once per run whatever the number of xdist workers: the first worker
    to get here makes it under a lock, the others read what it returned (JSON)."""
    root = shared_dir(tmp_path_factory) / name
    root.mkdir(exist_ok=True)
    ready = root / "ready.json"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            ready.write_text(json.dumps(make(root)))
    return json.loads(ready.read_text())


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory):
    """Migrated once per run, for every worker: the snapshot of the tree (compiled), a
    migrated SQLite file and (when available) a PostgreSQL template database."""
    global _source
    templates = made_once(tmp_path_factory, "template", _make_templates)
    templates["sqlite"] = Path(templates["sqlite"])
    _source = Path(templates["tree"])
    return templates


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel, `python -m build` of a clean copy of the repository, built
    once per run (the adoption tests and the deploy of a startproject project share them)."""
    from .adopt import build_dist

    return Path(made_once(tmp_path_factory, "dist", lambda d: {"dist": str(build_dist(d))})["dist"])


def _make_templates(root: Path) -> dict:
    import compileall

    tree = copy_tree(root / "project")
    assert compileall.compile_dir(tree, quiet=2, workers=1), "the tree does not compile"
    sqlite_file = root / "template.sqlite3"
    result = _manage(tree, base_env(DATABASE_URL=f"sqlite:///{sqlite_file}"), "migrate", "-v0")
    assert result.returncode == 0, result.stderr
    templates = {"tree": str(tree), "sqlite": str(sqlite_file)}
    if PG_URL:
        import psycopg

        name = pg_template_name()
        with psycopg.connect(PG_URL, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}"')
            con.execute(f'CREATE DATABASE "{name}"')
        url = PG_URL.rsplit("/", 1)[0] + "/" + name
        result = _manage(tree, base_env(DATABASE_URL=url), "migrate", "-v0")
        assert result.returncode == 0, result.stderr
        templates["pg"] = name
    return templates


def pg_template_name() -> str:
    return f"cronops_tmpl_{os.environ['CRONOPS_TEST_RUN']}"


def pytest_sessionfinish(session):
    """The PostgreSQL template goes with the run: dropped once every worker is done (by the
    controller, or by the only process without xdist)."""
    if not PG_URL or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import psycopg

    try:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{pg_template_name()}" WITH (FORCE)')
    except psycopg.Error as error:
        print(f"could not drop {pg_template_name()}: {error}", file=sys.stderr)


def make_database(backend: str, templates: dict, directory: Path):
    if backend == "sqlite":
        target = directory / "db.sqlite3"
        shutil.copy2(templates["sqlite"], target)
        return Database("sqlite", f"sqlite:///{target}"), None
    require(bool(PG_URL), "PostgreSQL not available (set CRONOPS_TEST_PG_URL, see .ci/services.sh)")
    import psycopg

    name = f"cronops_t_{uuid.uuid4().hex[:12]}"

    def created():
        # Two workers copying the template at once: PostgreSQL refuses the second while the
        # first copies ("source database ... is being accessed by other users"); try again.
        try:
            with psycopg.connect(PG_URL, autocommit=True) as con:
                con.execute(f'CREATE DATABASE "{name}" TEMPLATE "{templates["pg"]}"')
            return True
        except psycopg.errors.ObjectInUse:
            return False

    wait_until(created, f"a copy of the PostgreSQL template {templates['pg']}", timeout=60)

    def drop():
        with psycopg.connect(PG_URL, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return Database("pg", PG_URL.rsplit("/", 1)[0] + "/" + name), drop


class Project:
    def __init__(self, directory: Path, db: Database, env_file: dict):
        self.dir = directory
        self.db = db
        self.settings = dict(env_file)
        self.write_env()

    @property
    def lock_dir(self) -> Path:
        return Path(self.settings.get("OPS_LOCK_DIR", self.dir / "var" / "lock"))

    def write_env(self, **changes):
        """(Re)write `.env` (mode 0600) from self.settings plus `changes`."""
        self.settings.update({k: str(v) for k, v in changes.items() if v is not None})
        for k in [k for k, v in changes.items() if v is None]:
            self.settings.pop(k, None)
        path = self.dir / ".env"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.settings.items()))
        path.chmod(0o600)

    def write_cron(self, name: str, text: str) -> Path:
        path = self.dir / "crontab.d" / name
        path.write_text(text)
        return path

    def add_command(self, name: str, handle_body: str, arguments: str = "pass") -> None:
        """Add a management command `name` to this copy (test jobs live only in the copy)."""
        code = TEST_COMMAND.format(
            arguments=textwrap.indent(textwrap.dedent(arguments).strip(), " " * 8),
            body=textwrap.indent(textwrap.dedent(handle_body).strip(), " " * 8),
        )
        (self.dir / "commands" / "management" / "commands" / f"{name}.py").write_text(code)

    def command(self, *args) -> list[str]:
        return [sys.executable, str(self.dir / "manage.py"), *args]

    def manage(self, *args, env=None, timeout=120, cwd=None):
        return subprocess.run(
            self.command(*args),
            cwd=cwd or self.dir,
            env=base_env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run_job(self, *args, **kwargs):
        return self.manage("run_job", *args, **kwargs)

    def popen(self, *args, env=None, **kwargs):
        return subprocess.Popen(
            self.command(*args),
            cwd=self.dir,
            env=base_env(**(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kwargs,
        )


def _project(tmp_path, templates, backend, request):
    directory = copy_tree(tmp_path / "app")
    db, drop = make_database(backend, templates, tmp_path)
    if drop:
        request.addfinalizer(drop)
    return Project(
        directory,
        db,
        {
            "DATABASE_URL": db.url,
            "SECRET_KEY": "test-secret-key-" + "x" * 40,
            "TIME_ZONE": "UTC",
            "OPS_HOST": "host-a",
            "OPS_HEARTBEAT_SECONDS": "30",
        },
    )


@pytest.fixture(params=["sqlite", "pg"])
def project(request, tmp_path, migrated_templates):
    """A deployed copy of the project, once on SQLite and once on PostgreSQL."""
    return _project(tmp_path, migrated_templates, request.param, request)


@pytest.fixture
def sqlite_project(request, tmp_path, migrated_templates):
    """The same, on SQLite only (for tests where the database does not matter)."""
    return _project(tmp_path, migrated_templates, "sqlite", request)


@pytest.fixture
def pg_project(request, tmp_path, migrated_templates):
    return _project(tmp_path, migrated_templates, "pg", request)


@pytest.fixture(scope="session")
def _hc_http():
    """The threaded HTTP server behind `hc`, one per worker: stopping a server waits out
    werkzeug's half-second poll, which once per test added up to a minute."""
    from pytest_httpserver import HTTPServer

    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def hc(_hc_http):
    """A healthchecks.io stand-in (tests/hcserver.py) on 127.0.0.1, with the test ping key and
    API key and a state of its own for each test; its state is what a test asserts on."""
    from .hcserver import HealthchecksServer

    _hc_http.clear()
    try:
        yield HealthchecksServer(_hc_http, ping_key=PING_KEY)
    finally:
        _hc_http.clear()


@pytest.fixture
def ping_server(httpserver):
    """pytest-httpserver on 127.0.0.1 answering every ping 200 OK; the log is httpserver.log."""
    httpserver.expect_request("").respond_with_data("OK", headers={"Ping-Body-Limit": "100000"})
    return httpserver


# --- throwaway system users with their own crontab (issue 3: install_crontab, cron e2e) ---


class CronUser:
    """A system user created for one test (never root: root's crontab is never touched)."""

    def __init__(self, name: str, home: Path):
        self.name, self.home = name, home

    def crontab(self) -> bytes | None:
        """`crontab -l` for this user, as bytes; None when the user has no crontab."""
        result = subprocess.run(["crontab", "-l", "-u", self.name], capture_output=True)
        if result.returncode != 0:
            assert b"no crontab for" in result.stderr, result.stderr
            return None
        return result.stdout

    def set_crontab(self, data: bytes) -> None:
        path = self.home / "initial.cron"
        path.write_bytes(data)
        result = subprocess.run(["crontab", "-u", self.name, str(path)], capture_output=True)
        assert result.returncode == 0, result.stderr
        path.unlink()


@pytest.fixture
def cron_user():
    """A throwaway system user (useradd, as root) with a home under /tmp; removed afterwards."""
    import tempfile

    require(
        os.geteuid() == 0 and bool(shutil.which("useradd")) and bool(shutil.which("crontab")),
        "needs root, useradd and Debian's crontab (run .ci/services.sh as root)",
    )
    name = f"cronops-{uuid.uuid4().hex[:10]}"
    home = Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/tmp"))
    home.chmod(0o755)
    command = ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", name]

    def added():
        result = subprocess.run(command, capture_output=True, text=True)
        # another worker's useradd or userdel holds /etc/passwd's lock: try again
        assert result.returncode == 0 or "cannot lock" in result.stderr, result.stderr
        return result.returncode == 0

    wait_until(added, f"useradd {name} (/etc/passwd locked by another user's change)")
    shutil.chown(home, name, name)
    try:
        yield CronUser(name, home)
    finally:
        subprocess.run(["crontab", "-r", "-u", name], capture_output=True)
        _remove_user(name)
        shutil.rmtree(home, ignore_errors=True)


def _remove_user(name: str) -> None:
    """userdel, retried: it fails while /etc/passwd is locked by a concurrent useradd, or
    while a job cron started as this user still runs (those processes are ended, by pid)."""
    import signal

    def removed():
        if subprocess.run(["userdel", name], capture_output=True).returncode in (0, 6):
            return True
        pids = subprocess.run(["pgrep", "-u", name], capture_output=True, text=True).stdout
        for pid in pids.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return False

    wait_until(removed, f"userdel {name}", timeout=20)


ECHO_ARGS = '''"""Test command: prints its arguments and environment as JSON (what reached it)."""
import json
import os

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("words", nargs="*")

    def handle(self, *args, **options):
        self.stdout.write("ARGS " + json.dumps(options["words"]))
        keys = ("PATH", "HOME", "LOGNAME", "SHELL", "LANG", "VIRTUAL_ENV")
        self.stdout.write("ENV " + json.dumps({k: os.environ.get(k) for k in keys}))
'''


def add_echo_args(directory: Path) -> None:
    """Give a deployed copy an `echo_args` management command (test-only)."""
    target = directory / "commands" / "management" / "commands" / "echo_args.py"
    target.write_text(ECHO_ARGS)


def app_of_its_own(user, templates, cron: str = "") -> tuple[str, Path]:
    """A deployed copy in `user`'s home, owned by `user`, on a migrated SQLite database, with a
    .env (DATABASE_URL, SECRET_KEY) and `cron` as crontab.d/t.cron: (a Python `user` can run,
    the copy's directory). Skips (fails in CI) without such a Python."""
    import shutil

    from .test_cron_e2e import python_for

    python = python_for(user.name)
    require(python is not None, f"no Python that {user.name} can execute")
    assert python is not None
    app = copy_tree(user.home / "app")
    shutil.copy2(templates["sqlite"], app / "db.sqlite3")
    (app / ".env").write_text(
        f"DATABASE_URL=sqlite:///{app / 'db.sqlite3'}\nSECRET_KEY={'z' * 50}\n"
    )
    if cron:
        (app / "crontab.d" / "t.cron").write_text(cron)
    subprocess.run(["chown", "-R", f"{user.name}:{user.name}", str(app)], check=True)
    return python, app
