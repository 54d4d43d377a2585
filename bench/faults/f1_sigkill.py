"""F1: SIGKILL at a random moment of a run, 100 times.

Each iteration is a new slot (`--logical-date`, a scheduled job that sleeps 0.3 s). The run is
killed with SIGKILL at a random moment: half of the kills uniformly over its usual wall time
(start-up included), half in the 0.5 s after the job's first line (the job, the record, the
final ping); then it is run again as cron would next time. Must hold: every slot ends with
exactly one success; the retry is never skipped (no lock or claim left stuck); no claim stays
`running`; the SQLite file passes `PRAGMA integrity_check`. Also counts where the kills landed.
Usage: python bench/faults/f1_sigkill.py [--runs 100] [--seed 1]
"""

import argparse
import datetime as dt
import fcntl
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _path  # noqa: F401
from _common import STAMP, deployed_copy, env, goal, median, run, sqlite_rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = deployed_copy(
        "0 3 * * * --no-ping bench_stamp --sleep=0.3\n", commands={"bench_stamp": STAMP}
    )
    stamp = Path(tempfile.mkdtemp(prefix="cronops-f1-")) / "stamp"
    extra = {"BENCH_STAMP": stamp}
    walls = []
    for i in range(3):
        code, _, _, wall = run(root, "run_job", f"--logical-date=1999-01-0{i + 1}", "bench_stamp")
        assert code == 0
        walls.append(wall)
    full = median(walls)
    print(f"a normal run takes {full:.2f} s")
    argv = [sys.executable, str(root / "manage.py"), "run_job"]
    phases = {"finished before the kill": 0}
    retry_codes, retries_done = {}, 0
    dates = []
    for i in range(args.runs):
        date = (dt.date(2000, 1, 1) + dt.timedelta(days=i)).isoformat()
        dates.append(date)
        proc = subprocess.Popen(
            [*argv, f"--logical-date={date}", "bench_stamp"],
            cwd=root,
            env=env(**extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if i % 2:
            # Every other kill lands in the job or after it (record, ping): wait for the job's
            # first line, then up to 0.5 s (the job sleeps 0.3 s).
            starts = stamp.read_text().count("start ") if stamp.exists() else 0
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                if stamp.exists() and stamp.read_text().count("start ") > starts:
                    break
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.5))
        else:
            time.sleep(rng.uniform(0, full))  # anywhere in the run, start-up included
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.returncode != -signal.SIGKILL:
            phases["finished before the kill"] += 1
        code, out, _, _ = run(
            root, "run_job", f"--logical-date={date}", "bench_stamp", extra_env=extra
        )
        retry_codes[code] = retry_codes.get(code, 0) + 1
        retries_done += "already done" in out
    rows = sqlite_rows(
        root,
        "SELECT logical_date, outcome, COUNT(*) FROM ops_jobrun WHERE logical_date >= '2000-01-01' "
        "GROUP BY logical_date, outcome",
    )
    per_date: dict[str, dict[str, int]] = {}
    for date, outcome, n in rows:
        per_date.setdefault(str(date), {})[outcome] = n
    successes = [per_date.get(d, {}).get("succeeded", 0) for d in dates]
    abandoned = sum(v.get("abandoned", 0) for v in per_date.values())
    claims = dict(sqlite_rows(root, "SELECT state, COUNT(*) FROM ops_slotclaim GROUP BY state"))
    integrity = sqlite_rows(root, "PRAGMA integrity_check")[0][0]
    lock = root / "var" / "lock" / "bench_stamp.lock"
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock_free = True
    except BlockingIOError:
        lock_free = False
    os.close(fd)
    bodies = stamp.read_text().count("end ")
    print(f"{args.runs} kills: {phases['finished before the kill']} runs had already finished")
    print(
        f"retry exit codes: {retry_codes}; retries that found the slot already done: {retries_done}"
    )
    print(f"dead attempts recorded as abandoned by the next run: {abandoned}")
    print(f"claims by state: {claims}; SQLite integrity_check: {integrity}; lock free: {lock_free}")
    print(
        f"job bodies completed: {bodies} for {args.runs} slots (a body that completed before "
        "the kill but was not recorded yet runs again: at-least-once; the command's own "
        "idempotency applies)"
    )
    goal(
        "F1",
        f"{args.runs} SIGKILLs: slots with exactly one success {successes.count(1)}/{args.runs}",
        successes == [1] * args.runs,
    )
    goal(
        "F1",
        f"no lock or claim stuck: retries exit {sorted(retry_codes)}, claims {claims}, lock free "
        f"{lock_free}, integrity {integrity}",
        set(retry_codes) == {0}
        and set(claims) == {"succeeded"}
        and lock_free
        and integrity == "ok",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
