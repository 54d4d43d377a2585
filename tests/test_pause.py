"""job_pause and job_resume across real fires (manage.py processes, SQLite and PostgreSQL), with
the job's check on the healthchecks stand-in (tests/hcserver.py, the server's own rules).

The server's rules that decide what a pause does there (hc/api/models.py `Check.ping`,
hc/api/views.py `pause`, `resume`): a ping resumes a paused check unless it has `manual_resume`
(then every ping is ignored while paused); `/log` never changes a status; a resumed check is
`new`, which is never evaluated (never goes down) until a success or failure reaches it.
"""

import datetime as dt
import json
import os
import re
import subprocess

import pytest

from .conftest import DAILY, DAILY_DATE, PING_KEY
from .hcserver import API_KEY, READ_KEY
from .test_prometheus import PROMTOOL

MARKER_COMMAND = """
with open({path!r}, "a") as marks:
    marks.write((options["logical_date"] or "-") + "\\n")
print("ran")
"""


def ok(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture
def nightly(project, hc, tmp_path):
    """`nightly`, a daily job that catches up 5 days and writes each date it runs to a file;
    its check made and armed by sync_healthchecks on the stand-in."""
    return make_nightly(project, hc, tmp_path)


@pytest.fixture
def nightly_sqlite(sqlite_project, hc, tmp_path):
    """The same on SQLite only: for what the database does not change (healthchecks.io's side)."""
    return make_nightly(sqlite_project, hc, tmp_path)


def make_nightly(project, hc, tmp_path):
    marks = tmp_path / "marks"
    project.add_command(
        "t_mark",
        MARKER_COMMAND.format(path=str(marks)),
        arguments='parser.add_argument("--logical-date")',
    )
    project.write_cron("t.cron", f"{DAILY}  --catch-up=5 --name=nightly t_mark\n")
    project.write_env(
        HEALTHCHECKS_PING_URL=hc.ping_url,
        HEALTHCHECKS_PING_KEY=PING_KEY,
        HEALTHCHECKS_API_URL=hc.api_url,
        HEALTHCHECKS_API_KEY=API_KEY,
        HEALTHCHECKS_CHANNELS="",
    )
    ok(project.manage("sync_healthchecks"))
    assert hc.check("nightly").status == "up"  # armed
    return marks


def day(days_ago: int) -> str:
    return (DAILY_DATE - dt.timedelta(days=days_ago)).isoformat()


def ran(marks) -> list[str]:
    return marks.read_text().split() if marks.exists() else []


def skips(project) -> list[tuple]:
    return [(r[1], r[4], r[5]) for r in project.db.runs("nightly") if r[3] == "skipped"]


def as_utc(value) -> dt.datetime:
    """A datetime column as read: aware on PostgreSQL, naive UTC text on SQLite."""
    value = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=value.tzinfo or dt.UTC)


def set_pause_until(project, when: dt.datetime) -> None:
    """Moves the pause's end, stored as Django stores it (naive UTC text on SQLite)."""
    value = when
    if project.db.backend == "sqlite":
        value = str(when.astimezone(dt.UTC).replace(tzinfo=None))
    project.db.execute("UPDATE ops_jobpause SET until = ?", (value,))


def writes_since(hc, count: int) -> list[tuple]:
    return [(path.rsplit("/", 1)[-1], body) for _, path, body in hc.writes()[count:]]


