"""Shared bench helpers: a deployed copy of the project, a ping server, timed child processes."""

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


def deployed_copy(crontab: str = "") -> Path:
    """A temporary copy of the project with a migrated SQLite database and a no-op command."""
    root = Path(tempfile.mkdtemp(prefix="cronops-bench-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("config", "ops", "commands"):
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    shutil.copy2(REPO / "manage.py", root)
    (root / "commands/management/commands/bench_noop.py").write_text(NOOP)
    (root / "commands/management/commands/bench_query.py").write_text(QUERY)
    (root / "crontab.d").mkdir()
    (root / "crontab.d/bench.cron").write_text(crontab)
    (root / ".env").write_text("SECRET_KEY=bench\nOPS_HOST=bench\n")
    manage(root, "migrate", "-v0", check=True)
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
    return wall, usage.ru_maxrss, proc.returncode


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
