"""F4: 20 different jobs started in the same second on the embedded SQLite.

Declares job01..job20 (each `run_job` of a command that does one read and one write of its
own), starts all 20 at once, 5 rounds (a new logical date each). Must hold: no run fails or
prints "database is locked"; 20 successes recorded per round.
Usage: python bench/faults/f4_sqlite_contention.py [--jobs 20] [--rounds 5]
"""

import argparse
import subprocess
import sys
import time

import _path  # noqa: F401
from _common import PingServer, deployed_copy, env, goal, sqlite_rows

WRITE = """\
from django.core.management.base import BaseCommand

from ops.models import JobRun


class Command(BaseCommand):
    help = "One read and one write, like a small real job (benchmarks)."

    def handle(self, *args, **options):
        run = JobRun.objects.order_by("-id").first()
        JobRun.objects.filter(pk=run.pk).update(host=run.host)
        self.stdout.write("ok")
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    names = [f"job{i:02}" for i in range(1, args.jobs + 1)]
    cron = "".join(f"0 3 * * * --name={n} bench_write\n" for n in names)
    root = deployed_copy(cron, commands={"bench_write": WRITE})
    server = PingServer()
    extra = env(HEALTHCHECKS_PING_URL=server.url, HEALTHCHECKS_PING_KEY="key")
    manage = [sys.executable, str(root / "manage.py"), "run_job"]
    locked, failures, spreads, counts = 0, [], [], []
    for r in range(args.rounds):
        date = f"2001-01-{r + 1:02}"
        procs, t0 = [], time.perf_counter()
        for name in names:
            procs.append(
                subprocess.Popen(
                    [*manage, f"--logical-date={date}", name],
                    cwd=root,
                    env=extra,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        spreads.append(time.perf_counter() - t0)
        for name, proc in zip(names, procs, strict=True):
            out, _ = proc.communicate(timeout=300)
            locked += "database is locked" in out
            if proc.returncode:
                failures.append((date, name, proc.returncode, out.strip()[-300:]))
        ok = sqlite_rows(
            root,
            "SELECT COUNT(DISTINCT job) FROM ops_jobrun WHERE logical_date = ? "
            "AND outcome = 'succeeded'",
            (date,),
        )[0][0]
        counts.append(ok)
        print(f"round {r + 1}: {ok} successes recorded; started in {spreads[-1] * 1000:.0f} ms")
    server.close()
    for failure in failures[:5]:
        print("failed:", failure)
    goal(
        "F4",
        f"{args.jobs} jobs at once x {args.rounds} rounds: successes per round {counts}, "
        f"failed runs {len(failures)}, 'database is locked' {locked}",
        counts == [args.jobs] * args.rounds and not failures and not locked,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