def test_a_paused_job_runs_nothing_records_each_slot_once_and_catch_up_never_replays_it(
    project, hc, nightly
):
    check = hc.check("nightly")
    ok(project.run_job(f"--logical-date={day(5)}", "nightly"))  # the first claim: the floor
    assert ran(nightly) == [day(5)]
    before = len(hc.writes())

    paused = ok(project.manage("job_pause", "nightly", "--reason=database migration"))
    assert re.match(
        r"paused nightly by \S+ \(command line\) since .* UTC, until resumed: database migration\n",
        paused.stdout,
    )
    assert "healthchecks.io: paused its check 'nightly'" in paused.stdout
    # manual_resume first, then the pause: no ping of the paused job can resume (page) it
    assert writes_since(hc, before) == [(check.uuid, {"manual_resume": True}), ("pause", None)]
    assert (check.status, check.manual_resume) == ("paused", True)

    fires = [ok(project.run_job("nightly")) for _ in range(2)]  # two fires of today's slot
    ok(project.run_job(f"--logical-date={day(2)}", "nightly"))  # and one by hand
    assert ran(nightly) == [day(5)]  # the command never ran
    assert "paused by " in fires[0].stdout
    assert f"({day(0)} is recorded as paused already)" in fires[1].stdout
    recorded = skips(project)
    assert [(slot, code) for slot, code, _ in recorded] == [(day(0), 0), (day(2), 0)]
    assert all(
        re.fullmatch(r"paused by .* since .* UTC, until resumed: database migration", n)
        for _, _, n in recorded
    )
    logs = [p for p in hc.pings_of("nightly") if p.kind == "log"]
    assert len(logs) == 2  # one per recorded slot, each ignored by the paused check
    assert {p.action for p in logs} == {"ign"}
    assert check.status_at() == "paused"

    status = ok(project.manage("job_status", "--json", "--job", "nightly"))
    job = json.loads(status.stdout)["jobs"][0]
    assert job["state"] == "paused"
    assert job["paused"]["reason"] == "database migration"
    assert job["paused"]["by"].endswith("(command line)")
    assert job["paused"]["until"] is None
    assert job["reason"].startswith(f"by {job['paused']['by']} since ")
    metrics = ok(project.manage("job_status", "--format=prometheus")).stdout
    assert 'cronops_job_state{job_name="nightly",state="paused"} 1' in metrics
    assert 'cronops_job_state{job_name="nightly",state="failing"} 0' in metrics
    paused_sample = (
        r'cronops_job_paused\{job_name="nightly",paused_by="[^"]+",reason="database migration"\} 1'
    )
    assert re.search(paused_sample, metrics)
    if os.access(PROMTOOL, os.X_OK):  # Debian's prometheus package: the format and its lint
        checked = subprocess.run(
            [PROMTOOL, "check", "metrics"], input=metrics.encode(), capture_output=True
        )
        assert (checked.returncode, checked.stdout + checked.stderr) == (0, b"")

    before = len(hc.writes())
    resumed = ok(project.manage("job_resume", "nightly"))
    assert "healthchecks.io: resumed its check 'nightly' and armed it: alerts at " in resumed.stdout
    # its own manual_resume back first (should the resume fail, a ping resumes it), then resumed
    assert writes_since(hc, before) == [(check.uuid, {"manual_resume": False}), ("resume", None)]
    assert check.manual_resume is False
    assert check.status_at() == "up"  # armed: new checks are never evaluated until pinged
    assert check.going_down_after() is not None
    assert hc.pings_of("nightly")[-1].body.startswith(b"cronops: resumed by ")

    ok(project.run_job("nightly"))  # catch-up: 4, 3 and 1 days ago, not 2 (paused), then today
    assert ran(nightly) == [day(5), day(4), day(3), day(1), day(0)]
    assert check.status_at() == "up"
    kinds = project.db.query("SELECT kind, username FROM ops_jobaction ORDER BY id")
    assert [kind for kind, _ in kinds] == ["pause", "resume"]
    assert all(user.endswith("(command line)") for _, user in kinds)


def test_a_pause_with_until_ends_at_the_first_fire_after_it_and_its_check_is_watched_again(
    project, hc, nightly
):
    check = hc.check("nightly")
    before = dt.datetime.now(dt.UTC)
    ok(project.manage("job_pause", "nightly", "--until=1h", "--reason=deploy"))
    after = dt.datetime.now(dt.UTC)
    [(since, until)] = project.db.query("SELECT since, until FROM ops_jobpause")
    assert before <= as_utc(since) <= after
    assert as_utc(until) - as_utc(since) == dt.timedelta(hours=1)  # --until=1h from its start
    first = ok(project.run_job("nightly"))
    assert "paused by " in first.stdout
    assert check.status == "paused"
    assert project.db.query("SELECT ended_at FROM ops_jobpause") == [(None,)]

    # The hour passes (its `until` moved to an instant between the two fires, rather than
    # waited for): the next fire ends the pause by itself and runs the slot once.
    until = dt.datetime.now(dt.UTC)
    set_pause_until(project, until)
    last = ok(project.run_job("nightly"))
    assert "has ended" in last.stdout
    assert "healthchecks.io: resumed its check 'nightly' and armed it" in last.stdout
    assert ran(nightly) == [day(0)]
    outcomes = [(r[1], r[3]) for r in project.db.runs("nightly")]
    assert outcomes == [(day(0), "skipped"), (day(0), "succeeded")]
    # The check: resumed and armed before the run's own start and success reached it.
    assert (check.manual_resume, check.status_at()) == (False, "up")
    tail = [(p.kind, p.action) for p in hc.pings_of("nightly")][-3:]
    assert tail == [("success", "success"), ("start", "start"), ("success", "success")]
    audit = project.db.query("SELECT kind, username FROM ops_jobaction ORDER BY id")
    assert audit[-1] == ("resume", "cronops (--until)")
    [(ended_at,)] = project.db.query("SELECT ended_at FROM ops_jobpause")
    assert as_utc(ended_at) == until  # ended at its until, not when the fire saw it
    status = json.loads(ok(project.manage("job_status", "--json", "--job", "nightly")).stdout)
    assert (status["jobs"][0]["state"], status["jobs"][0]["paused"]) == ("ok", None)


