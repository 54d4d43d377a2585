"""F2: a broken monitor server never changes a job's exit code or its history.

For each server fault (connection refused, black-holed SYN, HTTP 500, HTTP 429, answers after
30 s, TLS with a self-signed certificate) runs a succeeding and a failing (exit 3) job with
healthchecks.io pings to that server, then with Sentry check-ins to it (issue 30), and for the
black hole and the slow server with both monitors at once; compares the exit code and the
recorded (outcome, exit code, note) with the same two runs against a healthy server. Must hold:
identical every time; no run outlives the healthy run + the ping budget
(OPS_PING_BUDGET_SECONDS, 10 s, which both monitors share) by more than 1 s.
Usage: python bench/faults/f2_ping_server.py
"""

import datetime as dt

import _path  # noqa: F401
from _common import STAMP, FaultServer, deployed_copy, goal, run, sqlite_rows

MODES = ["ok", "refuse", "blackhole", "500", "429", "slow", "tls"]
BOTH = ["blackhole", "slow"]  # both monitors at once: one budget between them
BUDGET = 10.0


def monitor_env(monitor: str, url: str) -> dict:
    scheme, _, rest = url.partition("://")
    dsn = f"{scheme}://{'k' * 32}@{rest.rstrip('/')}/1"
    hc = {"HEALTHCHECKS_PING_URL": url, "HEALTHCHECKS_PING_KEY": "key"}
    return {"healthchecks": hc, "sentry": {"SENTRY_DSN": dsn}, "both": {**hc, "SENTRY_DSN": dsn}}[
        monitor
    ]


def main() -> int:
    root = deployed_copy("", commands={"bench_stamp": STAMP})
    day = dt.date(2001, 1, 1)
    seen, walls, requests = {}, {}, {}
    cases = [("healthchecks", m) for m in MODES] + [("sentry", m) for m in MODES]
    cases += [("both", m) for m in ["ok", *BOTH]]
    for monitor, mode in cases:
        server = FaultServer(mode, delay=30)
        extra = monitor_env(monitor, server.url)
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
            seen[monitor, mode, exit_code] = (code, row)
            walls[monitor, mode, exit_code] = wall
            if mode != "ok":
                warnings = [line for line in err.splitlines() if "ping" in line or "Sentry" in line]
                print(
                    f"{monitor:12} {mode:9} job exit {exit_code}: run_job exit {code} in "
                    f"{wall:5.2f} s; {warnings}"
                )
        requests[monitor, mode] = len(server.log)
        server.close()
    print(f"requests that reached each server: {requests}")
    for monitor, mode in cases:
        if mode == "ok":
            continue
        base = walls[monitor, "ok", 0]
        same = all(seen[monitor, mode, c] == seen[monitor, "ok", c] for c in (0, 3))
        slowest = max(walls[monitor, mode, c] for c in (0, 3))
        shown = [seen[monitor, mode, c] for c in (0, 3)] if not same else ""
        goal(
            "F2",
            f"{monitor:12} {mode:9}: exit codes and history "
            f"{'identical' if same else 'DIFFER'} {shown}; slowest run {slowest:.1f} s "
            f"(healthy {base:.1f} s, budget {BUDGET:g} s)",
            same and slowest <= base + BUDGET + 1,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
