"""F8: issue 9's invariant, explored at length: tests/test_property.py's state machine (the real
runner in-process: scheduled runs at random clock times around Berlin's repeated autumn hour,
by-hand runs with random option spellings and positions, --force, --name, schedule edits,
catch-up values, failing commands, runs killed between claim and record, and scheduled runs
started by the warm dispatcher, issue 33: `dispatch()` picks the due jobs and their arguments)
with many more examples, once on SQLite and once on PostgreSQL (skipped without
CRONOPS_TEST_PG_URL or var/ci/env.sh).

Must hold: no failure (every succeeded claim executed under it with its date; no slot completed
twice without --force; no claim left running without a live holder; a scheduled run serves the
slot cron fired; the dispatcher starts each job cron fires in its minute once, and no other).
Prints the examples, steps, runs and executions explored, and the dispatcher's share.

Usage: python bench/faults/f8_property.py [--examples 500] [--steps 25] [--quick]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _path  # noqa: F401
from _common import REPO, exit_status, goal, pg_url

TEST = "tests/test_property.py"


def explore(label: str, database_url: str, examples: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stats_file = Path(tmp) / "stats.json"
        environ = dict(
            os.environ,
            DATABASE_URL=database_url,
            CRONOPS_PROPERTY_EXAMPLES=str(examples),
            CRONOPS_PROPERTY_STEPS=str(steps),
            CRONOPS_PROPERTY_STATS=str(stats_file),
            CRONOPS_PROPERTY_RANDOM="1",  # new examples each run (make test's are fixed)
        )
        started = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-m",
                "inprocess_db",
                TEST,
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
            ],
            cwd=REPO,
            env=environ,
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - started
        stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    failures = 0 if proc.returncode == 0 else 1
    if failures:
        print(proc.stdout[-6000:], proc.stderr[-2000:])
    outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(stats.get("outcomes", {}).items()))
    print(
        f"{label}: {stats.get('examples', 0)} examples, {stats.get('steps', 0)} steps, "
        f"{stats.get('runs', 0)} runs of the runner ({outcomes}), "
        f"{stats.get('executions', 0)} executions of the command, {seconds:.0f} s; "
        f"the dispatcher: {stats.get('dispatches', 0)} minutes, "
        f"{stats.get('dispatched', 0)} run_jobs started, "
        f"{stats.get('dispatched_executions', 0)} executions",
        flush=True,
    )
    goal(
        "F8",
        f"{label}: {stats.get('examples', 0)} examples / {stats.get('steps', 0)} steps, "
        f"{failures} failures (must be 0)",
        failures == 0 and stats.get("examples", 0) >= examples,
    )
    goal(
        "F8",
        f"{label}: the dispatcher's runs executed the job {stats.get('dispatched_executions', 0)}"
        " times (must be > 0)",
        stats.get("dispatched_executions", 0) > 0,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=500)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--databases", default="sqlite,pg")
    parser.add_argument("--quick", action="store_true", help="50 examples")
    args = parser.parse_args()
    examples = 50 if args.quick else args.examples
    for name in args.databases.split(","):
        if name == "sqlite":
            explore("SQLite", "", examples, args.steps)
        elif name == "pg":
            url = pg_url()
            if not url:
                print("PostgreSQL: skipped (no CRONOPS_TEST_PG_URL; bash .ci/services.sh)")
                continue
            explore("PostgreSQL", url, examples, args.steps)
    return exit_status()


if __name__ == "__main__":
    raise SystemExit(main())
