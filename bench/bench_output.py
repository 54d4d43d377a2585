"""P7: a job printing 1 GB; the runner's peak memory must stay within 10 MiB of a job that
prints nothing.

Alternates N rounds of `run_job --force bench_print --bytes=0` and `--bytes=1G` (64 KiB
writes to fd 1), the runner's stdout going to /dev/null as it would to a log file. Peak RSS
comes from os.wait4 (the runner's process; the job runs in it). Also prints the throughput.
Usage: python bench/bench_output.py [--rounds 3] [--mib 1024]
"""

import argparse
import sys

from _common import deployed_copy, goal, median, timed

PRINT = """\
import os

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Writes --bytes bytes of text to stdout in 64 KiB writes (benchmarks)."

    def add_arguments(self, parser):
        parser.add_argument("--bytes", type=int, default=0)

    def handle(self, *args, **options):
        line = b"x" * 79 + b"\\n"
        chunk = line * (65536 // len(line))
        left = options["bytes"]
        while left > 0:
            left -= os.write(1, chunk[:left])
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=1024)
    args = parser.parse_args()
    root = deployed_copy("* * * * * --no-ping bench_print\n", commands={"bench_print": PRINT})
    size = args.mib * 1024 * 1024
    py, manage = sys.executable, str(root / "manage.py")
    variants = {
        "nothing": [py, manage, "run_job", "--force", "bench_print", "--bytes=0"],
        f"{args.mib} MiB": [py, manage, "run_job", "--force", "bench_print", f"--bytes={size}"],
        f"bare {args.mib} MiB": [py, manage, "bench_print", f"--bytes={size}"],
    }
    timed(variants["nothing"], cwd=root)
    results = {name: ([], []) for name in variants}
    for _ in range(args.rounds):
        for name, argv in variants.items():
            wall, rss, code = timed(argv, cwd=root)
            assert code == 0, f"{name}: exit {code}"
            results[name][0].append(wall)
            results[name][1].append(rss)
    for name, (walls, rsss) in results.items():
        print(
            f"{name:14} wall median {median(walls):6.2f} s, "
            f"peak RSS max {max(rsss) / 1024:6.1f} MiB"
        )
    big = results[f"{args.mib} MiB"]
    rate = args.mib / median(big[0])
    print(f"run_job passes output through at {rate:.0f} MiB/s (to /dev/null)")
    delta = (max(big[1]) - max(results["nothing"][1])) / 1024
    goal(
        "P7",
        f"runner peak RSS printing {args.mib} MiB vs nothing: {delta:+.1f} MiB (goal <= 10 MiB)",
        delta <= 10,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