def test_fires_of_one_paused_slot_at_the_same_moment_record_it_once(project, hc, nightly):
    ok(project.manage("job_pause", "nightly"))
    fires = [project.popen("run_job", "nightly") for _ in range(4)]
    for fire in fires:
        out, err = fire.communicate(timeout=120)
        assert fire.returncode == 0, out + err
    assert [(slot, code) for slot, code, _ in skips(project)] == [(day(0), 0)]
    assert ran(nightly) == []


def test_pausing_without_an_api_key_pauses_the_job_and_says_its_check_is_not(project, tmp_path):
    project.add_command("t_ok", "print('ran')")
    project.write_cron("t.cron", f"{DAILY}  --name=nightly t_ok\n")
    paused = ok(project.manage("job_pause", "nightly", "--until=3d"))
    assert re.match(r"paused nightly by .* until \S+ \S+ UTC\n", paused.stdout)
    assert "HEALTHCHECKS_API_KEY is not set: its check (if any) is not paused" in paused.stdout
    fire = ok(project.run_job("nightly"))
    assert "ran" not in fire.stdout


def test_an_unknown_job_or_an_until_in_the_past_is_a_usage_error(project):
    project.write_cron("t.cron", f"{DAILY}  --name=nightly sleep_demo --seconds=0\n")
    unknown = project.manage("job_pause", "nightly-typo")
    assert (unknown.returncode, unknown.stderr.strip()) == (
        2,
        "CommandError: no job named 'nightly-typo' in crontab.d or in the run history",
    )
    past = project.manage("job_pause", "nightly", "--until=2020-01-01")
    assert past.returncode == 2
    assert "--until 2020-01-01 is not in the future" in past.stderr
    bad = project.manage("job_pause", "nightly", "--until=tomorrow")
    assert bad.returncode == 2
    assert "use a duration (2h, 90m, 3d), a date (2026-12-07)" in bad.stderr
    assert project.db.query("SELECT count(*) FROM ops_jobpause") == [(0,)]
    resumed = ok(project.manage("job_resume", "nightly"))
    assert resumed.stdout.strip() == "nightly is not paused"


@pytest.mark.process
def test_pausing_a_paused_job_again_pauses_its_check_when_the_first_try_could_not(
    project, hc, nightly
):
    """Before: with the API down the first job_pause exited 1 (check not paused); the second,
    with the API back, said "was paused already" and made no call: the check stayed up."""
    check = hc.check("nightly")
    hc.api_fail_with = (503, {"error": "down for maintenance"})
    first = project.manage("job_pause", "nightly", "--reason=migration")
    assert first.returncode == 1, first.stdout + first.stderr
    assert "could not pause its check" in first.stderr
    assert check.status == "up"

    hc.api_fail_with = None
    again = ok(project.manage("job_pause", "nightly"))
    assert "nightly was paused already; now paused" in again.stdout
    assert "healthchecks.io: paused its check 'nightly'" in again.stdout
    assert (check.status, check.manual_resume) == ("paused", True)
    [(paused, manual_resume)] = project.db.query(
        "SELECT check_paused, check_manual_resume FROM ops_jobpause"
    )
    assert (bool(paused), manual_resume in (0, False)) == (True, True)

    third = ok(project.manage("job_pause", "nightly"))  # paused on the server now: no call
    assert "healthchecks.io" not in third.stdout
    before = len(hc.writes())
    ok(project.manage("job_resume", "nightly"))  # its own manual_resume (off) given back
    assert writes_since(hc, before) == [(check.uuid, {"manual_resume": False}), ("resume", None)]
    assert check.manual_resume is False


