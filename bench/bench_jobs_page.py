"""P8: the admin's jobs page over 50 jobs and a long history, on SQLite and PostgreSQL.

    .venv/bin/python bench/bench_jobs_page.py [--rows 1000000] [--repeat 7] [--backends sqlite,pg]
                                              [--keep DIR]

Builds a migrated database per backend (SQLite in a temporary directory; a throwaway database
on the PostgreSQL of CRONOPS_TEST_PG_URL, dropped afterwards), fills ops_jobrun with `--rows`
runs of 50 jobs (two minutely jobs hold most of them, as in production; some jobs fail lately,
one is running, two are ad hoc) plus one SlotClaim per slotted attempt, then, in a child
process per backend, times the server side of `GET /admin/ops/job/` (the Django test client,
logged in: view, queries and template, no network) and counts its queries; the same for one
job's calendar page (the busiest job: 90 days of minutely runs). Goal: < 300 ms on both, and a
query count that does not depend on the number of runs (it is also measured on a history a
tenth the size).
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
import uuid
from pathlib import Path

from cronsim import CronSim

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from ops.schedule.slots import make_slot  # noqa: E402 (plain Python, no Django)

GOAL_MS = 300


def jobs() -> list[tuple[str, str | None, int, float]]:
    """(name, schedule or None for ad hoc, period in minutes, share of the rows): 50 jobs."""
    table = [("tick-1", "* * * * *", 1, 0.36), ("tick-2", "* * * * *", 1, 0.36)]
    table += [(f"five-{i}", "*/5 * * * *", 5, 0.024) for i in range(5)]
    table += [(f"quarter-{i}", "*/15 * * * *", 15, 0.01) for i in range(8)]
    table += [(f"hourly-{i}", f"{i} * * * *", 60, 0.004) for i in range(15)]
    table += [(f"daily-{i}", f"{i} 3 * * *", 1440, 0.0008) for i in range(16)]
    table += [("weekly", "0 4 * * 1", 10080, 0.0002), ("monthly", "0 5 1 * *", 43200, 0.0001)]
    table += [("export", None, 30, 0.01), ("reindex", None, 1440, 0.0009)]
    assert len(table) == 50
    return table


def cron_text() -> str:
    return "".join(
        f"{expr}  --timeout=10m --name={name} sleep_demo --seconds=0\n"
        for name, expr, _, _ in jobs()
        if expr
    )


def generate(rows: int, now: dt.datetime):
    """Yield ("run", tuple) and ("claim", tuple) rows, runs in start order per job."""
    rng = random.Random(8)  # start lags and durations
    end = now.replace(second=0, microsecond=0)
    next_id = 1
    for name, expr, period, share in jobs():
        n = max(1, int(rows * share))
        if expr:  # the job's own fire times, the newest at or before `now`
            fires = CronSim(expr, end + dt.timedelta(minutes=1), reverse=True)
            times = [next(fires) for _ in range(n)][::-1]
        else:  # an ad-hoc job, run by hand every `period` minutes
            times = [end - dt.timedelta(minutes=period * (n - 1 - i)) for i in range(n)]
        for i, at in enumerate(times):
            started = at + dt.timedelta(seconds=rng.uniform(0.2, 3))
            duration = rng.uniform(0.1, 5)
            outcome, code, note = "succeeded", 0, ""
            # Outcomes drawn by (job, age): the newest runs of every job are the same whatever
            # the history's length, so the two sizes measured show the same states.
            age = n - 1 - i
            draw = random.Random(f"{name}:{age}").random()
            if name.startswith("hourly-1") and age < 40:
                outcome, code, note = "failed", 3, "CommandError: upstream down"
            elif draw < 0.01:
                outcome, code, note = "failed", 1, "CommandError: boom"
            elif draw > 0.995:
                outcome, code, note = "skipped", 75, "skipped: running since ..."
            if name == "quarter-0" and i == n - 1:
                outcome, code, duration = "running", None, None
            # The key the runner writes (ops/schedule/slots.py): the date for a daily job, else the
            # fire time with its UTC offset.
            slot = "" if expr is None else make_slot(expr, at).key
            finished = None if duration is None else started + dt.timedelta(seconds=duration)
            yield (
                "run",
                (
                    next_id,
                    name,
                    slot,
                    at.date() if slot else None,
                    at if slot else None,
                    outcome,
                    note,
                    code,
                    started,
                    finished,
                    duration,
                    (started - at).total_seconds() if slot else None,
                    "bench-host",
                    1000 + i % 30000,
                    "",
                    name,
                    "ok\n" * 20,
                ),
            )
            if slot and outcome != "skipped":
                beat = now if outcome == "running" else started
                yield (
                    "claim",
                    (name, slot, at.date(), outcome, next_id, "bench-host", 1, started, beat),
                )
            next_id += 1


RUN_COLUMNS = (
    "id, job, slot, logical_date, scheduled_at, outcome, note, exit_code, started_at, "
    "finished_at, duration, lag, host, pid, rid, command, output_tail"
)
CLAIM_COLUMNS = "job, slot, logical_date, state, run_id, host, pid, started_at, heartbeat_at"


def fill_sqlite(db: Path, rows: int, now: dt.datetime) -> None:
    def value(v):
        if isinstance(v, dt.datetime):
            return v.astimezone(dt.UTC).replace(tzinfo=None).isoformat(" ")
        if isinstance(v, dt.date):
            return v.isoformat()
        return v

    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=OFF")
    runs, claims = [], []
    run_sql = f"INSERT INTO ops_jobrun ({RUN_COLUMNS}) VALUES ({','.join('?' * 17)})"
    claim_sql = (
        f"INSERT OR REPLACE INTO ops_slotclaim ({CLAIM_COLUMNS}) VALUES ({','.join('?' * 9)})"
    )
    for kind, row in generate(rows, now):
        (runs if kind == "run" else claims).append(tuple(map(value, row)))
        if len(runs) >= 50_000:
            con.executemany(run_sql, runs)
            con.executemany(claim_sql, claims)
            runs, claims = [], []
    con.executemany(run_sql, runs)
    con.executemany(claim_sql, claims)
    con.commit()
    con.execute("ANALYZE")
    con.commit()
    con.close()


def fill_pg(url: str, rows: int, now: dt.datetime) -> None:
    import psycopg

    with psycopg.connect(url) as con:
        with con.cursor() as cur:
            claims = []
            with cur.copy(f"COPY ops_jobrun ({RUN_COLUMNS}) FROM STDIN") as runs:
                for kind, row in generate(rows, now):
                    if kind == "run":
                        runs.write_row(row)
                    else:
                        claims.append(row)
            with cur.copy(f"COPY ops_slotclaim ({CLAIM_COLUMNS}) FROM STDIN") as copy:
                for row in claims:
                    copy.write_row(row)
            cur.execute(
                "SELECT setval(pg_get_serial_sequence('ops_jobrun', 'id'), MAX(id)) FROM ops_jobrun"
            )
        con.commit()
        con.autocommit = True
        con.execute("VACUUM ANALYZE ops_jobrun")
        con.execute("VACUUM ANALYZE ops_slotclaim")


def env_for(directory: Path, url: str) -> dict:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        OPS_VAR_DIR=str(directory),
        OPS_CRONTAB_DIR=str(directory / "crontab.d"),
        TIME_ZONE="UTC",
        DJANGO_SETTINGS_MODULE="config.settings",
        SECRET_KEY="bench",
        ALLOWED_HOSTS="testserver",  # the test client's host (no setup_test_environment(): it
        # instruments template rendering, which would be measured too)
    )
    return env


def measure(now: dt.datetime, repeat: int) -> dict:
    """In the child process: time GET /admin/ops/job/ and one calendar; count queries."""
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    import time_machine
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from ops.models import JobRun

    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    result = {"runs": JobRun.objects.count()}
    with time_machine.travel(now, tick=False):
        for label, url in (("jobs", "/admin/ops/job/"), ("calendar", "/admin/ops/job/tick-1/")):
            times, cpu = [], []
            for _ in range(repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                response = client.get(url)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                assert response.status_code == 200, response.status_code
            with CaptureQueriesContext(connection) as queries:
                html = client.get(url).content.decode()
            result[label] = {
                "median_ms": statistics.median(times) * 1000,
                "cpu_ms": statistics.median(cpu) * 1000,
                "min_ms": min(times) * 1000,
                "first_ms": times[0] * 1000,
                "queries": len(queries),
            }
            if label == "jobs":
                result["rows"] = html.count('<tr class="cronops-job"')
                result["states"] = {
                    s: html.count(f'data-state="{s}"')
                    for s in ("ok", "running", "failing", "overdue", "never run")
                }
    return result


def build(backend: str, rows: int, directory: Path, now: dt.datetime, pg_base: str):
    """(url, cleanup) of a migrated, filled database."""
    (directory / "crontab.d").mkdir(parents=True, exist_ok=True)
    (directory / "crontab.d" / "bench.cron").write_text(cron_text())
    if backend == "sqlite":
        db = directory / "db.sqlite3"
        url = f"sqlite:///{db}"
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0"],
            cwd=REPO,
            env=env_for(directory, url),
            check=True,
        )
        fill_sqlite(db, rows, now)
        return url, lambda: None
    import psycopg

    name = f"cronops_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_base, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    url = pg_base.rsplit("/", 1)[0] + "/" + name

    def drop():
        with psycopg.connect(pg_base, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0"],
            cwd=REPO,
            env=env_for(directory, url),
            check=True,
        )
        fill_pg(url, rows, now)
    except BaseException:
        drop()
        raise
    return url, drop


def run_backend(backend: str, rows: int, repeat: int, pg_base: str) -> dict:
    directory = Path(tempfile.mkdtemp(prefix=f"cronops-bench-page-{backend}-"))
    # 50 s past the hour: both history sizes are measured at the same point of every
    # schedule (whether a */15 job's running slot is due yet decides one query).
    now = dt.datetime.now(dt.UTC).replace(minute=0, second=50, microsecond=0)
    t0 = time.perf_counter()
    url, cleanup = build(backend, rows, directory, now, pg_base)
    filled = time.perf_counter() - t0
    try:
        child = subprocess.run(
            [sys.executable, __file__, "--measure", now.isoformat(), "--repeat", str(repeat)],
            cwd=REPO,
            env=env_for(directory, url),
            capture_output=True,
            text=True,
        )
        if child.returncode:
            raise SystemExit(f"{backend}: the measuring process failed:\n{child.stderr}")
        result = json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        cleanup()
    result["fill_s"] = filled
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--backends", default="sqlite,pg")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(dt.datetime.fromisoformat(args.measure), args.repeat)))
        return

    pg_base = os.environ.get("CRONOPS_TEST_PG_URL", "")
    print("load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    for backend in args.backends.split(","):
        if backend == "pg" and not pg_base:
            print("P8 PostgreSQL: skipped (no CRONOPS_TEST_PG_URL; bash .ci/services.sh): NOT met")
            continue
        name = {"sqlite": "SQLite", "pg": "PostgreSQL"}[backend]
        big = run_backend(backend, args.rows, args.repeat, pg_base)
        small = run_backend(backend, max(args.rows // 10, 1000), 3, pg_base)
        jobs_ms, cal_ms = big["jobs"]["median_ms"], big["calendar"]["median_ms"]
        print(
            f"{name}: {big['runs']:,} runs (filled in {big['fill_s']:.0f} s), {big['rows']} "
            f"job rows, states {big['states']}"
        )
        print(
            f"{name}: jobs page median {jobs_ms:.0f} ms (min {big['jobs']['min_ms']:.0f}, first "
            f"{big['jobs']['first_ms']:.0f}; CPU of this process {big['jobs']['cpu_ms']:.0f} ms), "
            f"{big['jobs']['queries']} queries; with "
            f"{small['runs']:,} runs: {small['jobs']['median_ms']:.0f} ms, "
            f"{small['jobs']['queries']} queries"
        )
        print(
            f"{name}: calendar of tick-1 (minutely) median {cal_ms:.0f} ms (min "
            f"{big['calendar']['min_ms']:.0f}; CPU of this process "
            f"{big['calendar']['cpu_ms']:.0f} ms), {big['calendar']['queries']} queries; with "
            f"{small['runs']:,} runs: {small['calendar']['median_ms']:.0f} ms"
        )
        verdict = "met" if jobs_ms < GOAL_MS else "NOT met"
        print(
            f"P8 jobs page, 50 jobs, {big['runs']:,} runs, {name}: median {jobs_ms:.0f} ms "
            f"(goal < {GOAL_MS} ms): {verdict}"
        )
        same = big["jobs"]["queries"] == small["jobs"]["queries"]
        print(
            f"P8 jobs page queries, {name}: {big['jobs']['queries']} with {big['runs']:,} runs, "
            f"{small['jobs']['queries']} with {small['runs']:,} (goal: the same): "
            + ("met" if same else "NOT met")
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )


if __name__ == "__main__":
    main()
