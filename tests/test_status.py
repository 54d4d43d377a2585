"""job_status: every state, its JSON schema and its exit code, with time-machine for the clock.

The in-process tests use pytest-django's database (SQLite); the `project` tests run the real
command in a deployed copy on SQLite and on PostgreSQL, the clock moved by time-machine inside
that process.
"""

import datetime as dt
import io
import json
import statistics
import subprocess
import sys
import textwrap

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError

from ops.models import JobRun, Outcome, SlotClaim
from ops.monitors import status
from ops.schedule.crontabd import parse_text
from ops.schedule.slots import make_slot, time_key
from tests.conftest import base_env

UTC = dt.UTC
NOW = dt.datetime(2026, 11, 29, 12, 0, 30, tzinfo=UTC)

CRON = textwrap.dedent(
    """\
    # Charges once a day.
    0 3 * * *     --timeout=30m --name=ok-job sleep_demo --seconds=0
    0 3 * * *     --timeout=30m --name=late-job sleep_demo --seconds=0
    0 * * * *     --timeout=5m --name=bad-job sleep_demo --seconds=0
    */10 * * * *  --timeout=1h --name=busy-job sleep_demo --seconds=0
    @daily        --name=new-job sleep_demo --seconds=0
    @reboot       --name=boot-job sleep_demo --seconds=0
    """
)

EXPECTED = {
    "ok-job": "ok",
    "late-job": "overdue",
    "bad-job": "failing",
    "busy-job": "running",
    "new-job": "never run",
    "boot-job": "ok",
    "export": "ok",
}


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def slot_key(job: str, slot: str) -> str:
    """The key the runner gives `job`'s slot at `slot` (UTC): the date for a daily job."""
    job_line = next(line for line in CRON.splitlines() if f"--name={job} " in line)
    expr = " ".join(job_line.split()[:5])
    return make_slot(expr, at(slot)).key


def schedule_of(text: str = CRON):
    return parse_text(text, "test.cron")


# --- history rows, as the runner writes them ------------------------------------------------


def scenario_rows():
    """(kind, fields) rows for the shared scenario, valid for NOW (2026-11-29 12:00:30 UTC)."""
    rows = []

    def run(job, slot, outcome, started, duration=2.0, exit_code=0, claim=True, beat=None):
        slot_at = at(slot) if slot else None
        slot = slot_key(job, slot) if slot else ""
        start = at(started)
        fields = {
            "job": job,
            "slot": slot,
            "logical_date": slot_at.date() if slot_at else None,
            "scheduled_at": slot_at,
            "outcome": outcome,
            "note": "",
            "exit_code": None if outcome == Outcome.RUNNING else exit_code,
            "started_at": start,
            "finished_at": None if duration is None else start + dt.timedelta(seconds=duration),
            "duration": duration,
            "lag": (start - slot_at).total_seconds() if slot_at else None,
            "host": "web-2",  # another host: its pids mean nothing here
            "pid": 4242,
            "rid": "",
            "command": "sleep_demo",
            "output_tail": f"output of {job} at {started}\n",
        }
        rows.append(("run", fields))
        if claim and slot:
            rows.append(
                (
                    "claim",
                    {
                        "job": job,
                        "slot": slot,
                        "logical_date": slot_at.date(),
                        "scheduled_at": slot_at,
                        "state": outcome,
                        "host": "web-2",  # another host: its pids mean nothing here
                        "pid": 4242,
                        "started_at": start,
                        "heartbeat_at": beat or start,
                    },
                )
            )

    run("ok-job", "2026-11-28 03:00", "succeeded", "2026-11-28 03:00:02", 4.0)
    run("ok-job", "2026-11-29 03:00", "succeeded", "2026-11-29 03:00:03", 6.0)
    run("late-job", "2026-11-28 03:00", "succeeded", "2026-11-28 03:00:01", 3.0)
    run("bad-job", "2026-11-29 09:00", "succeeded", "2026-11-29 09:00:01", 1.0)
    run("bad-job", "2026-11-29 10:00", "failed", "2026-11-29 10:00:01", 1.0, exit_code=3)
    run("bad-job", "2026-11-29 11:00", "timed_out", "2026-11-29 11:00:01", 300.0, exit_code=124)
    run("bad-job", "2026-11-29 11:00", "skipped", "2026-11-29 11:02:00", 0.0, 75, claim=False)
    run("busy-job", "2026-11-29 11:50", "succeeded", "2026-11-29 11:50:01", 5.0)
    run(
        "busy-job",
        "2026-11-29 12:00",
        "running",
        "2026-11-29 12:00:02",
        None,
        beat=at("2026-11-29 12:00:20"),
    )
    run("boot-job", "", "succeeded", "2026-11-20 08:00:00", 1.0)
    run("export", "", "succeeded", "2026-11-29 08:00:00", 12.0)
    return rows


