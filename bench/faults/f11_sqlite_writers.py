"""F11: a job's long write transaction on the embedded SQLite, and the other jobs (issue 20).

The case from issue 20: a job (`writer`, through run_job like any job) holds a write transaction
for --writer seconds (45); --jobs other jobs (5) start --delay seconds (4) after it, each a
small job that reads and writes. Then the same with the writer starting while the other jobs'
commands run (--record-writer seconds, 70: longer than two busy timeouts), so that their
records at the end meet it. Then (unless --no-bound) one job against a writer that outlasts
run_job's bound (patience.LOCK_WAIT + 10 s, about 5 minutes).
Must hold: the other jobs wait for the writer and succeed, each recorded, none prints
"database unavailable"; past the bound one line "database is locked by another writer for N s",
a /fail ping, exit 1.
Usage: python bench/faults/f11_sqlite_writers.py [--writer 45] [--delay 4] [--jobs 5]
       [--record-writer 70] [--no-bound]
"""

import argparse
import subprocess
import sys
import time

import _path  # noqa: F401
from _common import FaultServer, deployed_copy, env, goal, sqlite_rows

HOLD = """\
import time

from django.core.management.base import BaseCommand
from django.db import transaction

from ops.models import JobRun


class Command(BaseCommand):
    help = "Holds a write transaction for --seconds (a long batch job)."

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=45)

    def handle(self, *args, seconds, **options):
        with transaction.atomic():
            JobRun.objects.filter(pk=JobRun.objects.order_by("-id")[0].pk).update(note="x")
            print("holding", flush=True)
            time.sleep(seconds)
"""

WRITE = """\
import time

from django.core.management.base import BaseCommand

from ops.models import JobRun


class Command(BaseCommand):
    help = "One read and one write, then --sleep seconds (a small job)."

    def add_arguments(self, parser):
        parser.add_argument("--sleep", type=float, default=0)

    def handle(self, *args, sleep, **options):
        run = JobRun.objects.order_by("-id").first()
        JobRun.objects.filter(pk=run.pk).update(host=run.host)
        time.sleep(sleep)
        self.stdout.write("ok")
"""


class Fleet:
    def __init__(self, root, server):
        self.root, self.manage = root, [sys.executable, str(root / "manage.py"), "run_job"]
        self.extra = env(HEALTHCHECKS_PING_URL=server.url, HEALTHCHECKS_PING_KEY="key")

    def start(self, *argv):
        proc = subprocess.Popen(
            [*self.manage, *argv],
            cwd=self.root,
            env=self.extra,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        proc.started = time.monotonic()  # type: ignore[attr-defined]
        return proc

    def wait_for_hold(self, writer):
        line = ""
        while "holding" not in line:
            line = writer.stdout.readline()
            if not line and writer.poll() is not None:
                raise SystemExit("the writer ended before it held the database")


def results(procs, date, fleet, names):
    """[(name, exit, wall seconds, output)] and the outcomes recorded for `date`."""
    done = []
    for name, proc in zip(names, procs, strict=True):
        out, _ = proc.communicate(timeout=900)
        done.append((name, proc.returncode, time.monotonic() - proc.started, out))
    rows = dict(
        sqlite_rows(
            fleet.root,
            "SELECT job, outcome FROM ops_jobrun WHERE logical_date = ? AND job LIKE 'job%'",
            (date,),
        )
    )
    return done, rows


def report(ident, label, done, rows, writer_seconds) -> None:
    codes = [code for _, code, _, _ in done]
    walls = sorted(wall for _, _, wall, _ in done)
    unavailable = sum("database unavailable" in out for *_, out in done)
    said = sum("another writer holds the database; waiting" in out for *_, out in done)
    ok = all(c == 0 for c in codes) and not unavailable and set(rows.values()) == {"succeeded"}
    ok = ok and len(rows) == len(done)
    goal(
        ident,
        f"{label} (writer {writer_seconds:g} s): exits {codes}, wall "
        f"{walls[0]:.1f}-{walls[-1]:.1f} s, "
        f"recorded {sorted(rows.values())}, 'database unavailable' {unavailable}, "
        f"said they waited {said}/{len(done)}",
        ok,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writer", type=float, default=45)
    parser.add_argument("--delay", type=float, default=4)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--record-writer", type=float, default=70)
    parser.add_argument(
        "--bound", type=float, default=300, help="run_job's bound (patience.LOCK_WAIT)"
    )
    parser.add_argument("--no-bound", action="store_true")
    args = parser.parse_args()
    names = [f"job{i:02}" for i in range(1, args.jobs + 1)]
    cron = "".join(f"0 3 * * * --name={n} bench_write\n" for n in names)
    cron += "0 3 * * * --name=writer bench_hold\n"
    root = deployed_copy(cron, commands={"bench_write": WRITE, "bench_hold": HOLD})
    server = FaultServer("ok")
    fleet = Fleet(root, server)
    fleet.start("--logical-date=2001-01-01", "job01").communicate(timeout=120)  # a first row

    # 1. The others start --delay s after the writer holds the database: their claims wait.
    date = "2001-01-02"
    writer = fleet.start(f"--logical-date={date}", "writer", f"--seconds={args.writer}")
    fleet.wait_for_hold(writer)
    time.sleep(args.delay)
    procs = [fleet.start(f"--logical-date={date}", n) for n in names]
    done, rows = results(procs, date, fleet, names)
    writer.communicate(timeout=900)
    for name, code, wall, out in done[:1]:
        print(f"{name}: exit {code} after {wall:.1f} s\n{out.strip()}")
    report("F11", "claims meet a long writer", done, rows, args.writer)

    # 2. The writer starts while their commands run: their records at the end wait.
    if args.record_writer:
        date = "2001-01-03"
        procs = [fleet.start(f"--logical-date={date}", n, "--sleep=3") for n in names]
        time.sleep(1.5)
        seconds = f"--seconds={args.record_writer}"
        writer = fleet.start(f"--logical-date={date}", "writer", seconds)
        fleet.wait_for_hold(writer)
        done, rows = results(procs, date, fleet, names)
        writer.communicate(timeout=900)
        report("F11", "records meet a long writer", done, rows, args.record_writer)

    # 3. A writer that outlasts the bound: one line, /fail, exit 1.
    if not args.no_bound:
        date, seconds = "2001-01-04", args.bound + 10
        writer = fleet.start(f"--logical-date={date}", "writer", f"--seconds={seconds}")
        fleet.wait_for_hold(writer)
        before = len(server.log)
        job = fleet.start(f"--logical-date={date}", "job01")
        out, _ = job.communicate(timeout=900)
        wall = time.monotonic() - job.started
        writer.communicate(timeout=900)
        fails = [p for p, _ in server.log[before:] if p.split("?")[0].endswith("/job01/fail")]
        errors = [line for line in out.splitlines() if line.startswith("cronops: error")]
        print("\n".join(errors))
        goal(
            "F11",
            f"a writer past the bound ({args.bound:g} s; writer {seconds:g} s): exit "
            f"{job.returncode} after {wall:.0f} s, {len(errors)} error line, /fail pings "
            f"{len(fails)}",
            job.returncode == 1
            and len(errors) == 1
            and "database is locked by another writer for" in errors[0]
            and len(fails) == 1,
        )
    server.close()
    return 0  # the goal lines carry the verdicts (bench/run.py)


if __name__ == "__main__":
    raise SystemExit(main())
