"""Django Tasks on the schedule (issue 31): a crontab.d line names a `@task`, run in run_job's
child or enqueued on its backend once per slot. Real processes, on SQLite and PostgreSQL, with
django-tasks-db's database backend and its real worker (`manage.py db_worker`); on the newest
pair (Django 6) the same tests run against `django.tasks` itself."""

import datetime as dt
import json
import signal
import subprocess

import django
import pytest

from .conftest import DAILY, DAILY_DATE, PING_KEY, ping_to, wait_until

TASKS = """
import os
import time

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def stamp(logical_date: str, label: str = "") -> str:
    with open(os.environ["STAMP"], "a") as f:
        f.write(f"{logical_date} {label}\\n")
    return label


@task
def breaks(logical_date: str) -> None:
    raise RuntimeError("the task broke")


@task
def sleeps(seconds: float = 30) -> None:
    time.sleep(seconds)


@task
def charge_once(logical_date: str, cronops_slot: dict) -> None:
    from django.db import transaction

    import ops

    with transaction.atomic():
        if ops.once("charge", slot=cronops_slot):
            with open(os.environ["STAMP"], "a") as f:
                f.write(f"charged {logical_date} {cronops_slot['job']}\\n")


@task
def needs_slot(cronops_slot: dict) -> None:
    with open(os.environ["STAMP"], "a") as f:
        f.write(f"{cronops_slot['job']} {cronops_slot['slot']}\\n")


def not_a_task(logical_date: str) -> None:
    pass
"""

# Task backends that misbehave: one whose client hangs (a broker with no socket timeout), and a
# database backend whose INSERT fails at the database (a constraint, a value it cannot store).
BACKENDS = """
import os
import time
from pathlib import Path

from django_tasks_db import DatabaseBackend

try:
    from django.tasks.backends.base import BaseTaskBackend
except ImportError:
    from django_tasks.backends.base import BaseTaskBackend


class Hangs(BaseTaskBackend):
    def enqueue(self, task, args, kwargs):
        if os.environ.get("HANGING"):
            Path(os.environ["HANGING"]).touch()  # the test's signal now meets the enqueue
        time.sleep(3600)


class Refuses(DatabaseBackend):
    def enqueue(self, task, args, kwargs):
        return super().enqueue(task, args, {**kwargs, "x": float("nan")})  # no JSON column takes it
"""


def with_backends(project, *names: str) -> None:
    """The misbehaving backends of BACKENDS under TASKS[name], each with a task `on_<name>`."""
    (project.dir / "commands" / "cron_backends.py").write_text(BACKENDS)
    settings = project.dir / "config" / "settings.py"
    lines = [f"TASKS[{n!r}] = {{'BACKEND': 'commands.cron_backends.{n.title()}'}}" for n in names]
    settings.write_text(settings.read_text() + "\n" + "\n".join(lines) + "\n")
    module = project.dir / "commands" / "cron_tasks.py"
    tasks = [f"\n\n@task(backend={n!r})\ndef on_{n}() -> None:\n    pass\n" for n in names]
    module.write_text(module.read_text() + "".join(tasks))


def with_tasks(project, tmp_path):
    (project.dir / "commands" / "cron_tasks.py").write_text(TASKS)
    project.stamp = tmp_path / "stamp.txt"
    return project


@pytest.fixture
def tasks_project(project, tmp_path):
    """A deployed copy with the test tasks (commands/cron_tasks.py), on SQLite and PostgreSQL."""
    return with_tasks(project, tmp_path)


@pytest.fixture
def sqlite_tasks(sqlite_project, tmp_path):
    return with_tasks(sqlite_project, tmp_path)


def results(project) -> list[tuple]:
    """(status, task_path, kwargs) of every task the database backend holds."""
    rows = project.db.query(
        "SELECT status, task_path, args_kwargs FROM django_tasks_database_dbtaskresult"
    )
    return [(s, p, (a if isinstance(a, dict) else json.loads(a))["kwargs"]) for s, p, a in rows]


def worker(project, **env) -> subprocess.CompletedProcess:
    """django-tasks-db's worker, until no task is left."""
    return project.manage("db_worker", "--batch", "--no-startup-delay", env=env, timeout=120)


