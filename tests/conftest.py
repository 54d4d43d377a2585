"""Shared fixtures: a deployed copy of the project run as real processes, on SQLite and PostgreSQL.

`project` copies manage.py and the apps into a temporary directory with its own `.env`,
database, lock and log directories, so each test runs `manage.py run_job` exactly as cron
would, against a database migrated once per session.
"""

import datetime as dt
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

REPO = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("CRONOPS_TEST_PG_URL", "")
REQUIRE_ALL = bool(os.environ.get("CRONOPS_REQUIRE_ALL"))
PING_KEY = "pk-" + "s3cr3t" * 4  # looks like a real key; tests assert it never leaks


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


def pytest_collection_modifyitems(items):
    """Mark the tests that use Django's own test database, so `make test` can run them again
    with DATABASE_URL pointing at PostgreSQL (the `project` fixture covers both by itself)."""
    for item in items:
        if IN_PROCESS_DB & set(getattr(item, "fixturenames", ())) or item.get_closest_marker(
            "django_db"
        ):
            item.add_marker(pytest.mark.inprocess_db)


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


def clear_of_fire_times(*exprs: str, tz: str = "UTC", margin: float = 120.0) -> None:
    """Wait until no fire time of `exprs` (cron expressions, in `tz`) falls in the next `margin`
    seconds, so that a test comparing its own idea of the current slot or date with a run_job's
    cannot straddle one (CI runs at any hour, across midnight too): at most `margin` seconds."""
    now = dt.datetime.now(ZoneInfo(tz))
    left = min((next(CronSim(expr, now)) - now).total_seconds() for expr in exprs)
    if left < margin:
        time.sleep(left + 1)


def copy_tree(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("config", "ops", "commands"):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    shutil.copy2(REPO / "manage.py", dest / "manage.py")
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


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory):
    """Migrate once per session: a SQLite file and (when available) a PostgreSQL template."""
    root = tmp_path_factory.mktemp("template")
    tree = copy_tree(root / "project")
    sqlite_file = root / "template.sqlite3"
    result = _manage(tree, base_env(DATABASE_URL=f"sqlite:///{sqlite_file}"), "migrate", "-v0")
    assert result.returncode == 0, result.stderr
    templates = {"sqlite": sqlite_file}
    if PG_URL:
        import psycopg

        name = f"cronops_tmpl_{os.getpid()}"
        with psycopg.connect(PG_URL, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}"')
            con.execute(f'CREATE DATABASE "{name}"')
        url = PG_URL.rsplit("/", 1)[0] + "/" + name
        result = _manage(tree, base_env(DATABASE_URL=url), "migrate", "-v0")
        assert result.returncode == 0, result.stderr
        templates["pg"] = name
    yield templates
    if "pg" in templates:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{templates["pg"]}" WITH (FORCE)')


def make_database(backend: str, templates: dict, directory: Path):
    if backend == "sqlite":
        target = directory / "db.sqlite3"
        shutil.copy2(templates["sqlite"], target)
        return Database("sqlite", f"sqlite:///{target}"), None
    require(bool(PG_URL), "PostgreSQL not available (set CRONOPS_TEST_PG_URL, see .ci/services.sh)")
    import psycopg

    name = f"cronops_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}" TEMPLATE "{templates["pg"]}"')

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
    # The tests' daily jobs fire at 00:00 or 03:00 UTC: a test that runs one twice (or compares
    # its slot with today's date) must not straddle that instant.
    clear_of_fire_times("0 0 * * *", "0 3 * * *")
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


@pytest.fixture
def hc():
    """A healthchecks.io stand-in (tests/hcserver.py) on its own threaded server on 127.0.0.1,
    with the test ping key and API key; its state is what a test asserts on."""
    from pytest_httpserver import HTTPServer

    from .hcserver import HealthchecksServer

    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    try:
        yield HealthchecksServer(server, ping_key=PING_KEY)
    finally:
        server.clear()
        server.stop()


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
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
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
    import time

    for _ in range(20):
        if subprocess.run(["userdel", name], capture_output=True).returncode in (0, 6):
            return
        pids = subprocess.run(["pgrep", "-u", name], capture_output=True, text=True).stdout
        for pid in pids.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


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
