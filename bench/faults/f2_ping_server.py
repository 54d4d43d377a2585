"""F2: a broken healthchecks server never changes a job's exit code or its history.

For each server fault (connection refused, black-holed SYN, HTTP 500, HTTP 429, answers after
30 s, TLS with a self-signed certificate) runs a succeeding and a failing (exit 3) job, and
compares the exit code and the recorded (outcome, exit code, note) with the same two runs
against a healthy server. Must hold: identical every time; no run outlives start-up + the ping
budget (OPS_PING_BUDGET_SECONDS, 10 s) by more than 1 s.
Usage: python bench/faults/f2_ping_server.py
"""

import datetime as dt

import _path  # noqa: F401
from _common import STAMP, FaultServer, deployed_copy, goal, run, sqlite_rows

MODES = ["ok", "refuse", "blackhole", "500", "429", "slow", "tls"]
BUDGET = 10.0


def main() -> int:
    root = deployed_copy("", commands={"bench_stamp": STAMP})
    day = dt.date(2001, 1, 1)
    seen, walls, requests = {}, {}, {}
    for mode in MODES:
        server = FaultServer(mode, delay=30)
        extra = {"HEALTHCHECKS_PING_URL": server.url, "HEALTHCHECKS_PING_KEY": "key"}
        for exit_code in (0, 3):
            day += dt.timedelta(days=1)
            code, _, err, wall = run(
                root,
                "run_job",
                f"--logical-date={day}",
                "bench_stamp",
                f"--exit={exit_code}",
                extra_env=extra,
                timeout=120,
            )
            row = sqlite_rows(
                root,
                "SELECT outcome, exit_code, note FROM ops_jobrun WHERE logical_date = ?",
                (day.isoformat(),),
            )
            seen[mode, exit_code] = (code, row)
            walls[mode, exit_code] = wall
            if mode != "ok":
                warnings = [line for line in err.splitlines() if "ping" in line]
                print(
                    f"{mode:9} job exit {exit_code}: run_job exit {code} in {wall:5.2f} s; "
                    f"{warnings}"
                )
        requests[mode] = len(server.log)
        server.close()
    print(f"requests that reached each server: {requests}")
    base = walls["ok", 0]
    for mode in MODES[1:]:
        same = all(seen[mode, c] == seen["ok", c] for c in (0, 3))
        slowest = max(walls[mode, c] for c in (0, 3))
        goal(
            "F2",
            f"{mode:9}: exit codes and history {'identical' if same else 'DIFFER'} "
            f"{[seen[mode, c] for c in (0, 3)] if not same else ''}; slowest run {slowest:.1f} s "
            f"(healthy {base:.1f} s, budget {BUDGET:g} s)",
            same and slowest <= base + BUDGET + 1,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