pytestmark = pytest.mark.newest  # Django 6's django.tasks on the newest pair


def test_a_task_runs_in_the_jobs_child_with_its_slots_date_once_per_slot(tasks_project):
    project = tasks_project
    label = """'{"label": "x"}'"""
    project.write_cron("t.cron", f"{DAILY} --name=t-stamp commands.cron_tasks.stamp {label}\n")
    env = {"STAMP": str(project.stamp)}
    first = project.run_job("t-stamp", env=env)
    assert first.returncode == 0, first.stderr
    again = project.run_job("t-stamp", env=env)
    assert "already done" in again.stdout
    assert project.stamp.read_text() == f"{DAILY_DATE} x\n"  # once, with the slot's date
    runs = project.db.runs("t-stamp")
    assert [r[3:5] for r in runs] == [("succeeded", 0), ("skipped", 0)]
    assert results(project) == []  # run, not enqueued


@pytest.mark.parametrize(
    ("line", "code", "said"),
    [
        ("commands.cron_tasks.breaks", 1, "RuntimeError: the task broke"),
        ("--timeout=1s commands.cron_tasks.sleeps", 124, "timed out after 1s"),
    ],
    ids=["a failure", "a timeout"],
)
def test_a_task_that_fails_or_overruns_is_recorded_as_a_command_would_be(
    tasks_project, line, code, said
):
    project = tasks_project
    project.write_cron("t.cron", f"{DAILY} --name=t-task {line}\n")
    result = project.run_job("t-task")
    assert result.returncode == code, result.stderr
    [(*_, exit_code, note)] = project.db.runs("t-task")
    assert exit_code == code and said in note
    if code == 1:
        assert "Traceback" in result.stderr and "RuntimeError: the task broke" in result.stderr


def test_an_enqueued_task_is_put_on_its_backend_once_per_slot_and_its_worker_runs_it(
    tasks_project,
):
    project = tasks_project
    project.write_cron("t.cron", f"{DAILY} --enqueue --name=t-enq commands.cron_tasks.stamp\n")
    first = project.run_job("t-enq")
    assert first.returncode == 0, first.stderr
    again = project.run_job("t-enq")
    assert "already done" in again.stdout
    [(status, path, kwargs)] = results(project)
    assert status == "READY" and path == "commands.cron_tasks.stamp"
    assert kwargs == {"logical_date": str(DAILY_DATE)}
    [(result_id, note)] = project.db.query(
        "SELECT task_result_id, note FROM ops_jobrun WHERE outcome = 'succeeded'"
    )
    assert note == f"enqueued commands.cron_tasks.stamp as {result_id}"
    assert first.stdout == f"cronops: job t-enq: {note}\n"  # what cron mails, what --log keeps
    done = worker(project, STAMP=str(project.stamp))
    assert done.returncode == 0, done.stderr
    assert project.stamp.read_text() == f"{DAILY_DATE} \n"
    assert [r[0] for r in results(project)] == ["SUCCESSFUL"]
    # job_status, the history and the jobs page's status read the task's own status
    status = project.manage("job_status", "--json", "--job", "t-enq")
    [job] = json.loads(status.stdout)["jobs"]
    assert job["last_run"]["task"] == {"id": result_id, "status": "SUCCESSFUL"}
    assert job["reason"] == "its last enqueued task: SUCCESSFUL"
    assert "(task SUCCESSFUL)" in project.manage("job_history", "--job", "t-enq").stdout


def test_wait_result_makes_the_exit_code_and_the_pings_the_tasks_own(tasks_project, httpserver):
    project = tasks_project
    httpserver.expect_request("").respond_with_data("OK")
    ping_to(project, httpserver)
    project.write_cron(
        "t.cron", f"{DAILY} --enqueue --wait-result=60s --name=t-wait commands.cron_tasks.breaks\n"
    )
    run = project.popen("run_job", "t-wait")
    try:
        wait_until(lambda: results(project), "the enqueued task")
        assert worker(project).returncode == 0
        _, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 1, err
    assert "the task" in err and "failed" in err
    paths = [req.path for req, _ in httpserver.log]
    assert paths == [f"/{PING_KEY}/t-wait/1"]  # no start (nothing ran here); the task's failure


