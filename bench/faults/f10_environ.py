"""F10: a job that rewrites os.environ in a tight loop while its pings go to a server that never
answers, 2,000 times.

When the job ran inside run_job, adding a variable to the environment while a ping thread's
getaddrinfo (or libpq's connect) read it crashed run_job with SIGSEGV in glibc's getenv (CI,
Python 3.13; here about 1 run in 1,600). The job now runs in a forked child: its environment
writes happen in another process than run_job's threads. Each run pings `localhost` (a name,
so the start ping resolves it in a thread) on a listener that accepts and never answers, with
a short ping budget; four workers run at once, each its own job name.
Must hold: every run exits 0 and is recorded `succeeded`, none is killed by a signal, and no
run outlives its start-up + the job + the ping budget by much.
Usage: python bench/faults/f10_environ.py [--runs 2000] [--workers 4]
"""

import argparse
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import _path  # noqa: F401
from _common import deployed_copy, goal, median, run, sqlite_rows

CHURN = """\
import os
import time

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Rewrites os.environ as fast as it can for a while (F10)."

    def handle(self, *args, **options):
        end = time.monotonic() + float(os.environ.get("CHURN_SECONDS", "0.2"))
        writes = 0
        while time.monotonic() < end:
            os.environ[f"CHURN_{writes % 64}"] = "x" * (writes % 200)
            if writes % 3 == 0:
                os.environ.pop(f"CHURN_{(writes * 7) % 64}", None)
            writes += 1
        self.stdout.write(f"{writes} environment writes")
"""
BUDGET = 0.5  # seconds: OPS_PING_BUDGET_SECONDS, what pings may add to a run


class Silent:
    """Accepts connections on 127.0.0.1 and never answers (closes them after a minute)."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(512)
        self.port = self.listener.getsockname()[1]
        self.held: list[tuple[float, socket.socket]] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            conn, _ = self.listener.accept()
            self.accepted += 1
            now = time.monotonic()
            self.held.append((now, conn))
            while self.held and self.held[0][0] < now - 60:
                self.held.pop(0)[1].close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    server = Silent()
    root = deployed_copy("", commands={"bench_churn": CHURN})
    extra = {
        "HEALTHCHECKS_PING_URL": f"http://localhost:{server.port}/",
        "HEALTHCHECKS_PING_KEY": "f10-key",
        "OPS_PING_BUDGET_SECONDS": BUDGET,
    }
    results: list[tuple[int, float, str]] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        for _ in range(args.runs // args.workers):
            code, _, err, wall = run(
                root, "run_job", f"--name=churn-{w}", "bench_churn", extra_env=extra, timeout=60
            )
            with lock:
                results.append((code, wall, err))

    started = time.monotonic()
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(worker, range(args.workers)))
    took = time.monotonic() - started
    codes: dict[int, int] = {}
    for code, _, _ in results:
        codes[code] = codes.get(code, 0) + 1
    rows = sqlite_rows(root, "SELECT outcome, count(*) FROM ops_jobrun GROUP BY outcome")
    walls = sorted(wall for _, wall, _ in results)
    crashes = [err for code, _, err in results if code < 0 or "Traceback" in err]
    print(f"{len(results)} runs in {took:.0f} s; exit codes {codes}; history {rows}")
    print(
        f"wall per run: median {median(walls):.2f} s, slowest {walls[-1]:.2f} s; "
        f"{server.accepted} ping connections accepted, none answered"
    )
    if crashes:
        print("first crash:", crashes[0][-2000:])
    goal(
        "F10",
        f"{len(results)} runs rewriting os.environ while pings hang: "
        f"{codes.get(0, 0)} exit 0, {len(crashes)} crashed, history {dict(rows)}",
        codes == {0: len(results)} and dict(rows) == {"succeeded": len(results)} and not crashes,
    )
    goal(
        "F10",
        f"slowest run {walls[-1]:.2f} s (start-up + 0.2 s job + {BUDGET:g} s ping budget + "
        "scheduling, bound 5 s)",
        walls[-1] < 5,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
