"""P-dispatch (issue 33): a minute with N due no-op jobs, as N cold `run_job`s (per-job lines)
and as one warm `run_due_jobs` (install_crontab --dispatcher), in a fresh `startproject`
(bench_fork.py's, with `ops` adopted and migrated).

- Instructions (callgrind, as bench_fork.py --count counts them: valgrind's own count, which
  does not move with the machine's load), summed over every process of the minute: the
  dispatcher, its forks, each run_job and each job's child. A forked process is counted from
  the fork on (`--zero-before=PyOS_AfterFork_Child`; without it callgrind counts what the
  child inherited again). Goal: dispatcher(N) <= 1.1 cold run_jobs + N x 0.04 of one.
- Memory: the minute's peak total Pss (/proc/<pid>/smaps_rollup) of the processes running in
  the project directory, sampled while the N jobs wait for a file (so all are alive at once).
  One cold process = one cold fire alone (run_job and its job's child). Goal: dispatcher(N)
  <= 1 cold process + N x 0.3 of one. The N cold run_jobs at once are shown beside it.

Usage: python bench/bench_dispatch.py [--n 1,5,20] [--no-count] [--no-memory]
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import env, goal, median
from bench_fork import OPS, startproject

HOLD = """\
import time
from pathlib import Path

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Waits for the file `release` (at most 120 s): the memory bench's job."

    def handle(self, *args, **options):
        deadline = time.monotonic() + 120
        while not Path("release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
"""


def write_jobs(root: Path, n: int, command: str) -> list[str]:
    names = [f"job{i:02d}" for i in range(1, n + 1)]
    (root / "crontab.d" / "10-nightly.cron").write_text(
        "".join(f"* * * * * --no-ping --name={name} {command}\n" for name in names)
    )
    return names


def forget_runs(root: Path) -> None:
    """A minute of its own: no history, no claim, and no dispatcher state (the next
    run_due_jobs is a first run, not a second dispatch of a minute that starts nothing)."""
    import sqlite3

    (root / "var" / "lock" / "run_due_jobs.state").unlink(missing_ok=True)

    con = sqlite3.connect(root / "db.sqlite3")
    con.execute("DELETE FROM ops_slotclaim")
    con.execute("DELETE FROM ops_jobrun")
    con.commit()
    con.close()


def counted(root: Path, argv: list[str], processes: int) -> tuple[int, int]:
    """(total instructions of `manage.py argv` and every process it forked, process count)."""
    out = Path(tempfile.mkdtemp(prefix="cg-"))
    try:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
             "--zero-before=PyOS_AfterFork_Child", sys.executable, "manage.py", *argv],
            cwd=root, env=env(**OPS), capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            sys.exit(f"{argv} under valgrind exited {done.returncode}:\n{done.stderr[-2000:]}")
        # The dispatcher's runs are not its children: wait for every process's file to close.
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            files = list(out.glob("cg.*"))
            totals = [re.search(r"^totals: (\d+)", f.read_text(), re.M) for f in files]
            if len(files) >= processes and all(totals):
                return sum(int(t.group(1)) for t in totals if t), len(files)
            time.sleep(0.2)
        sys.exit(f"{argv}: {len(files)} of {processes} processes finished under valgrind")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def count(root: Path, ns: list[int], repeats: int) -> None:
    names = write_jobs(root, max(ns), "noop")
    print("instructions (callgrind, every process of the minute), median of", repeats)
    colds = []
    for _ in range(repeats):
        forget_runs(root)
        colds.append(counted(root, ["run_job", names[0]], 2)[0])  # run_job + its job
    cold = median(colds)
    print(f"  one cold `run_job job01`: {cold / 1e6:.1f} M (run_job and the job's child)")
    for n in ns:
        write_jobs(root, n, "noop")
        totals = []
        for _ in range(repeats):
            forget_runs(root)
            # the dispatcher, and per job: the fork that exits, run_job, the job's child
            totals.append(counted(root, ["run_due_jobs"], 1 + 3 * n)[0])
        total = median(totals)
        bound = 1.1 * cold + n * 0.04 * cold
        per_job = (total - cold) / n
        print(
            f"  N={n:2}: dispatcher {total / 1e6:8.1f} M = {total / cold:.3f} cold "
            f"({per_job / 1e6:.1f} M = {per_job / cold:.3f} cold a job beyond one); "
            f"N cold run_jobs {n * cold / 1e6:.1f} M; goal <= {bound / 1e6:.1f} M"
        )
        goal(
            "P-dispatch",
            f"instructions, N={n}: {total / cold:.3f} cold run_jobs (goal <= {bound / cold:.2f})",
            total <= bound,
        )


def pss_of_minute(root: Path) -> tuple[int, int]:
    """(total Pss in kB, process count) of the processes whose working directory is `root`."""
    total = count_ = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if Path(proc / "cwd").resolve() != root:
                continue
            text = (proc / "smaps_rollup").read_text()
        except OSError:
            continue
        found = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
        if found:
            total += int(found.group(1))
            count_ += 1
    return total, count_


def peak_memory(root: Path, starts: list[list[str]], jobs: int) -> tuple[int, int]:
    """Start `starts` (manage.py argv each) at once; sample until `jobs` job children wait;
    return the peak (total Pss kB, processes then); then release the jobs."""
    release = root / "release"
    release.unlink(missing_ok=True)
    forget_runs(root)
    procs = [
        subprocess.Popen([sys.executable, "manage.py", *argv], cwd=root, env=env(**OPS))
        for argv in starts
    ]
    peak, at = (0, 0), time.monotonic()
    deadline = at + 120
    while time.monotonic() < deadline:
        sample = pss_of_minute(root.resolve())
        peak = max(peak, sample)
        if sample[1] >= 2 * jobs:  # every job's run_job and child are up
            break
        time.sleep(0.05)
    # a few more samples once all are up
    for _ in range(10):
        peak = max(peak, pss_of_minute(root.resolve()))
        time.sleep(0.05)
    release.write_text("")
    for p in procs:
        p.wait(timeout=120)
    deadline = time.monotonic() + 120
    while pss_of_minute(root.resolve())[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    return peak


def memory(root: Path, ns: list[int]) -> None:
    commands = root / "shop" / "management" / "commands"
    (commands / "hold.py").write_text(HOLD)
    names = write_jobs(root, max(ns), "hold")
    one, procs = peak_memory(root, [["run_job", names[0]]], 1)
    print(f"peak total Pss of the minute (kB); one cold fire: {one} kB in {procs} processes")
    for n in ns:
        names = write_jobs(root, n, "hold")
        cold, cold_procs = peak_memory(root, [["run_job", name] for name in names], n)
        warm, warm_procs = peak_memory(root, [["run_due_jobs"]], n)
        bound = one + n * 0.3 * one
        print(
            f"  N={n:2}: dispatcher {warm} kB in {warm_procs} processes = {warm / one:.2f} "
            f"cold; N cold run_jobs {cold} kB in {cold_procs} = {cold / one:.2f}; goal <= "
            f"{bound:.0f} kB"
        )
        goal(
            "P-dispatch",
            f"memory, N={n}: {warm / one:.2f} cold processes (goal <= {bound / one:.2f})",
            warm <= bound,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", default="1,5,20")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-count", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    root = startproject()
    if not args.no_count:
        if not shutil.which("valgrind"):
            sys.exit("counting needs valgrind (Debian: apt install valgrind), or --no-count")
        count(root, ns, args.repeats)
    if not args.no_memory:
        memory(root, ns)


if __name__ == "__main__":
    main()