def insert_orm(rows):
    last = {}
    for kind, fields in rows:
        if kind == "run":
            last[(fields["job"], fields["slot"])] = JobRun.objects.create(**fields)
        else:
            SlotClaim.objects.create(run=last[(fields["job"], fields["slot"])], **fields)


def insert_sql(db, rows):
    """The same rows through the project's own database connection (SQLite or PostgreSQL)."""

    def value(v):
        if isinstance(v, dt.datetime) and db.backend == "sqlite":
            return v.astimezone(UTC).replace(tzinfo=None).isoformat(" ")  # Django's format
        if isinstance(v, dt.date | dt.datetime) and db.backend == "sqlite":
            return v.isoformat()
        return v

    next_id = 1
    last = {}
    for kind, fields in rows:
        fields = dict(fields)
        if kind == "run":
            fields["id"] = next_id
            last[(fields["job"], fields["slot"])] = next_id
            next_id += 1
            table = "ops_jobrun"
        else:
            fields["run_id"] = last[(fields["job"], fields["slot"])]
            table = "ops_slotclaim"
        names = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        db.execute(
            f"INSERT INTO {table} ({names}) VALUES ({marks})",
            tuple(value(v) for v in fields.values()),
        )


@pytest.fixture
def cron_dir(tmp_path, settings):
    directory = tmp_path / "crontab.d"
    directory.mkdir()
    (directory / "50-test.cron").write_text(CRON)
    settings.OPS_CRONTAB_DIR = directory
    settings.TIME_ZONE = "UTC"
    settings.OPS_HEARTBEAT_SECONDS = 30
    return directory


def job_status(*args):
    """Run the command in-process: (exit code, stdout)."""
    out = io.StringIO()
    try:
        call_command("job_status", *args, stdout=out)
    except SystemExit as exc:
        return exc.code, out.getvalue()
    return 0, out.getvalue()


def states_of(document):
    return {j["job"]: j["state"] for j in document["jobs"]}


# --- in-process, SQLite ---------------------------------------------------------------------


@pytest.mark.django_db
def test_every_state_shows_up_for_the_job_it_describes(cron_dir):
    insert_orm(scenario_rows())
    with time_machine.travel(NOW, tick=False):
        code, out = job_status("--json")
    assert states_of(json.loads(out)) == EXPECTED
    assert code == 1


@pytest.mark.django_db
def test_the_table_lists_declared_jobs_in_file_order_then_ad_hoc_jobs(cron_dir):
    insert_orm(scenario_rows())
    with time_machine.travel(NOW, tick=False):
        code, out = job_status()
    lines = out.splitlines()
    assert lines[0].split() == [
        "JOB",
        "STATE",
        "SCHEDULE",
        "NEXT",
        "LAST",
        "SUCCESS",
        "LAST",
        "RUN",
        "DUR/MED",
        "LAG",
        "FAILS",
    ]
    order = [line.split()[0] for line in lines[1:8]]
    assert order == ["ok-job", "late-job", "bad-job", "busy-job", "new-job", "boot-job", "export"]
    ok_row = lines[1]
    assert "2026-11-30 03:00" in ok_row  # next fire
    assert "2026-11-29 03:00 slot " in ok_row  # the slot (and logical date) it served
    assert "succeeded (0)" in ok_row
    assert "6.0s/5.0s" in ok_row  # last duration / median
    assert "(ad hoc)" in lines[7]
    assert "late-job: overdue: no success for the slot 2026-11-29 03:00 after its grace of 30m" in (
        lines
    )
    assert code == 1


