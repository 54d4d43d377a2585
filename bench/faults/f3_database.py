"""F3: the database unreachable at start, and going away in the middle of a run.

Cases (PostgreSQL from .ci/services.sh; the "mid-run" cases put a TCP proxy of ours between
the runner and the server and cut it, so the shared server is never touched):
  start/sqlite    DATABASE_URL is a file that is not a SQLite database
  start/pg        DATABASE_URL points at a port where nothing listens
  mid-run/gone    the proxy is cut while the job runs and stays down
  mid-run/blip    the job's backend is killed (pg_terminate_backend) while the job runs; the
                  server stays up
Must hold: one clear `cronops: error:` line and no traceback, a /fail ping, a non-zero exit,
nothing recorded wrongly (no success for a run that could not be recorded; a blip is recorded
as what happened); after `gone`, the next run records the lost attempt as abandoned and runs.
Usage: python bench/faults/f3_database.py
"""

import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import _path  # noqa: F401
from _common import (
    STAMP,
    FaultServer,
    PgDatabase,
    TcpProxy,
    deployed_copy,
    env,
    goal,
    pg_url,
    run,
)

MANAGE = [sys.executable]


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("cronops: error")]


def check(case, code, stderr, pings, expect_code=None) -> bool:
    lines = errors(stderr)
    fails = [p for p, _ in pings if "/fail" in p]
    ok = (
        len(lines) == 1
        and "Traceback" not in stderr
        and len(fails) == 1
        and (code != 0 if expect_code is None else code == expect_code)
    )
    print(f"{case}: exit {code}; {lines}; pings {[p.split('?')[0] for p, _ in pings]}")
    if not ok:
        print(stderr)
    return ok


def main() -> int:
    server_url = pg_url()
    if not server_url:
        goal("F3", "PostgreSQL not available: run `bash .ci/services.sh` first", False)
        return 1
    pg = PgDatabase(server_url)
    stamp = Path(tempfile.mkdtemp(prefix="cronops-f3-")) / "stamp"
    try:
        root = deployed_copy(
            "0 3 * * * bench_stamp --sleep=3\n",
            env_lines=f"DATABASE_URL={pg.url}\n",
            commands={"bench_stamp": STAMP},
        )
        server = FaultServer("ok")
        pings = {"HEALTHCHECKS_PING_URL": server.url, "HEALTHCHECKS_PING_KEY": "key"}

        garbage = root / "garbage.sqlite3"
        garbage.write_bytes(b"this is not a database\n" * 100)
        code, _, err, _ = run(
            root,
            "run_job",
            "bench_stamp",
            extra_env={**pings, "DATABASE_URL": f"sqlite:///{garbage}"},
        )
        goal("F3", "unreachable at start (SQLite)", check("start/sqlite", code, err, server.log))

        server.log.clear()
        dead = "postgres://postgres@127.0.0.1:9/nowhere"
        code, _, err, _ = run(
            root, "run_job", "bench_stamp", extra_env={**pings, "DATABASE_URL": dead}
        )
        goal("F3", "unreachable at start (PostgreSQL)", check("start/pg", code, err, server.log))

        parts = urllib.parse.urlsplit(pg.url)
        proxy = TcpProxy(parts.hostname, parts.port)
        via_proxy = pg.url.replace(f":{parts.port}/", f":{proxy.port}/")
        server.log.clear()
        stamp.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [
                *MANAGE,
                str(root / "manage.py"),
                "run_job",
                "--logical-date=2001-01-01",
                "bench_stamp",
            ],
            cwd=root,
            env=env(**pings, DATABASE_URL=via_proxy, BENCH_STAMP=stamp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while not (stamp.exists() and "start" in stamp.read_text()):
            time.sleep(0.05)
        proxy.cut()
        _, err = proc.communicate(timeout=120)
        runs = pg.query("SELECT outcome FROM ops_jobrun WHERE logical_date = '2001-01-01'")
        claims = pg.query("SELECT state FROM ops_slotclaim WHERE logical_date = '2001-01-01'")
        print(f"mid-run/gone: history {runs}, claim {claims}")
        ok = check("mid-run/gone", proc.returncode, err, server.log)
        goal(
            "F3",
            "database gone mid-run: no success recorded for the unrecorded run",
            ok and runs == [("running",)] and claims == [("running",)],
        )
        code, _, err, _ = run(root, "run_job", "--logical-date=2001-01-01", "bench_stamp")
        runs = pg.query(
            "SELECT outcome FROM ops_jobrun WHERE logical_date = '2001-01-01' ORDER BY id"
        )
        print(f"the next run: exit {code}; history {runs}; {err.strip()!r}")
        goal(
            "F3",
            "the next run records the lost attempt as abandoned and runs the slot",
            code == 0 and runs == [("abandoned",), ("succeeded",)],
        )

        server.log.clear()
        stamp.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [
                *MANAGE,
                str(root / "manage.py"),
                "run_job",
                "--logical-date=2001-01-02",
                "bench_stamp",
            ],
            cwd=root,
            env=env(**pings, BENCH_STAMP=stamp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while not (stamp.exists() and "start" in stamp.read_text()):
            time.sleep(0.05)
        killed = PgDatabase.__new__(PgDatabase)
        killed.url = server_url
        killed = killed.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (pg.name,),
        )
        _, err = proc.communicate(timeout=120)
        runs = pg.query("SELECT outcome FROM ops_jobrun WHERE logical_date = '2001-01-02'")
        print(
            f"mid-run/blip: {len(killed)} backend(s) terminated; exit {proc.returncode}; history "
            f"{runs}; pings {[p.split('?')[0] for p, _ in server.log]}; stderr {err.strip()!r}"
        )
        goal(
            "F3",
            "backend killed mid-run, server up: the runner reconnects and records the success",
            proc.returncode == 0 and runs == [("succeeded",)] and "Traceback" not in err,
        )
        server.close()
    finally:
        pg.drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
