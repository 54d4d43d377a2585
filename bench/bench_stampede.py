"""P4: 50 run_job of one job started at once, 20 rounds.

Each round starts 50 `run_job --logical-date=D bench_stamp --until-file=F` processes together
(D is new each round). The winner's job waits for F, which this script creates once all 49
others have exited, so every loser meets a held lock. Goals: exactly one execution per round;
the 49 losers exit 75; median loser exit time <= 1.2 x bare start-up.

The fair baseline is measured in the same run, alternating with the run_job rounds: 50 bare
`manage.py bench_noop` started at once (50 Python + Django start-ups compete for the CPUs).
A single bare start-up, alone, is printed too.
Usage: python bench/bench_stampede.py [--rounds 20] [--procs 50]
"""

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import STAMP, PingServer, deployed_copy, env, goal, median, sqlite_rows, timed


def stampede(argvs: list[list[str]], root: Path, extra_env: dict, release: Path | None):
    """Start every argv at once; [(seconds to exit, exit code, CPU seconds)] in start order."""
    environ = env(**extra_env)
    procs, t0 = [], time.perf_counter()
    for argv in argvs:
        procs.append(
            subprocess.Popen(
                argv, cwd=root, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        )
    started = time.perf_counter()
    ends: dict[int, tuple[float, int, float]] = {}
    while len(ends) < len(procs):
        pid, status, usage = os.wait4(-1, 0)
        code = os.waitstatus_to_exitcode(status)
        ends[pid] = (time.perf_counter() - t0, code, usage.ru_utime + usage.ru_stime)
        if release is not None and len(ends) == len(procs) - 1:
            release.touch()  # every loser is done: let the winner finish
    for p in procs:
        p.stderr.read()
        p.stderr.close()
        p.returncode = ends[p.pid][1]
    return [ends[p.pid] for p in procs], started - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--procs", type=int, default=50)
    args = parser.parse_args()
    root = deployed_copy("", commands={"bench_stamp": STAMP})
    server = PingServer()
    work = Path(tempfile.mkdtemp(prefix="cronops-p4-"))
    stamp = work / "stamp"
    extra = {
        "HEALTHCHECKS_PING_URL": server.url,
        "HEALTHCHECKS_PING_KEY": "k",
        "BENCH_STAMP": stamp,
    }
    py, manage = sys.executable, str(root / "manage.py")
    single = []
    for _ in range(5):
        timed([py, manage, "bench_noop"], cwd=root)
    loser_times, bare_times, spawn_times, loser_cpu, bare_cpu = [], [], [], [], []
    executions, bad_rounds, loser_codes = [], [], {}
    day = dt.date(2001, 1, 1)
    for r in range(args.rounds):
        single.append(timed([py, manage, "bench_noop"], cwd=root)[0])
        bare, spawn = stampede([[py, manage, "bench_noop"]] * args.procs, root, extra, None)
        bare_times.append(median([t for t, _, _ in bare]))
        bare_cpu += [c for _, _, c in bare]
        release = work / f"release-{r}"
        date = (day + dt.timedelta(days=r)).isoformat()
        argv = [py, manage, "run_job", f"--logical-date={date}", "bench_stamp"]
        argv += [f"--until-file={release}"]
        results, spawn = stampede([argv] * args.procs, root, extra, release)
        spawn_times.append(spawn)
        codes = [c for _, c, _ in results]
        winners = [i for i, c in enumerate(codes) if c == 0]
        losers = [t for t, c, _ in results if c != 0]
        for c in codes:
            loser_codes[c] = loser_codes.get(c, 0) + 1
        loser_times.append(median([t for t, c, _ in results if c == 75]) if 75 in codes else 0)
        loser_cpu += [cpu for _, c, cpu in results if c == 75]
        ran = sqlite_rows(
            root,
            "SELECT COUNT(*) FROM ops_jobrun WHERE logical_date = ? AND outcome = 'succeeded'",
            (date,),
        )[0][0]
        executions.append(ran)
        if len(winners) != 1 or ran != 1 or codes.count(75) != args.procs - 1:
            bad_rounds.append((r, codes))
        print(
            f"round {r + 1:2}: bare x{args.procs} median {bare_times[-1]:.2f} s | run_job: "
            f"{len(winners)} ran, {codes.count(75)} exit 75, loser median {loser_times[-1]:.2f} s, "
            f"slowest {max(losers):.2f} s",
            flush=True,
        )
    server.close()
    lines = stamp.read_text().split("\n")
    starts = sum(1 for line in lines if line.startswith("start"))
    bare, losers = median(bare_times), median(loser_times)
    print(
        f"bare start-up alone: median {median(single) * 1000:.0f} ms; {args.procs} at once on "
        f"{os.cpu_count()} CPUs: median exit {bare:.2f} s (spawning them took "
        f"{median(spawn_times) * 1000:.0f} ms)"
    )
    print(f"run_job exit codes over all rounds: {dict(sorted(loser_codes.items()))}")
    print(
        f"CPU time per process (user + system), median: bare {median(bare_cpu) * 1000:.0f} ms, "
        f"loser {median(loser_cpu) * 1000:.0f} ms (ratio {median(loser_cpu) / median(bare_cpu):.2f}"
        "; the load of a shared machine moves wall time, hardly CPU time)"
    )
    ratios = [round(a / b, 2) for a, b in zip(loser_times, bare_times, strict=True)]
    print(f"per-round ratios loser/bare: {ratios}")
    goal(
        "P4",
        f"executions per round {sorted(set(executions))} (job bodies started: {starts}; "
        f"goal exactly 1 in each of {args.rounds} rounds)",
        executions == [1] * args.rounds and starts == args.rounds,
    )
    goal(
        "P4",
        f"losers exiting 75: {loser_codes.get(75, 0)} of {args.rounds * (args.procs - 1)}; "
        f"rounds with anything else: {len(bad_rounds)}",
        not bad_rounds,
    )
    ratio = losers / bare
    goal(
        "P4",
        f"median loser exit {losers:.2f} s vs {args.procs} bare start-ups at once {bare:.2f} s: "
        f"ratio {ratio:.2f} (goal <= 1.2)",
        ratio <= 1.2,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