@pytest.mark.django_db
def test_a_healthy_project_exits_zero(cron_dir):
    (cron_dir / "50-test.cron").write_text(
        "0 3 * * * --timeout=30m --name=ok-job sleep_demo --seconds=0\n"
        "*/10 * * * * --timeout=1h --name=busy-job sleep_demo --seconds=0\n"
    )
    insert_orm(r for r in scenario_rows() if r[1]["job"] in ("ok-job", "busy-job"))
    with time_machine.travel(NOW, tick=False):
        code, out = job_status()
    assert code == 0, out


@pytest.mark.django_db
def test_a_daily_job_is_ok_until_its_slot_plus_grace_then_overdue(cron_dir):
    insert_orm(r for r in scenario_rows() if r[1]["job"] == "late-job")
    # Yesterday's run served the 2026-11-28 03:00 slot; today's 03:00 slot has a 30 m grace.
    with time_machine.travel(at("2026-11-29 03:29:59"), tick=False):
        assert job_status("--job", "late-job")[0] == 0
    with time_machine.travel(at("2026-11-29 03:30:00"), tick=False):
        code, out = job_status("--json", "--job", "late-job")
    job = json.loads(out)["jobs"][0]
    assert (code, job["state"], job["due_slot"]) == (1, "overdue", "2026-11-29 03:00")


@pytest.mark.django_db
def test_a_job_without_timeout_gets_an_hour_of_grace(cron_dir):
    (cron_dir / "50-test.cron").write_text("0 3 * * * --name=late-job sleep_demo --seconds=0\n")
    insert_orm(r for r in scenario_rows() if r[1]["job"] == "late-job")
    with time_machine.travel(at("2026-11-29 03:59:59"), tick=False):
        assert job_status()[0] == 0
    with time_machine.travel(at("2026-11-29 04:00:00"), tick=False):
        code, out = job_status("--json")
    assert json.loads(out)["jobs"][0]["grace_seconds"] == 3600
    assert code == 1


@pytest.mark.django_db
def test_a_failure_followed_by_a_success_is_ok_again(cron_dir):
    rows = [r for r in scenario_rows() if r[1]["job"] == "bad-job"]
    insert_orm(rows)
    JobRun.objects.create(
        job="bad-job",
        slot=slot_key("bad-job", "2026-11-29 12:00"),
        outcome=Outcome.SUCCEEDED,
        exit_code=0,
        started_at=at("2026-11-29 12:00:01"),
        finished_at=at("2026-11-29 12:00:02"),
        duration=1.0,
        scheduled_at=at("2026-11-29 12:00"),
        host="h",
        pid=1,
    )
    with time_machine.travel(NOW, tick=False):
        code, out = job_status("--json", "--job", "bad-job")
    job = json.loads(out)["jobs"][0]
    assert (code, job["state"], job["consecutive_failures"]) == (0, "ok", 0)


@pytest.mark.django_db
def test_failing_counts_the_failures_in_a_row_and_ignores_skips(cron_dir):
    insert_orm(scenario_rows())
    with time_machine.travel(NOW, tick=False):
        _, out = job_status("--json", "--job", "bad-job")
    job = json.loads(out)["jobs"][0]
    assert job["state"] == "failing"
    assert job["consecutive_failures"] == 2
    assert job["last_run"]["outcome"] == "timed_out"  # the later skip is not an attempt
    assert job["last_run"]["exit_code"] == 124
    assert job["last_success"]["slot"] == "2026-11-29 09:00+00:00"
    assert job["reason"] == "last run timed out (exit 124), 2 failures in a row"


@pytest.mark.django_db
def test_a_failure_streak_longer_than_the_recent_window_is_counted_in_full(cron_dir):
    start = at("2026-11-27 00:00")
    for i in range(status.WINDOW + 15):
        t = start + dt.timedelta(hours=i)
        JobRun.objects.create(
            job="bad-job",
            slot=time_key(t),
            scheduled_at=t,
            outcome=Outcome.FAILED,
            exit_code=1,
            started_at=t,
            finished_at=t,
            duration=float(i),
            host="h",
            pid=1,
        )
    with time_machine.travel(NOW, tick=False):
        _, out = job_status("--json", "--job", "bad-job")
    job = json.loads(out)["jobs"][0]
    assert job["consecutive_failures"] == status.WINDOW + 15
    # the median covers the last WINDOW finished runs only: durations 15..34
    assert job["median_of_runs"] == status.WINDOW
    assert job["median_duration"] == statistics.median(range(15, 35))


