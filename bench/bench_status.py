"""job_status over a large run history on SQLite (goal: under 0.5 s for 1,000,000 rows).

    .venv/bin/python bench/bench_status.py [--rows 1000000] [--repeat 7] [--keep DIR]

Builds a migrated SQLite database in a temporary directory, fills ops_jobrun with `--rows`
runs of 12 jobs (a minutely job holds most of them, as it would in production; one job has a
long failure streak, one is running, one is ad hoc) plus one SlotClaim per slotted run, then
times `ops.monitors.status.collect()` + JSON rendering in-process (the part that grows with the
history) and the whole `manage.py job_status --json` process, several times each.
"""

import argparse
import datetime as dt
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CRON = """\
# Every minute: the bulk of the history.
* * * * *      --timeout=50s --name=tick sleep_demo --seconds=0
*/5 * * * *    --timeout=4m --name=five sleep_demo --seconds=0
*/15 * * * *   --timeout=10m --name=quarter sleep_demo --seconds=0
0 * * * *      --timeout=30m --name=hourly sleep_demo --seconds=0
# Fails every time lately.
30 * * * *     --timeout=30m --name=broken sleep_demo --seconds=0
0 3 * * *      --catch-up=3 --timeout=30m charge_daily
@daily         --name=clear-sessions --timeout=10m clearsessions
0 4 * * 1      --timeout=1h --name=weekly sleep_demo --seconds=0
0 5 1 * *      --timeout=1h --name=monthly sleep_demo --seconds=0
*/10 * * * *   --timeout=5m --name=running sleep_demo --seconds=0
@reboot        --name=warmup sleep_demo --seconds=0
"""
# job -> (period in minutes, share of the rows)
JOBS = {
    "tick": (1, 0.80),
    "five": (5, 0.08),
    "quarter": (15, 0.04),
    "hourly": (60, 0.02),
    "broken": (60, 0.02),
    "running": (10, 0.02),
    "adhoc-export": (30, 0.01),
    "charge_daily": (1440, 0.004),
    "clear-sessions": (1440, 0.004),
    "weekly": (10080, 0.001),
    "monthly": (43200, 0.001),
    "warmup": (20160, 0.0),
}


def env_for(directory: Path) -> dict:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"sqlite:///{directory / 'db.sqlite3'}",
        OPS_VAR_DIR=str(directory),
        OPS_CRONTAB_DIR=str(directory / "crontab.d"),
        TIME_ZONE="UTC",
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    return env