def test_thirty_runs_of_one_slot_enqueue_the_task_once(tasks_project):
    project = tasks_project
    project.write_cron("t.cron", f"{DAILY} --enqueue --name=t-enq commands.cron_tasks.stamp\n")
    procs = [project.popen("run_job", "t-enq") for _ in range(30)]
    codes = [p.wait(120) for p in procs]
    for p in procs:
        p.communicate()
    assert set(codes) <= {0, 75}, codes
    assert len(results(project)) == 1
    assert [r[3] for r in project.db.runs("t-enq")].count("succeeded") == 1


@pytest.mark.parametrize(
    ("line", "name", "said"),
    [
        ("commands.cron_tasks.nope", "nope", "commands.cron_tasks has no 'nope'"),
        ("commands.no_such.stamp", "stamp", "no module 'commands.no_such'"),
        ("--name=t-x commands.cron_tasks.not_a_task", "t-x", "it is a function, not a task"),
        ("commands.cron_tasks.stamp '{bad'", "stamp", "its argument is not JSON"),
        ("""commands.cron_tasks.stamp '{"colour": "red"}'""", "stamp", "do not fit stamp()"),
        ("""commands.cron_tasks.stamp '{"logical_date": "1"}'""", "stamp", "the runner gives"),
        ("--wait-result=1m commands.cron_tasks.stamp", "stamp", "--wait-result follows an"),
        ("--enqueue sleep_demo", "sleep_demo", "--enqueue and --wait-result are for a task"),
        ("""commands.cron_tasks.stamp '{"label": NaN}'""", "stamp", "NaN is not a JSON number"),
        ("""commands.cron_tasks.stamp '{"label": "a\\u0000b"}'""", "stamp", "a NUL character"),
        ("--name=t-m commands.cron_tasks", "t-m", "it is a module: name the task in it"),
        ("commands.cron_tasks.stamp '[1]'", "stamp", "not a JSON list"),
    ],
    ids=["no such task", "no such module", "not a task", "not JSON", "a wrong argument",
         "a logical date", "--wait-result alone", "--enqueue for a command", "NaN", "a NUL",
         "a module", "a list"],
)  # fmt: skip
def test_a_bad_task_line_is_refused_by_check_install_and_run_job_naming_file_and_line(
    sqlite_tasks, tmp_path, line, name, said
):
    project = sqlite_tasks
    path = project.write_cron("t.cron", f"{DAILY} {line}\n")
    where = f"{path}:1: "
    check = project.manage("check")
    assert check.returncode != 0 and where in check.stderr and said in check.stderr
    install = project.manage("install_crontab", "--tabfile", str(tmp_path / "tab"))
    assert install.returncode == 2 and where in install.stderr and said in install.stderr
    assert not (tmp_path / "tab").exists()
    run = project.run_job(name)
    assert run.returncode == 2 and said in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert project.db.runs() == []


def test_a_task_whose_backend_is_not_configured_is_refused(sqlite_tasks):
    project = sqlite_tasks
    module = project.dir / "commands" / "cron_tasks.py"
    module.write_text(
        module.read_text() + "\n\n@task(backend='elsewhere')\ndef far() -> None:\n    pass\n"
    )
    result = project.run_job("--name=t-far", "commands.cron_tasks.far")
    assert result.returncode == 2
    assert "its task backend is not configured" in result.stderr and "TASKS" in result.stderr


def test_a_task_run_by_hand_for_a_past_date(sqlite_tasks):
    project = sqlite_tasks
    project.write_cron("t.cron", f"{DAILY} --name=t-stamp commands.cron_tasks.stamp\n")
    day = DAILY_DATE - dt.timedelta(days=4)
    result = project.run_job(f"--logical-date={day}", "t-stamp", env={"STAMP": str(project.stamp)})
    assert result.returncode == 0, result.stderr
    assert project.stamp.read_text() == f"{day} \n"