def grow_history(runs_per_job: int, more_jobs: int = 0, first: int = 0) -> None:
    """More of everything job_status reads per job: `runs_per_job` older successes for every
    job of the scenario, and `more_jobs` ad-hoc jobs, a third of them failing for longer than
    the recent window, a third running (a slotted run with its claim), a third succeeding;
    named extra-<first>, extra-<first + 1>, ..."""
    start = at("2026-10-01 03:00")
    runs = [
        JobRun(
            job=job,
            slot="",
            outcome=Outcome.SUCCEEDED,
            exit_code=0,
            started_at=start + dt.timedelta(minutes=i),
            finished_at=start + dt.timedelta(minutes=i, seconds=2),
            duration=2.0,
            host="h",
            pid=1,
        )
        for job in EXPECTED
        for i in range(runs_per_job)
    ]
    for n in range(first, first + more_jobs):
        kind = ("failing", "running", "ok")[n % 3]
        outcome = {"failing": Outcome.FAILED, "ok": Outcome.SUCCEEDED}.get(kind)
        for i in range(status.WINDOW + 5):
            t = at("2026-11-28 00:00") + dt.timedelta(minutes=i)
            last = i == status.WINDOW + 4
            runs.append(
                JobRun(
                    job=f"extra-{n:02d}",
                    slot=time_key(t) if kind == "running" else "",
                    scheduled_at=t if kind == "running" else None,
                    outcome=Outcome.RUNNING
                    if kind == "running" and last
                    else outcome or Outcome.SUCCEEDED,
                    exit_code=1 if kind == "failing" else 0,
                    started_at=t,
                    finished_at=t,
                    duration=1.0,
                    host="h",
                    pid=1,
                )
            )
    JobRun.objects.bulk_create(runs)
    SlotClaim.objects.bulk_create(
        SlotClaim(
            job=run.job,
            slot=run.slot,
            logical_date=run.started_at.date(),
            scheduled_at=run.scheduled_at,
            state=Outcome.RUNNING,
            run=run,
            host="h",
            pid=1,
            started_at=run.started_at,
            heartbeat_at=NOW,
        )
        for run in JobRun.objects.filter(job__startswith="extra-", outcome=Outcome.RUNNING)
        if not SlotClaim.objects.filter(run=run).exists()
    )


@pytest.mark.django_db
def test_the_query_count_grows_neither_with_the_runs_nor_with_the_jobs(cron_dir):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    insert_orm(scenario_rows())
    grow_history(0, more_jobs=3)  # one of each kind: every query job_status may make

    def queries(*args) -> tuple[int, str]:
        with time_machine.travel(NOW, tick=False), CaptureQueriesContext(connection) as ctx:
            _, out = job_status(*args)
        return len(ctx.captured_queries), out

    before, _ = queries("--json")
    prometheus, _ = queries("--format=prometheus")
    grow_history(300, more_jobs=60, first=3)
    after, out = queries("--json")
    states = states_of(json.loads(out))
    assert len(states) == len(EXPECTED) + 63
    assert states["extra-00"] == "failing"
    assert states["extra-01"] == "running"
    assert states["extra-02"] == "ok"
    assert after == before
    assert queries("--format=prometheus")[0] == prometheus == before
    assert before <= 8  # names, recent runs, long streaks, due-slot claims, running claims


@pytest.mark.django_db
def test_a_running_run_whose_heartbeat_stopped_counts_as_failing(cron_dir):
    insert_orm(r for r in scenario_rows() if r[1]["job"] == "busy-job")
    # heartbeat at 12:00:20, interval 30 s: dead after 90 s without one
    with time_machine.travel(at("2026-11-29 12:01:50"), tick=False):
        assert json.loads(job_status("--json", "--job", "busy-job")[1])["jobs"][0]["state"] == (
            "running"
        )
    with time_machine.travel(at("2026-11-29 12:01:51"), tick=False):
        code, out = job_status("--json", "--job", "busy-job")
    job = json.loads(out)["jobs"][0]
    assert (code, job["state"]) == (1, "failing")
    assert "stopped reporting" in job["reason"]


