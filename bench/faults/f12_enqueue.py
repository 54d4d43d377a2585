"""F12: SIGKILL of run_job at random moments of an enqueue (`--enqueue`), on SQLite and PostgreSQL.

A Django task line with `--enqueue` on django-tasks-db's database backend, in the claims' own
database: the task's row is written in the transaction that records the slot done. Each
iteration is a new slot (`--logical-date`); run_job is killed with SIGKILL at a random moment:
half of the kills uniformly over its usual wall time (start-up included), half in the moments
after it reaches the backend's enqueue (the INSERT, the record, the commit, the exit; whether
the kill came before or after the commit is read from the history); then the
slot is run again as cron's next fire would. At the end django-tasks-db's worker (`db_worker
--batch`) runs every task, which appends its date to a file.

Must hold, on each database: every slot has exactly one task on the backend (never lost, never
two), the slot's one success records that task's id, no claim stays `running`, and the worker
ran each slot's task exactly once. Also counts where the kills landed.

Usage: python bench/faults/f12_enqueue.py [--runs 100] [--seed 1] [--quick]
"""

import argparse
import datetime as dt
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import _path  # noqa: F401
from _common import (
    PgDatabase,
    deployed_copy,
    env,
    exit_status,
    goal,
    median,
    pg_url,
    run,
    sqlite_rows,
)

JOB = "f12-task"
CRONTAB = f"0 3 * * *  --no-ping --enqueue --name={JOB} commands.f12_tasks.noted\n"
TASKS = """\
import os

try:
    from django.tasks import task  # Django 6.0+
except ImportError:
    from django_tasks import task


@task
def noted(logical_date: str) -> None:
    with open(os.environ["F12_DONE"], "a") as f:
        f.write(logical_date + "\\n")
"""
# django-tasks-db's own backend, which marks the moment run_job reaches its enqueue (for the
# kills that aim there); nothing else of it changes.
BACKEND = """\
import os

from django_tasks_db import DatabaseBackend


class MarkedBackend(DatabaseBackend):
    def enqueue(self, task, args, kwargs):
        with open(os.environ["F12_MARK"], "a") as f:
            f.write("enqueue\\n")
        return super().enqueue(task, args, kwargs)
"""


def project(env_lines: str) -> Path:
    root = deployed_copy(CRONTAB, env_lines=env_lines)
    (root / "commands" / "f12_tasks.py").write_text(TASKS)
    (root / "commands" / "f12_backend.py").write_text(BACKEND)
    settings = root / "config" / "settings.py"
    settings.write_text(
        settings.read_text()
        + "\nTASKS = {'default': {'BACKEND': 'commands.f12_backend.MarkedBackend'}}\n"
    )
    return root


def marks(path: Path) -> int:
    return path.read_text().count("enqueue") if path.exists() else 0


