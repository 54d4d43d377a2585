"""Shared bench helpers: a deployed copy of the project, a ping server, timed child processes."""

import atexit
import http.server
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOOP = """\
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Does nothing (benchmarks)."

    def handle(self, *args, **options):
        self.stdout.write("ok")
"""


QUERY = """\
from django.core.management.base import BaseCommand

from commands.models import Subscription


class Command(BaseCommand):
    help = "One database query, like any real job (benchmarks)."

    def handle(self, *args, **options):
        self.stdout.write(str(Subscription.objects.count()))
"""


def deployed_copy(crontab: str = "", env_lines: str = "", commands: dict | None = None) -> Path:
    """A temporary copy of the project with a migrated database and a no-op command.

    SQLite in the copy's var/ unless `env_lines` sets DATABASE_URL; `commands` adds management
    commands (name -> source) to the copy only.
    """
    root = Path(tempfile.mkdtemp(prefix="cronops-bench-"))
    if not os.environ.get("BENCH_KEEP"):  # BENCH_KEEP=1 keeps the copies to look into
        atexit.register(shutil.rmtree, root, True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("config", "ops", "commands"):
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    shutil.copy2(REPO / "manage.py", root)
    (root / "commands/management/commands/bench_noop.py").write_text(NOOP)
    (root / "commands/management/commands/bench_query.py").write_text(QUERY)
    (root / "crontab.d").mkdir()
    (root / "crontab.d/bench.cron").write_text(crontab)
    (root / ".env").write_text("SECRET_KEY=bench\nOPS_HOST=bench\n" + env_lines)
    (root / ".env").chmod(0o600)  # the system checks refuse a readable .env
    for name, code in (commands or {}).items():
        (root / f"commands/management/commands/{name}.py").write_text(code)
    done = manage(root, "migrate", "-v0")
    if done.returncode:
        raise SystemExit(f"migrate failed in {root}:\n{done.stderr}")
    return root


def env(**extra) -> dict:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    base.update({k: str(v) for k, v in extra.items()})
    return base


def manage(root: Path, *args, check=False, extra_env=None):
    return subprocess.run(
        [sys.executable, str(root / "manage.py"), *args],
        cwd=root,
        env=env(**(extra_env or {})),
        capture_output=True,
        text=True,
        check=check,
    )


def timed(argv: list[str], *, cwd: Path, extra_env=None, shell=False) -> tuple[float, int, int]:
    """(wall seconds, peak RSS KiB of the process tree's largest process, exit code)."""
    return timed_cpu(argv, cwd=cwd, extra_env=extra_env, shell=shell)[:3]


def timed_cpu(argv: list[str], *, cwd: Path, extra_env=None, shell=False):
    """(wall seconds, peak RSS KiB, exit code, CPU seconds: user + system of it and its
    waited-for children). CPU time hardly moves with the machine's load; wall time does."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env(**(extra_env or {})),
        shell=shell,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss, proc.returncode, usage.ru_utime + usage.ru_stime


class PingServer:
    """healthchecks-like ping endpoint on 127.0.0.1 that answers every request 200 OK."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self._ok()

            def do_GET(self):
                self._ok()

            def do_HEAD(self):
                self._ok()

            def _ok(self):
                self.send_response(200)
                self.send_header("Ping-Body-Limit", "100000")
                self.send_header("Content-Length", "2")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(b"OK")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def median(values):
    return statistics.median(values)


# --- shared by the P3-P7 benches and the fault scenarios (bench/faults/) ---

STAMP = """\
import os
import time

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Appends 'start <time>' to $BENCH_STAMP, sleeps, appends 'end' (benchmarks)."

    def add_arguments(self, parser):
        parser.add_argument("--sleep", type=float, default=0.0)
        parser.add_argument("--until-file", default="")
        parser.add_argument("--exit", type=int, default=0)

    def handle(self, *args, **options):
        path = os.environ.get("BENCH_STAMP", "")
        if path:
            with open(path, "a") as f:
                f.write(f"start {time.time():.6f} {os.getpid()}\\n")
        deadline = time.monotonic() + 120
        while options["until_file"] and not os.path.exists(options["until_file"]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        time.sleep(options["sleep"])
        if path:
            with open(path, "a") as f:
                f.write(f"end {time.time():.6f} {os.getpid()}\\n")
        if options["exit"]:
            raise SystemExit(options["exit"])
        self.stdout.write("ok")
"""

RESULTS: list[tuple[str, bool, str]] = []


def goal(ident: str, text: str, ok: bool) -> bool:
    """Print one figure against its goal; `bench/run.py` collects these lines."""
    line = f"{ident} {text}: {'met' if ok else 'NOT met'}"
    print(line, flush=True)
    RESULTS.append((ident, ok, text))
    return ok


def exit_status() -> int:
    return 0 if all(ok for _, ok, _ in RESULTS) else 1


def sqlite_rows(root: Path, sql: str, params=()) -> list:
    import sqlite3

    con = sqlite3.connect(root / "var" / "db.sqlite3", timeout=30)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def run(root: Path, *args, extra_env=None, timeout=300, stdout=None):
    """`manage.py ARGS` as cron would run it: (exit code, stdout, stderr, wall seconds)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(root / "manage.py"), *args],
        cwd=root,
        env=env(**(extra_env or {})),
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=timeout,
    )
    out = done.stdout.decode(errors="replace") if isinstance(done.stdout, bytes) else ""
    return done.returncode, out, done.stderr.decode(errors="replace"), time.perf_counter() - start


class FaultServer:
    """A ping endpoint on 127.0.0.1 that misbehaves on purpose; `log` lists the paths it saw.

    mode: ok | hang (accepts, never answers) | 500 | 429 | slow (answers after `delay` s) |
    tls (a self-signed certificate the client must refuse) | refuse (nothing listens) |
    blackhole (a listener whose accept queue is full: the SYN is dropped, connect times out).
    """

    def __init__(self, mode: str = "ok", delay: float = 30.0):
        import socket

        self.mode, self.delay, self.log = mode, delay, []
        self._socks: list = []
        self.server = None
        if mode == "refuse":
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()  # nothing listens there now: connection refused
            self.url = f"http://127.0.0.1:{port}/"
            return
        if mode == "blackhole":
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(0)
            port = listener.getsockname()[1]
            self._socks.append(listener)
            for _ in range(4):  # fill the accept queue; later SYNs are dropped
                c = socket.socket()
                c.setblocking(False)
                c.connect_ex(("127.0.0.1", port))
                self._socks.append(c)
            time.sleep(0.1)
            self.url = f"http://127.0.0.1:{port}/"
            return
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                outer.log.append((self.path, body))
                if outer.mode == "hang":
                    time.sleep(3600)
                if outer.mode == "slow":
                    time.sleep(outer.delay)
                status = {"500": 500, "429": 429}.get(outer.mode, 200)
                text = b"OK" if status == 200 else b"nope"
                self.send_response(status)
                self.send_header("Ping-Body-Limit", "100000")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # clients that gave up (timeouts) are the point here

        self.server = Server(("127.0.0.1", 0), Handler)
        scheme = "http"
        if mode == "tls":
            import ssl

            cert_dir = Path(tempfile.mkdtemp(prefix="cronops-tls-"))
            subprocess.run(
                [
                    *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                    *("-subj", "/CN=127.0.0.1", "-keyout", str(cert_dir / "key.pem")),
                    *("-out", str(cert_dir / "cert.pem")),
                ],
                check=True,
                capture_output=True,
            )
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert_dir / "cert.pem", cert_dir / "key.pem")
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        for s in self._socks:
            s.close()


def pg_url() -> str:
    """The PostgreSQL server URL from CRONOPS_TEST_PG_URL or var/ci/env.sh (.ci/services.sh)."""
    url = os.environ.get("CRONOPS_TEST_PG_URL", "")
    env_sh = REPO / "var" / "ci" / "env.sh"
    if not url and env_sh.exists():
        for line in env_sh.read_text().splitlines():
            if line.startswith("export CRONOPS_TEST_PG_URL="):
                url = line.split("=", 1)[1].strip()
    return url


class PgDatabase:
    """A throwaway database on the services' PostgreSQL; `url` for the project's .env."""

    def __init__(self, server_url: str):
        import uuid

        import psycopg

        self.server_url, self.name = server_url, f"cronops_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(server_url, autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{self.name}"')
        self.url = server_url.rsplit("/", 1)[0] + "/" + self.name

    def query(self, sql: str, params=()):
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as con:
            return con.execute(sql, params).fetchall()

    def drop(self):
        import psycopg

        with psycopg.connect(self.server_url, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class TcpProxy:
    """127.0.0.1 proxy to host:port; `cut()` closes the listener and every connection (the
    database "goes away" for whoever talks through it) without touching the server."""

    def __init__(self, host: str, port: int):
        import socket

        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list = []
        self.alive = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket

        while self.alive:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.alive:
                client.close()
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self):
        import socket

        self.alive = False
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
        except OSError:
            pass
        self.listener.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