@pytest.mark.django_db
def test_a_live_run_on_another_server_with_the_same_host_name_is_running(cron_dir, settings):
    """Two servers may share OPS_HOST: the other one's pid means nothing here, its claim's
    holder (another boot id) and fresh heartbeat say it is alive."""
    settings.OPS_HOST = "web-2"  # the name the busy-job's run was recorded under
    insert_orm(r for r in scenario_rows() if r[1]["job"] == "busy-job")
    SlotClaim.objects.update(holder_boot_id="boot-id-of-the-other-server")
    with time_machine.travel(at("2026-11-29 12:01:00"), tick=False):
        _, out = job_status("--json", "--job", "busy-job")
    assert json.loads(out)["jobs"][0]["state"] == "running"


@pytest.mark.django_db
@pytest.mark.process  # a real process that has exited
def test_a_run_whose_holder_process_is_gone_on_this_machine_is_failing_at_once(cron_dir):
    from ops.run import process

    insert_orm(r for r in scenario_rows() if r[1]["job"] == "busy-job")
    me = process.identify()
    dead = subprocess.Popen(["true"])
    dead.wait()
    SlotClaim.objects.update(
        holder_boot_id=me.boot_id, holder_pid_ns=me.pid_ns, pid=dead.pid, holder_started=1
    )
    with time_machine.travel(at("2026-11-29 12:00:30"), tick=False):  # heartbeat still fresh
        _, out = job_status("--json", "--job", "busy-job")
    assert json.loads(out)["jobs"][0]["state"] == "failing"


@pytest.mark.django_db
def test_the_last_start_lag_and_next_fire_are_reported(cron_dir):
    insert_orm(scenario_rows())
    with time_machine.travel(NOW, tick=False):
        _, out = job_status("--json", "--job", "busy-job")
    job = json.loads(out)["jobs"][0]
    assert job["last_lag"] == 2.0
    assert job["next_fire"] == "2026-11-29T12:10:00+00:00"
    assert job["last_run"]["outcome"] == "running"
    assert job["last_success"]["started_at"] == "2026-11-29T11:50:01+00:00"


@pytest.mark.django_db
def test_the_start_lag_ignores_runs_of_a_past_date_by_hand(cron_dir):
    insert_orm(r for r in scenario_rows() if r[1]["job"] == "ok-job")
    JobRun.objects.create(  # run_job --logical-date=2026-01-15 ok-job, at 11:00
        job="ok-job",
        slot="2026-01-15",
        logical_date=dt.date(2026, 1, 15),
        scheduled_at=at("2026-01-15 03:00"),
        outcome=Outcome.SUCCEEDED,
        exit_code=0,
        started_at=at("2026-11-29 11:00:00"),
        finished_at=at("2026-11-29 11:00:05"),
        duration=5.0,
        lag=(at("2026-11-29 11:00:00") - at("2026-01-15 03:00")).total_seconds(),
        host="h",
        pid=1,
    )
    with time_machine.travel(NOW, tick=False):
        _, out = job_status("--json", "--job", "ok-job")
    job = json.loads(out)["jobs"][0]
    assert job["last_run"]["slot"] == "2026-01-15"
    assert job["last_lag"] == 3.0  # from the 2026-11-29 03:00 run that cron started
    assert job["state"] == "ok"  # today's slot succeeded, whatever ran after it


@pytest.mark.django_db
def test_times_are_shown_in_the_projects_time_zone(cron_dir, settings):
    settings.TIME_ZONE = "Europe/Moscow"
    insert_orm(r for r in scenario_rows() if r[1]["job"] == "export")
    with time_machine.travel(NOW, tick=False):
        _, out = job_status("--json", "--job", "export")
    document = json.loads(out)
    assert document["time_zone"] == "Europe/Moscow"
    assert document["jobs"][0]["last_success"]["started_at"] == "2026-11-29T11:00:00+03:00"