def test_a_task_enqueued_twice_for_one_slot_does_its_effect_once_with_ops_once(tasks_project):
    """What a backend outside the claims' database risks (a run killed between its enqueue and
    its record, the slot enqueued again) made here with --force: two tasks of one slot, and the
    worker runs both; ops.once(key, slot=cronops_slot) lets the effect through once."""
    project = tasks_project
    project.write_cron(
        "t.cron", f"{DAILY} --enqueue --name=t-once commands.cron_tasks.charge_once\n"
    )
    assert project.run_job("t-once").returncode == 0
    forced = project.run_job("--force", "t-once")
    assert forced.returncode == 0, forced.stderr
    enqueued = results(project)
    assert len(enqueued) == 2
    slots = [kwargs["cronops_slot"] for _, _, kwargs in enqueued]
    assert {(s["job"], s["slot"]) for s in slots} == {("t-once", str(DAILY_DATE))}
    assert worker(project, STAMP=str(project.stamp)).returncode == 0
    assert [r[0] for r in results(project)] == ["SUCCESSFUL", "SUCCESSFUL"]
    assert project.stamp.read_text() == f"charged {DAILY_DATE} t-once\n"
    assert project.db.query("SELECT job, slot, key FROM ops_effect") == [
        ("t-once", str(DAILY_DATE), "charge")
    ]


def test_a_task_on_the_immediate_backend_is_not_enqueued_in_run_jobs_own_process(sqlite_tasks):
    project = sqlite_tasks
    settings = project.dir / "config" / "settings.py"
    immediate = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    settings.write_text(
        settings.read_text()
        + f"\nTASKS['now'] = {{'BACKEND': '{immediate}.backends.immediate.ImmediateBackend'}}\n"
    )
    module = project.dir / "commands" / "cron_tasks.py"
    module.write_text(
        module.read_text() + "\n\n@task(backend='now')\ndef here(logical_date: str) -> None:\n"
        "    with open(os.environ['STAMP'], 'a') as f:\n        f.write(logical_date)\n"
    )
    project.write_cron("t.cron", f"{DAILY} --enqueue --name=t-now commands.cron_tasks.here\n")
    install = project.manage("install_crontab", "--dry-run")
    assert install.returncode == 2
    assert "its backend ImmediateBackend runs the task inside enqueue()" in install.stderr
    result = project.run_job("t-now", env={"STAMP": str(project.stamp)})
    assert result.returncode == 2 and "without --enqueue" in result.stderr
    assert not project.stamp.exists() and project.db.runs() == []
    # Without --enqueue it is a task like any other, run in the job's child.
    project.write_cron("t.cron", f"{DAILY} --name=t-now commands.cron_tasks.here\n")
    result = project.run_job("t-now", env={"STAMP": str(project.stamp)})
    assert result.returncode == 0, result.stderr
    assert project.stamp.read_text() == str(DAILY_DATE)


def test_an_enqueue_the_database_refuses_is_a_failed_run_and_leaves_no_claim_running(
    tasks_project,
):
    """The task row's INSERT fails inside the record's transaction: the run is recorded failed
    (not "database unavailable"), its claim says failed, and no task is left behind."""
    project = tasks_project
    with_backends(project, "refuses")
    project.write_cron("t.cron", f"{DAILY} --enqueue --name=t-ref commands.cron_tasks.on_refuses\n")
    result = project.run_job("t-ref")
    assert result.returncode == 1, result.stderr
    assert "could not enqueue commands.cron_tasks.on_refuses" in result.stderr
    assert "database unavailable" not in result.stderr
    [(*_, outcome, exit_code, note)] = project.db.runs("t-ref")
    assert (outcome, exit_code) == ("failed", 1) and "Error" in note
    assert project.db.query("SELECT state FROM ops_slotclaim WHERE job = 't-ref'") == [("failed",)]
    assert results(project) == []