def fill(db: Path, rows: int, now: dt.datetime) -> dict:
    rng = random.Random(4)
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=OFF")
    counts = {}
    run_sql = (
        "INSERT INTO ops_jobrun (id, job, slot, logical_date, scheduled_at, outcome, note, "
        "exit_code, started_at, finished_at, duration, lag, host, pid, rid, command, output_tail) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
    )
    claim_sql = (
        "INSERT INTO ops_slotclaim (job, slot, logical_date, state, run_id, host, pid, "
        "started_at, heartbeat_at) VALUES (?,?,?,?,?,?,?,?,?)"
    )
    next_id = 1
    end = now.replace(second=0, microsecond=0)  # every job's latest slot ran
    for job, (period, share) in JOBS.items():
        n = max(1, int(rows * share)) if share else 0
        counts[job] = n
        batch, claims = [], []
        for i in range(n):
            at = end - dt.timedelta(minutes=period * (n - 1 - i))
            at = at.replace(minute=(at.minute // period) * period if period < 60 else at.minute)
            started = at + dt.timedelta(seconds=rng.uniform(0.2, 3))
            duration = rng.uniform(0.1, 5)
            outcome, code, note = "succeeded", 0, ""
            if job == "broken" and i > n - 300:
                outcome, code, note = "failed", 3, "CommandError: upstream down"
            elif rng.random() < 0.01:
                outcome, code, note = "failed", 1, "CommandError: boom"
            elif rng.random() < 0.005:
                outcome, code, note = "skipped", 75, "skipped: running since ..."
            if job == "running" and i == n - 1:
                outcome, code, duration = "running", None, None
            slot = "" if job == "adhoc-export" else at.strftime("%Y-%m-%d %H:%M")
            finished = None if duration is None else started + dt.timedelta(seconds=duration)
            row_id = next_id
            next_id += 1
            batch.append(
                (
                    row_id,
                    job,
                    slot,
                    at.date().isoformat() if slot else None,
                    at.isoformat(" ") if slot else None,
                    outcome,
                    note,
                    code,
                    started.isoformat(" "),
                    finished.isoformat(" ") if finished else None,
                    duration,
                    (started - at).total_seconds() if slot else None,
                    "bench-host",
                    1000 + i % 30000,
                    "",
                    job,
                    "ok\n" * 20,
                )
            )
            if slot and outcome != "skipped":
                beat = now if outcome == "running" else started
                claims.append(
                    (
                        job,
                        slot,
                        at.date().isoformat(),
                        outcome,
                        row_id,
                        "bench-host",
                        1,
                        started.isoformat(" "),
                        beat.isoformat(" "),
                    )
                )
        con.executemany(run_sql, batch)
        con.executemany(claim_sql.replace("INSERT", "INSERT OR REPLACE"), claims)
        con.commit()
    con.execute("ANALYZE")
    con.commit()
    total = con.execute("SELECT COUNT(*) FROM ops_jobrun").fetchone()[0]
    con.close()
    return {"total": total, "per_job": counts}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--keep", help="build the database in this directory and keep it")
    args = parser.parse_args()

    directory = Path(args.keep or tempfile.mkdtemp(prefix="cronops-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "crontab.d").mkdir(exist_ok=True)
    (directory / "crontab.d" / "bench.cron").write_text(CRON)
    env = env_for(directory)
    db = directory / "db.sqlite3"
    stamp = directory / "filled-at.txt"  # the clock the history was built for
    if not db.exists():
        stamp.write_text(dt.datetime.now(dt.UTC).isoformat())
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True
        )
        t0 = time.perf_counter()
        filled = fill(db, args.rows, dt.datetime.fromisoformat(stamp.read_text()))
        print(f"filled {filled['total']:,} runs in {time.perf_counter() - t0:.1f}s ({db})")

    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from zoneinfo import ZoneInfo

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ops.models import JobRun
    from ops.monitors import status, status_render
    from ops.schedule.crontabd import load_schedule

    total = JobRun.objects.count()
    # Evaluate as of one minute after the fill's clock, so the states are the designed ones
    # (every job ok but the failing, running, never-run ones) however long ago it was built.
    now = dt.datetime.fromisoformat(stamp.read_text()) + dt.timedelta(seconds=50)
    tz = ZoneInfo("UTC")
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        schedule = load_schedule()
        report = status.collect(schedule, now=now, tz=tz)
        json.dumps(status_render.to_json(report))
        times.append(time.perf_counter() - t0)
    with CaptureQueriesContext(connection) as queries:
        report = status.collect(load_schedule(), now=now, tz=tz)
    states = {s.job: s.state for s in report.jobs}

    cmd_times = []
    for _ in range(max(5, args.repeat)):
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "manage.py", "job_status", "--json"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        cmd_times.append(time.perf_counter() - t0)
        assert done.returncode in (0, 1), done.stderr
    startup = []
    for _ in range(len(cmd_times)):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "manage.py", "job_status", "--help"],
            cwd=REPO,
            env=env,
            capture_output=True,
        )
        startup.append(time.perf_counter() - t0)

    print(f"history: {total:,} JobRun rows, {len(report.jobs)} jobs, {len(queries)} queries")
    print(f"states: {states}")
    print(
        f"status logic (collect + JSON), {args.repeat} runs: "
        f"median {statistics.median(times) * 1000:.1f} ms, "
        f"min {min(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms, "
        f"first {times[0] * 1000:.1f} ms"
    )
    print(
        f"`manage.py job_status --json` process, {len(cmd_times)} runs: "
        f"median {statistics.median(cmd_times) * 1000:.0f} ms, min {min(cmd_times) * 1000:.0f} ms "
        f"(a bare `manage.py job_status --help` process: median "
        f"{statistics.median(startup) * 1000:.0f} ms)"
    )
    print(
        "start-up without the work (`manage.py job_status --help`): "
        f"min {min(startup) * 1000:.0f} ms"
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )


if __name__ == "__main__":
    main()