@pytest.mark.django_db
def test_an_unknown_job_is_one_clear_error_with_exit_2(cron_dir):
    with pytest.raises(CommandError) as error:
        call_command("job_status", "--job", "nope", stdout=io.StringIO())
    assert error.value.returncode == 2
    assert str(error.value) == "no job named 'nope' in crontab.d or in the run history"


@pytest.mark.parametrize("fmt", ["prometheus", "table"])
def test_json_with_another_format_is_refused_with_exit_2(fmt):
    with pytest.raises(CommandError) as error:
        call_command("job_status", "--json", f"--format={fmt}", stdout=io.StringIO())
    assert error.value.returncode == 2
    assert str(error.value) == f"--json and --format={fmt} contradict each other: give one"


def test_json_and_format_json_together_are_json(project):
    result = project.manage("job_status", "--json", "--format=json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)


def test_json_with_format_prometheus_is_one_line_and_exit_2_from_the_shell(sqlite_project):
    result = sqlite_project.manage("job_status", "--json", "--format=prometheus")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "CommandError: --json and --format=prometheus contradict each other: give one"
    )


@pytest.mark.django_db
def test_the_json_schema_is_the_documented_one(cron_dir):
    insert_orm(scenario_rows())
    with time_machine.travel(NOW, tick=False):
        _, out = job_status("--json")
    document = json.loads(out)
    assert set(document) == {"schema", "now", "time_zone", "healthy", "jobs"}
    assert document["schema"] == 1
    assert document["now"] == "2026-11-29T12:00:30+00:00"
    assert document["healthy"] is False
    job_keys = {
        "job": str,
        "state": str,
        "reason": str,
        "declared": bool,
        "schedule": (str, type(None)),
        "description": str,
        "next_fire": (str, type(None)),
        "grace_seconds": (float, int, type(None)),
        "due_slot": (str, type(None)),
        "last_success": (dict, type(None)),
        "last_run": (dict, type(None)),
        "last_duration": (float, type(None)),
        "median_duration": (float, type(None)),
        "median_of_runs": int,
        "last_lag": (float, type(None)),
        "consecutive_failures": int,
        "paused": (dict, type(None)),  # by, since, until, reason (tests/test_pause.py)
    }
    run_keys = {
        "id",
        "slot",
        "logical_date",
        "started_at",
        "finished_at",
        "outcome",
        "exit_code",
        "duration",
        "lag",
        "host",
        "note",
        "trigger",  # how it was started (issue 32): cron, terminal, hand, page, retry, catch_up
        "started_by",
        "started_how",
    }
    for job in document["jobs"]:
        assert set(job) == set(job_keys), job["job"]
        for key, kind in job_keys.items():
            assert isinstance(job[key], kind), (job["job"], key)
        assert job["state"] in status.STATES
        for key in ("last_success", "last_run"):
            if job[key] is not None:
                assert set(job[key]) == run_keys
    by_name = {j["job"]: j for j in document["jobs"]}
    assert by_name["ok-job"]["description"] == "Charges once a day."
    assert by_name["export"]["declared"] is False
    assert by_name["export"]["schedule"] is None
    assert by_name["boot-job"]["next_fire"] is None  # @reboot: no schedule to fire
    assert by_name["new-job"]["last_run"] is None


@pytest.mark.django_db
def test_ops_default_grace_sets_the_grace_of_jobs_without_timeout(cron_dir, settings):
    settings.OPS_DEFAULT_GRACE = "15m"
    (cron_dir / "50-test.cron").write_text("0 3 * * * --name=late-job sleep_demo --seconds=0\n")
    insert_orm(r for r in scenario_rows() if r[1]["job"] == "late-job")
    with time_machine.travel(at("2026-11-29 03:14:59"), tick=False):
        assert job_status()[0] == 0
    with time_machine.travel(at("2026-11-29 03:15:00"), tick=False):
        assert job_status()[0] == 1
    settings.OPS_DEFAULT_GRACE = "soon"
    with pytest.raises(CommandError) as error:
        call_command("job_status", stdout=io.StringIO())
    assert error.value.returncode == 2
    assert str(error.value).startswith("OPS_DEFAULT_GRACE: bad duration 'soon'")