def explore(label: str, root: Path, rows, runs: int, rng: random.Random) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="cronops-f12-"))
    extra = {"F12_MARK": scratch / "mark", "F12_DONE": scratch / "done"}
    walls, tails = [], []
    for i in range(3):  # the usual run: its wall time, and how long it goes on after the mark
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_job", f"--logical-date=1999-01-0{i + 1}", JOB],
            cwd=root,
            env=env(**extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        before = marks(extra["F12_MARK"])
        while marks(extra["F12_MARK"]) == before and proc.poll() is None:
            time.sleep(0.002)
        marked = time.monotonic()
        assert proc.wait(60) == 0, f"{label}: a normal enqueue run failed"
        walls.append(time.monotonic() - started)
        tails.append(time.monotonic() - marked)
    full, tail = median(walls), median(tails)
    print(f"{label}: a normal run takes {full:.2f} s, {tail * 1000:.0f} ms of it after the enqueue")
    landed: Counter = Counter()
    retry_codes: Counter = Counter()
    dates = []
    for i in range(runs):
        date = (dt.date(2000, 1, 1) + dt.timedelta(days=i)).isoformat()
        dates.append(date)
        before = marks(extra["F12_MARK"])
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_job", f"--logical-date={date}", JOB],
            cwd=root,
            env=env(**extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if i % 2:
            deadline = time.monotonic() + 60
            while marks(extra["F12_MARK"]) == before and proc.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.0005)
            time.sleep(rng.uniform(0, tail))
        else:
            time.sleep(rng.uniform(0, full))
        reached = marks(extra["F12_MARK"]) > before
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        committed = rows(
            "SELECT COUNT(*) FROM ops_jobrun WHERE job = %s AND logical_date = %s "
            "AND outcome = 'succeeded'",
            (JOB, date),
        )[0][0]
        if proc.returncode != -signal.SIGKILL:
            landed["finished before the kill"] += 1
        elif not reached:
            landed["before the enqueue"] += 1
        else:
            landed["after the commit" if committed else "in the enqueue's transaction"] += 1
        code, _, _, _ = run(root, "run_job", f"--logical-date={date}", JOB, extra_env=extra)
        retry_codes[code] += 1
    worker = run(root, "db_worker", "--batch", "--no-startup-delay", extra_env=extra)
    enqueued = Counter()
    ids: dict[str, set[str]] = {}
    for result_id, status, args_kwargs in rows(
        "SELECT id, status, args_kwargs FROM django_tasks_database_dbtaskresult"
    ):
        kwargs = (args_kwargs if isinstance(args_kwargs, dict) else json.loads(args_kwargs))[
            "kwargs"
        ]
        enqueued[kwargs["logical_date"]] += 1
        ids.setdefault(kwargs["logical_date"], set()).add(str(result_id).replace("-", ""))
    recorded: dict[str, list[str]] = {}
    for date, result_id in rows(
        "SELECT logical_date, task_result_id FROM ops_jobrun "
        "WHERE job = %s AND outcome = 'succeeded'",
        (JOB,),
    ):
        recorded.setdefault(str(date), []).append(str(result_id).replace("-", ""))
    claims = dict(rows("SELECT state, COUNT(*) FROM ops_slotclaim GROUP BY state"))
    done_file = extra["F12_DONE"]
    ran = Counter(done_file.read_text().split()) if done_file.exists() else Counter()
    once = [d for d in dates if enqueued[d] == 1]
    matching = [
        d for d in dates if len(recorded.get(d, [])) == 1 and set(recorded[d]) == ids.get(d)
    ]
    print(f"{label}: {runs} kills: {dict(landed)}; the next runs exited {dict(retry_codes)}")
    print(
        f"{label}: tasks per slot {dict(Counter(enqueued[d] for d in dates))}; claims {claims}; "
        f"the worker exited {worker[0]} and ran {sum(ran[d] for d in dates)} tasks of these slots"
    )
    goal(
        "F12",
        f"{label}: {runs} SIGKILLs of an enqueue: slots with exactly one task {len(once)}/{runs}",
        len(once) == runs,
    )
    goal(
        "F12",
        f"{label}: each slot's one success records its task {len(matching)}/{runs}, claims "
        f"{claims}, the next runs exited {sorted(retry_codes)}",
        len(matching) == runs and set(claims) == {"succeeded"} and set(retry_codes) == {0},
    )
    goal(
        "F12",
        f"{label}: the worker ran each slot's task once: {sum(ran[d] == 1 for d in dates)}/{runs}",
        worker[0] == 0 and all(ran[d] == 1 for d in dates),
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="20 runs per database")
    args = parser.parse_args()
    runs = 20 if args.quick else args.runs
    rng = random.Random(args.seed)

    root = project("")
    explore(
        "SQLite",
        root,
        lambda sql, params=(): sqlite_rows(root, sql.replace("%s", "?"), params),
        runs,
        rng,
    )
    server_url = pg_url()
    if not server_url:
        goal("F12", "PostgreSQL not available: run `bash .ci/services.sh` first", False)
        return exit_status()
    pg = PgDatabase(server_url)
    try:
        explore("PostgreSQL", project(f"DATABASE_URL={pg.url}\n"), pg.query, runs, rng)
    finally:
        pg.drop()
    return exit_status()


if __name__ == "__main__":
    raise SystemExit(main())