@pytest.mark.parametrize("stop", ["timeout", "SIGTERM"])
def test_an_enqueue_that_hangs_ends_at_the_timeout_or_a_signal_as_a_job_would(tasks_project, stop):
    project = tasks_project
    with_backends(project, "hangs")
    project.write_cron(
        "t.cron", f"{DAILY} --enqueue --timeout=3s --name=t-hang commands.cron_tasks.on_hangs\n"
    )
    hanging = project.dir / "hanging"
    run = project.popen(
        "run_job",
        "--timeout=3s" if stop == "timeout" else "--timeout=1h",
        "t-hang",
        env={"HANGING": str(hanging)},
    )
    try:
        if stop == "SIGTERM":
            # Not the claim: a signal between the claim and the enqueue ends no enqueue.
            wait_until(hanging.exists, "the backend's enqueue to begin")
            run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)  # the backend would hold it for an hour
    finally:
        run.kill()
    [(*_, outcome, _, note)] = project.db.runs("t-hang")
    if stop == "timeout":
        assert (run.returncode, outcome) == (124, "timed_out"), err
        assert note == "timed out after 3s enqueueing commands.cron_tasks.on_hangs"
    else:
        assert (run.returncode, outcome) == (143, "terminated"), err
        assert "while enqueueing commands.cron_tasks.on_hangs" in note
    assert project.db.query("SELECT state FROM ops_slotclaim WHERE job = 't-hang'") != [
        ("running",)
    ]


def test_a_task_run_here_gets_the_claim_it_runs_under_as_cronops_slot(sqlite_tasks):
    project = sqlite_tasks
    project.write_cron("t.cron", f"{DAILY} --name=t-slot commands.cron_tasks.needs_slot\n")
    result = project.run_job("t-slot", env={"STAMP": str(project.stamp)})
    assert result.returncode == 0, result.stderr
    assert project.stamp.read_text() == f"t-slot {DAILY_DATE}\n"


def test_a_task_whose_module_raises_on_import_is_a_failed_run_not_a_silent_refusal(
    sqlite_tasks, tmp_path
):
    project = sqlite_tasks
    (project.dir / "commands" / "cron_raises.py").write_text("raise RuntimeError('no config')\n")
    project.write_cron("t.cron", f"{DAILY} --name=t-raise commands.cron_raises.job\n")
    assert project.manage("install_crontab", "--tabfile", str(tmp_path / "tab")).returncode == 2
    result = project.run_job("t-raise")
    assert result.returncode == 1, result.stderr
    [(*_, outcome, exit_code, note)] = project.db.runs("t-raise")
    assert (outcome, exit_code) == ("failed", 1)
    assert "importing commands.cron_raises failed: RuntimeError: no config" in note


def test_a_job_whose_enqueued_task_failed_is_failing_in_job_status(tasks_project):
    project = tasks_project
    project.write_cron("t.cron", f"{DAILY} --enqueue --name=t-brk commands.cron_tasks.breaks\n")
    assert project.run_job("t-brk").returncode == 0
    assert worker(project).returncode == 0
    status = project.manage("job_status", "--json", "--job", "t-brk")
    [job] = json.loads(status.stdout)["jobs"]
    assert (job["state"], job["reason"]) == ("failing", "its last enqueued task: FAILED")
    assert status.returncode == 1


def test_wait_result_waits_for_the_current_slot_only_not_each_catch_up_slot(sqlite_tasks):
    project = sqlite_tasks
    project.write_cron(
        "t.cron",
        f"{DAILY} --enqueue --catch-up=3 --wait-result=1s --name=t-cu commands.cron_tasks.stamp\n",
    )
    day = DAILY_DATE - dt.timedelta(days=3)
    assert project.run_job(f"--logical-date={day}", "t-cu").returncode == 75  # no worker
    result = project.run_job("t-cu")
    assert result.returncode == 75, result.stderr
    assert len(results(project)) == 4  # the past date, two caught up, the current slot
    assert result.stderr.count("had not finished") == 1, result.stderr


def test_a_task_run_ad_hoc_under_a_commands_name_is_refused(sqlite_tasks):
    project = sqlite_tasks
    module = project.dir / "commands" / "cron_tasks.py"
    module.write_text(module.read_text() + "\n\n@task\ndef check() -> None:\n    pass\n")
    result = project.run_job("--enqueue", "commands.cron_tasks.check")
    assert result.returncode == 2
    assert "job name 'check' is the name of another management command" in result.stderr
    assert project.db.runs() == []