def test_grace_is_the_jobs_timeout_and_never_under_a_minute():
    assert status.grace_seconds(schedule_of("0 3 * * * --timeout=10m --name=j x\n").jobs[0]) == 600
    assert status.grace_seconds(schedule_of("* * * * * --timeout=5s --name=j x\n").jobs[0]) == 60
    assert status.grace_seconds(schedule_of("0 3 * * * --name=j x\n").jobs[0]) == 3600


def test_grace_covers_every_attempt_the_waits_between_them_the_after_wait_and_the_result_wait():
    def grace(line: str) -> float:
        text = "0 2 * * * --name=up x\n" + line
        return status.grace_seconds(schedule_of(text).jobs[1])

    # 3 attempts of 10 minutes, then the longest backoffs: 1m and 2m, plus 10 % jitter each
    assert grace("0 3 * * * --timeout=10m --retries=2 --name=j x\n") == pytest.approx(
        3 * 600 + 1.1 * (60 + 120)
    )
    assert grace("0 3 * * * --timeout=10m --after=up --after-wait=20m --name=j x\n") == 1800
    assert grace("0 3 * * * --retries=1 --retry-delay=30s --name=j x\n") == 3600 + 33
    assert grace("0 3 * * * --timeout=1m --enqueue --wait-result=20m --name=j a.b\n") == 1260


# --- a deployed copy, SQLite and PostgreSQL -------------------------------------------------

TRAVEL = textwrap.dedent(
    """\
    import os, sys, time_machine
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line
    with time_machine.travel(sys.argv[1], tick=False):
        execute_from_command_line(["manage.py", *sys.argv[2:]])
    """
)


