"""Standby and fencing on one machine: two deployed copies of the project ("host-a" and
"host-b": own directory, .env, OPS_HOST and lock directory) share one database and run
`manage.py run_job` as real processes. Here the holder is on the same machine, so a standby
sees its process end at once; tests/test_standby_hosts.py has separate machines (namespaces),
where only the heartbeat tells.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ops.run import standby
from ops.run.plan import UsageError
from ops.run.standby import run_bound as standby_bound
from ops.schedule.options import parse_run_args

from .conftest import DAILY, PING_KEY, Project, copy_tree, ping_to, wait_for_line

# Appends to RAN_FILE, says "working", then waits for `go` in its own project directory and
# exits with the number in `exit` there (0 without it).
JOB = """
from django.conf import settings
from ops import conf
with open(os.environ["RAN_FILE"], "a") as f:
    f.write(f"{conf.host()}\\n")
print("working", flush=True)
base = settings.BASE_DIR
deadline = time.monotonic() + 120
while not (base / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
code = int((base / "exit").read_text()) if (base / "exit").exists() else 0
if code:
    raise CommandError("told to fail", returncode=code)
print("done", flush=True)
"""


def two_hosts(project: Project, tmp_path: Path, cron: str = f"{DAILY} --standby t_job\n"):
    """host-a (the fixture's copy) and host-b, both with the job; returns (a, b, ran file)."""
    ran = tmp_path / "ran.txt"
    b = Project(copy_tree(tmp_path / "host-b"), project.db, dict(project.settings))
    b.write_env(OPS_HOST="host-b")
    for copy in (project, b):
        copy.add_command("t_job", JOB)
        copy.write_cron("t.cron", cron)
        copy.write_env(RAN_FILE=ran)
    (b.dir / "go").touch()  # host-b's job, when it runs, finishes at once
    return project, b, ran


def executions(ran: Path) -> list[str]:
    return ran.read_text().split() if ran.exists() else []


def holder_working(a: Project) -> subprocess.Popen:
    holder = a.popen("run_job", "t_job")
    wait_for_line(holder, "working")
    return holder


def still_waiting(proc: subprocess.Popen) -> None:
    """A real process, really standing by: it said so (under load a fixed pause once ended
    before it had even read the claim). That it waits for the holder, not a while, the
    test shows by what it says once the holder is done."""
    wait_for_line(proc, "standing by")
    assert proc.poll() is None, proc.communicate()


def runs(db) -> list[tuple]:
    return db.query("SELECT host, outcome, exit_code, note FROM ops_jobrun ORDER BY id")


def test_a_standby_exits_0_once_the_holder_on_another_host_succeeded(project, tmp_path, httpserver):
    a, b, ran = two_hosts(project, tmp_path)
    httpserver.expect_request("").respond_with_data("OK")
    ping_to(b, httpserver)
    holder = holder_working(a)
    waiting = b.popen("run_job", "t_job")
    still_waiting(waiting)
    (a.dir / "go").touch()
    assert holder.wait(60) == 0
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, out + err
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cronops: job t_job: done on host-a for ")
    assert executions(ran) == ["host-a"]
    assert [r[:3] for r in runs(a.db)] == [("host-a", "succeeded", 0), ("host-b", "skipped", 0)]
    assert runs(a.db)[1][3].startswith("done on host-a for ")
    [(path, body)] = [(r.path, r.get_data(as_text=True)) for r, _ in httpserver.log]
    assert path == f"/{PING_KEY}/t_job/log" and body.startswith("done on host-a for ")


def test_a_quiet_standby_says_nothing_when_the_slot_was_done_elsewhere(sqlite_project, tmp_path):
    a, b, _ = two_hosts(sqlite_project, tmp_path)
    b.write_cron("t.cron", f"{DAILY} --standby --quiet t_job\n")
    holder = holder_working(a)
    waiting = b.popen("run_job", "t_job")
    still_waiting(waiting)
    (a.dir / "go").touch()
    assert holder.wait(60) == 0
    out, err = waiting.communicate(timeout=60)
    assert (waiting.returncode, out, err) == (0, "", "")


def test_a_standby_does_not_run_again_a_slot_whose_holder_failed(
    sqlite_project, tmp_path, httpserver
):
    a, b, ran = two_hosts(sqlite_project, tmp_path)
    httpserver.expect_request("").respond_with_data("OK")
    ping_to(b, httpserver)
    holder = holder_working(a)
    waiting = b.popen("run_job", "t_job")
    still_waiting(waiting)
    (a.dir / "exit").write_text("3")
    (a.dir / "go").touch()
    assert holder.wait(60) == 3
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, out + err
    assert "failed on host-a for " in out and "not run again by a standby" in out
    assert executions(ran) == ["host-a"]  # it would fail the same way here, with its own alert
    assert [r[1:3] for r in runs(a.db)] == [("failed", 3), ("skipped", 0)]
    [ping] = [r for r, _ in httpserver.log]
    assert ping.path.endswith("/t_job/log") and "failed on host-a" in ping.get_data(as_text=True)


def test_a_standby_runs_the_slot_when_the_holder_was_terminated(sqlite_project, tmp_path):
    a, b, ran = two_hosts(sqlite_project, tmp_path)
    holder = holder_working(a)
    waiting = b.popen("run_job", "t_job")
    still_waiting(waiting)
    holder.send_signal(signal.SIGTERM)  # host-a shutting down
    assert holder.wait(60) == 143
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, out + err
    assert "the run on host-a was terminated; this standby runs " in err
    assert executions(ran) == ["host-a", "host-b"]
    assert [r[:2] for r in runs(a.db)] == [("host-a", "terminated"), ("host-b", "succeeded")]
    assert a.db.query("SELECT state, version, host FROM ops_slotclaim") == [
        ("succeeded", 2, "host-b")
    ]


def test_a_standby_gives_up_with_75_once_its_bound_has_passed(sqlite_project, tmp_path):
    a, b, ran = two_hosts(sqlite_project, tmp_path, f"{DAILY} --standby=2s t_job\n")
    holder = holder_working(a)
    started = time.monotonic()
    result = b.run_job("t_job")
    assert result.returncode == 75, result.stdout + result.stderr
    assert time.monotonic() - started >= 2
    assert (
        "skipped: running since " in result.stdout and ", host host-a (stood by " in result.stdout
    )
    assert holder.poll() is None
    (a.dir / "go").touch()
    assert holder.wait(60) == 0
    assert executions(ran) == ["host-a"]


def test_without_standby_a_busy_slot_still_exits_75_at_once(sqlite_project, tmp_path):
    a, b, _ = two_hosts(sqlite_project, tmp_path, f"{DAILY} t_job\n")
    holder = holder_working(a)
    result = b.run_job("t_job")
    assert result.returncode == 75, result.stdout + result.stderr
    assert "(stood by" not in result.stdout
    (a.dir / "go").touch()
    assert holder.wait(60) == 0


def test_sigterm_ends_a_standby_wait_at_once_and_claims_nothing(
    sqlite_project, tmp_path, httpserver
):
    a, b, ran = two_hosts(sqlite_project, tmp_path)
    httpserver.expect_request("").respond_with_data("OK")
    ping_to(b, httpserver)
    holder = holder_working(a)
    waiting = b.popen("run_job", "t_job")
    still_waiting(waiting)
    started = time.monotonic()
    waiting.send_signal(signal.SIGTERM)
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 143, out + err
    # At once, skip row written: a standby that did not hear the signal would wait for the
    # holder (here until `go`, or its bound: an hour). Room for a loaded machine's slow exit.
    assert time.monotonic() - started < 10
    assert "standby terminated by SIGTERM while host-a ran " in out
    assert httpserver.log == []  # a host going down pings nothing for a slot it never had
    assert [r[:3] for r in runs(a.db)] == [("host-a", "running", None), ("host-b", "skipped", 143)]
    assert a.db.query("SELECT state, version, host FROM ops_slotclaim") == [
        ("running", 1, "host-a")
    ]
    (a.dir / "go").touch()
    assert holder.wait(60) == 0
    assert executions(ran) == ["host-a"]


def test_ops_standby_makes_every_job_stand_by_and_no_standby_opts_one_out(sqlite_project, tmp_path):
    cron = f"{DAILY} t_job\n{DAILY} --no-standby --name=t-alone t_job\n"
    a, b, _ = two_hosts(sqlite_project, tmp_path, cron)
    b.write_env(OPS_STANDBY="on")
    holder = holder_working(a)
    alone = a.popen("run_job", "t-alone")
    wait_for_line(alone, "working")
    opted_out = b.run_job("t-alone")
    assert opted_out.returncode == 75, opted_out.stdout + opted_out.stderr
    waiting = b.popen("run_job", "t_job")
    still_waiting(waiting)
    (a.dir / "go").touch()
    assert holder.wait(60) == 0 and alone.wait(60) == 0
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and "done on host-a" in out, out + err


def test_a_bad_ops_standby_is_one_line_and_exit_2_with_nothing_recorded(sqlite_project):
    sqlite_project.add_command("t_ok", "print('fine')")
    result = sqlite_project.run_job("t_ok", env={"OPS_STANDBY": "maybe"})
    assert result.returncode == 2
    assert result.stderr == (
        "cronops: error: OPS_STANDBY: 'maybe' (from the environment) is not on or off "
        "(1/0, true/false, yes/no, on/off)\n"
    )
    assert "fine" not in result.stdout
    assert sqlite_project.db.runs() == []


def test_the_standby_bound_is_the_timeout_or_the_default_grace_plus_three_heartbeats(settings):
    settings.OPS_STANDBY = ""
    settings.OPS_DEFAULT_GRACE = "1h"
    assert standby_bound(parse_run_args(["x"]), 30) is None
    assert standby_bound(parse_run_args(["--standby", "--timeout=10m", "x"]), 30) == 690
    assert standby_bound(parse_run_args(["--standby", "x"]), 30) == 3690
    assert standby_bound(parse_run_args(["--standby=5m", "--timeout=1h", "x"]), 30) == 300
    settings.OPS_STANDBY = "Yes"
    assert standby_bound(parse_run_args(["--timeout=2m", "x"]), 1) == 123
    assert standby_bound(parse_run_args(["--no-standby", "x"]), 1) is None
    settings.OPS_STANDBY = "sometimes"
    with pytest.raises(UsageError, match="OPS_STANDBY: 'sometimes' \\(from the setting\\)"):
        standby_bound(parse_run_args(["x"]), 1)
    assert standby_bound(parse_run_args(["--no-standby", "x"]), 1) is None


def test_a_standby_polls_often_enough_for_a_takeover_within_three_heartbeats_and_five_seconds():
    for heartbeat in (0.1, 1, 5, 30, 300):
        assert standby.poll_interval(heartbeat) <= min(5, max(heartbeat, standby.POLL_MIN))


# --- fencing: a holder that lost its claim ---------------------------------------------------


def take_over_behind_its_back(project: Project) -> None:
    """What another host's standby does once the holder's heartbeat looks stale: version + 1,
    the claim on a run of its own (simulated in SQL: the holder here beats every 30 s)."""
    # With the slot's instant and date, as a real takeover's run has them: job_status judges
    # the due slot by them (in the hour after midnight, yesterday's slot is the due one).
    project.db.execute(
        "INSERT INTO ops_jobrun (job, slot, logical_date, scheduled_at, outcome, note, "
        "started_at, host, pid, rid, command, output_tail) SELECT job, slot, logical_date, "
        "scheduled_at, 'running', '', started_at, 'host-z', 7, '', 't_job', '' FROM ops_slotclaim"
    )
    [(run_id,)] = project.db.query("SELECT max(id) FROM ops_jobrun")
    project.db.execute(
        "UPDATE ops_slotclaim SET version = version + 1, host = 'host-z', run_id = ?, "
        "holder_boot_id = 'boot-of-host-z', pid = 7, heartbeat_at = CURRENT_TIMESTAMP",
        (run_id,),
    )


def test_a_run_that_ends_after_its_claim_was_taken_over_is_recorded_taken_over_not_succeeded(
    project, httpserver
):
    httpserver.expect_request("").respond_with_data("OK")
    ping_to(project, httpserver)
    project.add_command("t_job", JOB)
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    project.write_env(RAN_FILE=project.dir / "ran.txt")
    holder = holder_working(project)
    take_over_behind_its_back(project)
    (project.dir / "go").touch()  # it ends before its next heartbeat (30 s) could tell it
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 75, out + err
    said = [line for line in err.splitlines() if line.startswith("cronops:")]
    assert len(said) == 1
    assert "was taken over by run #2 on host-z (claim version 2)" in said[0]
    rows = project.db.query("SELECT id, outcome, exit_code, note FROM ops_jobrun ORDER BY id")
    assert [r[1:3] for r in rows] == [("taken_over", 75), ("running", None)]
    assert rows[0][3].endswith("the job had ended by then (succeeded)")
    # the claim stays the new holder's
    assert project.db.query("SELECT state, version, run_id FROM ops_slotclaim") == [
        ("running", 2, 2)
    ]
    paths = [r.path for r, _ in httpserver.log]
    assert paths == [f"/{PING_KEY}/t_job/start", f"/{PING_KEY}/t_job/log"]


# Prints what it can tell about its claim, as a job that needs fencing would ask.
ASKS = """
from django.db import transaction
from ops.claims import current_claim
claim = current_claim()
if claim is None:
    print("no claim", os.environ.get("OPS_CLAIM_VERSION"), flush=True)
    raise SystemExit(0)
print("claim", claim.job, claim.slot, claim.version, claim.run_id, claim.still_held(), flush=True)
child = subprocess.run(
    ["sh", "-c", 'echo "child $OPS_JOB $OPS_SLOT $OPS_CLAIM_VERSION $OPS_RUN_ID"'],
    capture_output=True, text=True,
)
print(child.stdout.strip(), flush=True)
from django.conf import settings
while not (settings.BASE_DIR / "go").exists():
    time.sleep(0.05)
with transaction.atomic():
    print("after", claim.still_held(lock=True), flush=True)
"""


def test_a_job_can_ask_whether_it_still_holds_its_claim(project):
    for name in ("t_ask", "t_ask_ad_hoc"):
        project.add_command(name, ASKS)
        path = project.dir / f"commands/management/commands/{name}.py"
        path.write_text("import subprocess\n" + path.read_text())
    project.write_cron("t.cron", f"{DAILY} t_ask\n")
    asking = project.popen("run_job", "t_ask")
    seen = wait_for_line(asking, "child ")
    [slot] = project.db.query("SELECT slot FROM ops_slotclaim")[0]
    assert f"claim t_ask {slot} 1 1 True" in seen
    assert f"child t_ask {slot} 1 1" in seen
    take_over_behind_its_back(project)
    (project.dir / "go").touch()
    out, err = asking.communicate(timeout=60)
    assert "after False" in out, out + err
    assert asking.returncode == 75
    # no slot, no claim: nor one inherited from a parent run_job's environment
    ad_hoc = project.run_job("t_ask_ad_hoc", env={"OPS_CLAIM_VERSION": "9"})
    assert ad_hoc.returncode == 0, ad_hoc.stderr
    assert "no claim None" in ad_hoc.stdout


def test_a_taken_over_run_is_neither_a_failure_nor_the_last_attempt_in_job_status(project):
    project.add_command("t_job", JOB)
    project.write_cron("t.cron", f"{DAILY} t_job\n")
    project.write_env(RAN_FILE=project.dir / "ran.txt")
    holder = holder_working(project)
    take_over_behind_its_back(project)
    (project.dir / "go").touch()
    assert holder.wait(60) == 75
    result = project.manage("job_status", "--json", "--job", "t_job")
    job = json.loads(result.stdout)["jobs"][0]
    # host-z's run (which took the slot over) is the job's latest attempt: still running
    assert (job["state"], job["last_run"]["host"]) == ("running", "host-z"), job
    project.db.execute(
        "UPDATE ops_jobrun SET outcome = 'succeeded', exit_code = 0, finished_at = started_at, "
        "duration = 1 WHERE host = 'host-z'"
    )
    project.db.execute("UPDATE ops_slotclaim SET state = 'succeeded'")
    result = project.manage("job_status", "--json", "--job", "t_job")
    assert result.returncode == 0, result.stdout + result.stderr
    job = json.loads(result.stdout)["jobs"][0]
    assert (job["state"], job["consecutive_failures"]) == ("ok", 0)
    assert job["last_run"]["outcome"] == "succeeded"


def test_env_names_for_child_processes_are_documented():
    readme = (Path(__file__).resolve().parent.parent / "docs" / "several-servers.md").read_text()
    for name in ("OPS_JOB", "OPS_SLOT", "OPS_CLAIM_VERSION", "OPS_RUN_ID", "OPS_STANDBY"):
        assert f"`{name}`" in readme, name
    assert os.environ.get("OPS_CLAIM_VERSION") is None  # nothing leaked into the test runner


@pytest.mark.parametrize(
    ("given", "passed"),
    [
        ({"standby": False}, "--no-standby"),
        ({"standby": True}, "--standby"),
        ({"standby": 1800.0}, "--standby=1800.0"),
    ],
)
def test_call_command_passes_the_standby_choice_to_the_runner(monkeypatch, given, passed):
    from django.core.management import call_command

    seen = []
    monkeypatch.setattr("ops.run.runner.run", lambda argv, **kwargs: seen.append(argv) or 0)
    call_command("run_job", "clearsessions", **given)
    assert seen == [[passed, "clearsessions"]]
    assert parse_run_args(seen[0]).standby == given["standby"]