# --- a check that could not be paused is exit 1, one line (issue 29, item 10) ----------------


def not_paused(project, *args) -> str:
    """job_pause's one-line error when the job is paused but its check is not (exit 1)."""
    result = project.manage("job_pause", "nightly", *args)
    assert result.returncode == 1, result.stdout + result.stderr
    # The job itself is paused (or stays so).
    assert re.match(r"(paused nightly|nightly was paused already; now paused) by ", result.stdout)
    [line] = result.stderr.splitlines()
    assert line.startswith("CommandError: healthchecks.io: its check was not paused: ")
    assert line.endswith(" (the job is paused)")
    assert API_KEY not in line and READ_KEY not in line and PING_KEY not in line
    return line


def test_pausing_with_the_read_only_api_key_is_exit_1_and_the_check_stays_up(
    sqlite_project, hc, nightly_sqlite
):
    # Before: exit 0 with `… it cannot pause checks`, and the check stayed up, alerting.
    project, check = sqlite_project, hc.check("nightly")
    project.write_env(HEALTHCHECKS_API_KEY=READ_KEY)
    line = not_paused(project)
    assert "HEALTHCHECKS_API_KEY is the project's read-only API key" in line
    assert check.status == "up"
    assert not_paused(project) == line  # pausing again tries again, and says so again
    hc.checks.clear()  # none to list: the read-only key is still what is said
    assert "read-only API key" in not_paused(project)


def test_pausing_a_job_whose_slug_has_no_check_or_two_is_exit_1(sqlite_project, hc, nightly_sqlite):
    # Before: exit 0 for both, as if there were nothing to pause.
    project, check = sqlite_project, hc.check("nightly")
    twin = hc.add(slug="nightly", kind="cron", schedule="0 3 * * *", status="up")
    line = not_paused(project)
    assert "2 checks share the slug 'nightly'" in line
    assert (check.status, twin.status) == ("up", "up")
    del hc.checks[check.uuid], hc.checks[twin.uuid]
    line = not_paused(project)
    assert "no check with the slug 'nightly' on healthchecks.io (run sync_healthchecks)" in line
    resumed = ok(project.manage("job_resume", "nightly"))  # no check was paused: none to resume
    assert resumed.stdout.startswith("resumed nightly (paused by ")
    assert "healthchecks.io" not in resumed.stdout + resumed.stderr


def test_resuming_with_the_read_only_api_key_is_exit_1_and_the_next_resume_does_it(
    sqlite_project, hc, nightly_sqlite
):
    project, check = sqlite_project, hc.check("nightly")
    ok(project.manage("job_pause", "nightly"))
    assert check.status == "paused"
    project.write_env(HEALTHCHECKS_API_KEY=READ_KEY)
    failed = project.manage("job_resume", "nightly")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert failed.stdout.startswith("resumed nightly (paused by ")
    [line] = failed.stderr.splitlines()
    assert line.startswith("CommandError: healthchecks.io: could not resume its check: ")
    assert "not a read-write API key" in line and READ_KEY not in line
    assert check.status == "paused"
    project.write_env(HEALTHCHECKS_API_KEY=API_KEY)
    again = ok(project.manage("job_resume", "nightly"))
    assert "nightly is not paused" in again.stdout
    assert "healthchecks.io: resumed its check 'nightly' and armed it" in again.stdout
    assert check.status_at() == "up"


def test_pausing_a_job_that_pings_its_slug_on_another_server_says_there_is_no_check_here(
    sqlite_project, hc
):
    # sync makes no check here for such a job: before, job_pause looked for its slug here.
    project = sqlite_project
    project.add_command("t_ok", "print('ran')")
    url = f"https://hc.example.com/ping/{PING_KEY}/nightly"
    project.write_cron("t.cron", f"{DAILY}  --name=nightly --ping={url} t_ok\n")
    project.write_env(
        HEALTHCHECKS_PING_URL=hc.ping_url,
        HEALTHCHECKS_PING_KEY=PING_KEY,
        HEALTHCHECKS_API_URL=hc.api_url,
        HEALTHCHECKS_API_KEY=API_KEY,
    )
    paused = ok(project.manage("job_pause", "nightly"))
    assert paused.stdout.splitlines()[-1] == (
        "healthchecks.io: its --ping URL is on another server: pause its check there"
    )