def manage_at(project, when: dt.datetime, *args):
    """`manage.py *args` in the deployed copy with its clock at `when` (time-machine)."""
    return subprocess.run(
        [sys.executable, "-c", TRAVEL, when.isoformat(), *args],
        cwd=project.dir,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_state_on_the_real_database(project):
    project.write_cron("50-test.cron", CRON)
    insert_sql(project.db, scenario_rows())
    result = manage_at(project, NOW, "job_status", "--json")
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert states_of(document) == EXPECTED
    bad = next(j for j in document["jobs"] if j["job"] == "bad-job")
    assert bad["consecutive_failures"] == 2
    assert bad["last_run"]["exit_code"] == 124
    ok = next(j for j in document["jobs"] if j["job"] == "ok-job")
    assert ok["last_success"]["logical_date"] == "2026-11-29"
    assert ok["median_duration"] == 5.0


def test_one_healthy_job_exits_zero_and_the_table_shows_it(project):
    project.write_cron("50-test.cron", CRON)
    insert_sql(project.db, scenario_rows())
    result = manage_at(project, NOW, "job_status", "--job", "ok-job")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[:2] == ["ok-job", "ok"]
    later = manage_at(project, at("2026-11-30 03:30"), "job_status", "--job", "ok-job")
    assert later.returncode == 1
    assert "ok-job: overdue: no success for the slot 2026-11-30 03:00" in later.stdout


def test_an_unreadable_database_is_one_line_and_exit_2(sqlite_project, tmp_path):
    """A database never migrated: the line says what to do (docs/settings.md)."""
    sqlite_project.write_env(DATABASE_URL=f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    result = sqlite_project.manage("job_status")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "CommandError: cannot read the run history: cronops' tables are missing from database "
        "'default' (run `manage.py migrate`)"
    )


def test_job_history_into_a_pipe_closed_early_exits_quietly(sqlite_project):
    """`job_history --limit=400 | head -1`: no BrokenPipeError traceback."""
    project = sqlite_project
    note = "n" * 300
    rows = ", ".join(
        f"('t', '', 'succeeded', '{note}', '2026-11-{1 + i % 28:02d} 03:00:00', 'host-a', 1, "
        "'', 't', '')"
        for i in range(400)
    )
    project.db.execute(
        "INSERT INTO ops_jobrun (job, slot, outcome, note, started_at, host, pid, rid, command, "
        f"output_tail) VALUES {rows}"
    )
    proc = project.popen("job_history", "--limit=400")
    proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, stderr
    assert stderr == ""


@pytest.mark.django_db
def test_job_history_widens_its_slot_column_for_wall_clock_keys():
    from django.core.management import call_command

    from ops.models import JobRun

    started = at("2026-10-25 00:30:05")
    JobRun.objects.create(
        job="metrics", slot="2026-10-25 02:30+02:00", outcome="succeeded", exit_code=0,
        started_at=started, finished_at=started, duration=0.5, host="web1", pid=1,
    )  # fmt: skip
    out = io.StringIO()
    call_command("job_history", stdout=out)
    header, row, _ = out.getvalue().splitlines()
    # every column starts where its title does: the key does not push the outcome along
    assert row.index("succeeded") == header.index("outcome")
    assert "2026-10-25 02:30+02:00 succeeded" in row


def test_last_success_is_the_latest_slot_that_succeeded_after_a_past_date_run_by_hand(project):
    """Issue 32: today's slot succeeded, then a past date was run by hand; job_status (text and
    --json), the metrics and the jobs page showed the past date as the last success."""
    from .conftest import DAILY, DAILY_DATE

    project.write_cron("t.cron", f"{DAILY} --name=report sleep_demo --seconds=0\n")
    assert project.run_job("--no-ping", "report").returncode == 0
    past = DAILY_DATE - dt.timedelta(days=300)
    assert project.run_job("--no-ping", f"--logical-date={past}", "report").returncode == 0
    [(today_id, finished)] = project.db.query(
        "SELECT id, finished_at FROM ops_jobrun WHERE logical_date = ?", (DAILY_DATE.isoformat(),)
    )
    document = json.loads(project.manage("job_status", "--json", "--job", "report").stdout)
    success = document["jobs"][0]["last_success"]
    assert (success["id"], success["logical_date"]) == (today_id, DAILY_DATE.isoformat())
    assert document["jobs"][0]["last_run"]["logical_date"] == past.isoformat()
    table = project.manage("job_status", "--job", "report").stdout.splitlines()
    assert f"  {DAILY_DATE.isoformat()} " in table[1] and past.isoformat() not in table[1]
    metrics = project.manage("job_status", "--format=prometheus", "--job", "report").stdout
    if not isinstance(finished, dt.datetime):  # SQLite: naive UTC text
        finished = dt.datetime.fromisoformat(finished).replace(tzinfo=UTC)
    name = 'cronops_job_last_success_timestamp_seconds{job_name="report"} '
    [value] = [line.removeprefix(name) for line in metrics.splitlines() if line.startswith(name)]
    assert float(value) == pytest.approx(finished.timestamp(), abs=0.001)


@pytest.mark.django_db
def test_the_jobs_page_and_the_metrics_show_the_same_latest_slot_success_as_job_status(cron_dir):
    from ops import jobs_page
    from ops.monitors import metrics
    from ops.monitors.status_render import success_words

    today = at("2026-11-29 03:00:00")
    common = {"job": "ok-job", "outcome": "succeeded", "exit_code": 0, "host": "web1", "pid": 1}
    served = JobRun.objects.create(
        slot="2026-11-29", logical_date=today.date(), scheduled_at=today,
        started_at=today, finished_at=today + dt.timedelta(seconds=5), **common,
    )  # fmt: skip
    JobRun.objects.create(
        slot="2026-01-15", logical_date=dt.date(2026, 1, 15), scheduled_at=at("2026-01-15 03:00"),
        started_at=at("2026-11-29 11:40"), finished_at=at("2026-11-29 11:41"), **common,
    )  # fmt: skip
    with time_machine.travel(NOW, tick=False):
        report = status.collect(schedule_of(), now=NOW, tz=UTC, only="ok-job")
        [row] = jobs_page.job_rows(report)
    [job] = report.jobs
    assert job.last_success is not None and job.last_success.pk == served.pk
    assert row.last_success == success_words(served, job.grace, UTC) == "2026-11-29 03:00 slot"
    assert (
        f'cronops_job_last_success_timestamp_seconds{{job_name="ok-job"}} '
        f"{served.finished_at.timestamp():.0f}"
    ) in metrics.render(report)
