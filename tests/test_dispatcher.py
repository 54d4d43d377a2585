"""The warm dispatcher (issue 33): `manage.py run_due_jobs`, one cron line a minute, starts the
crontab.d jobs Debian's cron would start in that minute, each as run_job (forked from the warm
process, so every guarantee of run_job holds), and never waits for them.

The firing rules are ops/schedule/firing.py, the model bench/faults/f7_clock.py checks against
the real daemon under libfaketime; here they are also held against cronsim's fire instants
(the slot maths), minute by minute over both Europe/Berlin DST nights of 2027.
"""

import datetime as dt
import json
import os
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from ops.schedule.crontabd import parse_text
from ops.schedule.firing import Daemon, Expr, minutes

from .conftest import wait_until

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")
# Fixed-time and wildcard jobs around the two hours that change (02:00-03:00 local).
NIGHT_JOBS = """\
* * * * *      --no-ping --name=minutely stamp
*/15 * * * *   --no-ping --name=quarter stamp
0 * * * *      --no-ping --name=hourly stamp
30 2 * * *     --no-ping --name=at0230 stamp
0 2 * * *      --no-ping --name=at0200 stamp
59 1 * * *     --no-ping --name=at0159 stamp
0 3 * * *      --no-ping --name=at0300 stamp
15 2 * * 0     --no-ping --name=sunday0215 stamp
0 2-3 * * *    --no-ping --name=at2and3 stamp
@reboot        --no-ping --name=booted stamp
"""
NIGHTS = {
    # 02:00 CET jumps to 03:00 CEST (01:00 UTC)
    "spring": dt.datetime(2027, 3, 27, 22, 0, tzinfo=UTC),
    # 03:00 CEST falls back to 02:00 CET (01:00 UTC)
    "autumn": dt.datetime(2027, 10, 30, 22, 0, tzinfo=UTC),
}


def night_jobs():
    from django.core.management import get_commands

    commands = {**get_commands(), "stamp": "tests"}
    return [j for j in parse_text(NIGHT_JOBS, "night.cron", commands).jobs]


def cronsim_starts(expr: str, first: dt.datetime, last: dt.datetime) -> set[dt.datetime]:
    """The minutes (UTC) at which cronsim, Debian's DST rules included, has `expr` fire."""
    found = set()
    for fire in CronSim(expr, (first - dt.timedelta(minutes=1)).astimezone(BERLIN)):
        at = fire.astimezone(UTC)
        if at > last:
            break
        found.add(at)
    return found


@pytest.mark.parametrize("night", sorted(NIGHTS))
def test_on_a_dst_night_the_dispatcher_starts_each_job_exactly_when_crons_per_job_line_would(
    night,
):
    from ops.run.dispatch import due_jobs

    jobs = night_jobs()
    timed = [j for j in jobs if j.cron_expr is not None]
    first = NIGHTS[night]
    last = first + dt.timedelta(hours=6)
    # The model of the daemon (F7's, checked against the real one), woken every minute from
    # long before the night: the per-job lines' starts.
    daemon = Daemon({j.name: Expr(j.cron_expr) for j in timed})
    for reading in minutes(first - dt.timedelta(hours=4), first - dt.timedelta(minutes=1)):
        daemon.wake(reading.astimezone(BERLIN))
    by_cron: dict[str, set] = {j.name: set() for j in timed}
    by_dispatcher: dict[str, set] = {j.name: set() for j in timed}
    for reading in minutes(first, last):
        for name in daemon.wake(reading.astimezone(BERLIN)):
            by_cron[name].add(reading)
        # The dispatcher knows nothing but the minute it runs at.
        for job in due_jobs(jobs, reading + dt.timedelta(seconds=1), BERLIN):
            by_dispatcher[job.name].add(reading)
    assert by_dispatcher == by_cron
    # And both are cronsim's fire instants, which the slots of run_job are made of: the
    # skipped hour's fixed-time jobs once at 03:00 CEST, none twice in the repeated hour,
    # wildcard jobs again in it.
    assert by_cron == {j.name: cronsim_starts(j.cron_expr, first, last) for j in timed}
    jump = dt.datetime(2027, 3, 28, 1, 0, tzinfo=UTC)  # 03:00 CEST
    if night == "spring":
        for name in ("at0230", "at0200", "sunday0215", "at2and3", "hourly", "quarter"):
            assert jump in by_cron[name], name
        assert len(by_cron["at2and3"]) == 1  # 02:00 and 03:00 fall on one instant
    else:
        first_0230 = dt.datetime(2027, 10, 31, 0, 30, tzinfo=UTC)  # 02:30 CEST
        second_0230 = dt.datetime(2027, 10, 31, 1, 30, tzinfo=UTC)  # 02:30 CET
        assert first_0230 in by_cron["at0230"] and second_0230 not in by_cron["at0230"]
        assert {first_0230, second_0230} <= by_cron["quarter"]
        assert len(by_cron["hourly"]) == 7  # 00:00 … 05:00 CET/CEST, 02:00 twice
    assert all(j.name != "booted" for j in timed)  # @reboot keeps its own line


# A clock changed without DST (by hand, by NTP) and a late wake-up of cron: cron sees them only
# through its virtual minute (firing.py), which the dispatcher keeps in a state file
# (ops/run/virtual_minute.py). Stepped forward or woken late, cron starts the fixed-time jobs
# of the skipped minutes; stepped back, it does not start them again.
CLOCK_CHANGES = {
    # June (no DST): at 02:10 the clock is set to 03:10; at 03:10 it is set back to 02:10
    "stepped forward 1 h": (dt.datetime(2027, 6, 9, 22, 0, tzinfo=UTC), 130, 60),
    "stepped back 1 h": (dt.datetime(2027, 6, 9, 22, 0, tzinfo=UTC), 190, -60),
    # cron wakes at 02:03 instead of 01:59 (it slept through 4 minutes; the clock is right)
    "cron woke 4 minutes late": (dt.datetime(2027, 6, 9, 22, 0, tzinfo=UTC), 119, 4),
}


def remembering(path: Path, monotonic: list[float]):
    """The dispatcher's state file at `path`, on one boot, its monotonic clock `monotonic[0]`
    seconds (a test moves it with the real minutes)."""
    from ops.run.virtual_minute import VirtualMinute

    said: list[str] = []
    memory = VirtualMinute(path, said.append, boot="a boot", monotonic=lambda: monotonic[0])
    return memory, said


@pytest.mark.parametrize("change", sorted(CLOCK_CHANGES))
def test_a_clock_changed_without_dst_is_met_by_the_dispatcher_as_cron_meets_it(change, tmp_path):
    from ops.run.dispatch import due_jobs

    jobs = night_jobs()
    timed = [j for j in jobs if j.cron_expr is not None]
    start, at, step = CLOCK_CHANGES[change]
    late = change.startswith("cron woke")
    # (real minute, what the clock reads) at each of cron's wake-ups (late: the missed minutes
    # have none, and the clock is right).
    readings = [
        (i, start + dt.timedelta(minutes=i + (step if i >= at and not late else 0)))
        for i in range(300)
        if not (late and at <= i < at + step)
    ]
    daemon = Daemon({j.name: Expr(j.cron_expr) for j in timed})
    for reading in minutes(start - dt.timedelta(hours=4), start - dt.timedelta(minutes=1)):
        daemon.wake(reading.astimezone(BERLIN))
    monotonic = [0.0]
    memory, said = remembering(tmp_path / "run_due_jobs.state", monotonic)
    by_cron: dict[str, set] = {j.name: set() for j in timed}
    by_dispatcher: dict[str, set] = {j.name: set() for j in timed}
    for i, reading in readings:
        for name in daemon.wake(reading.astimezone(BERLIN)):
            by_cron[name].add(i)
        monotonic[0] = 3600.0 + i * 60 + 1
        for job in due_jobs(jobs, reading + dt.timedelta(seconds=1), BERLIN, memory):
            by_dispatcher[job.name].add(i)
    assert by_dispatcher == by_cron
    assert said == []
    # And each is a change the minute alone does not see.
    if change == "stepped back 1 h":
        assert by_cron["at0230"] == {150}  # not again at the second 02:30
        assert 210 in alone(jobs, readings, "at0230")
    elif change == "stepped forward 1 h":
        assert by_cron["at0230"] == {130}  # the skipped 02:30, at 03:10
        assert 130 not in alone(jobs, readings, "at0230")
    else:
        assert by_cron["at0200"] == {123}  # the missed 02:00, at 02:03
        assert alone(jobs, readings, "at0200") == set()


def alone(jobs, readings, name: str) -> set[int]:
    """The real minutes a dispatcher without state starts `name` in."""
    from ops.run.dispatch import due_jobs

    return {
        i
        for i, reading in readings
        for job in due_jobs(jobs, reading + dt.timedelta(seconds=1), BERLIN)
        if job.name == name
    }


def use_only(project, name: str, text: str) -> None:
    for path in (project.dir / "crontab.d").glob("*.cron"):
        path.unlink()
    project.write_cron(name, text)


STAMP = """
from django.conf import settings
from pathlib import Path
name = os.environ.get("OPS_JOB", "?")
print("ran", name, "parent", os.getppid(), "slot", os.environ.get("OPS_SLOT"), flush=True)
release = Path(settings.BASE_DIR) / "release"
if options["wait"]:
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def finished(project, names):
    def check():
        runs = project.db.runs()
        done = {r[0] for r in runs if r[3] != "running"}
        return runs if set(names) <= done else None

    return check


@pytest.mark.process
def test_the_dispatcher_starts_exactly_the_due_jobs_each_through_run_job_with_its_log(
    sqlite_project,
):
    project = sqlite_project
    project.add_command("stamp", STAMP, 'parser.add_argument("--wait", action="store_true")')
    # Monday 2027-01-04 03:00 UTC: due are the first four.
    use_only(
        project,
        "10-jobs.cron",
        "* * * * *      --no-ping --name=every-minute stamp\n"
        "0 3 * * *      --no-ping --catch-up=1 --name=nightly stamp\n"
        "0 3 4 1 *      --no-ping --name=yearly stamp\n"
        "0 3 * * 1      --no-ping --name=mondays stamp\n"
        "30 3 * * *     --no-ping --name=later stamp\n"
        "0 3 * * 2      --no-ping --name=tuesdays stamp\n"
        "@reboot        --no-ping --name=booted stamp\n",
    )
    due = ["every-minute", "nightly", "yearly", "mondays"]
    dry = project.manage("run_due_jobs", "--dry-run", "--at", "2027-01-04 03:00")
    assert dry.returncode == 0, dry.stderr
    assert [line.split("--name=")[1].split()[0] for line in dry.stdout.splitlines()] == due
    assert project.db.runs() == []  # a dry run starts nothing
    state = project.dir / "var" / "lock" / "run_due_jobs.state"

    result = project.manage("run_due_jobs", "--at", "2027-01-04 03:00")
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")  # quiet: cron mails nothing
    runs = wait_until(finished(project, due), "the four due jobs to finish", 60)
    assert sorted({r[0] for r in runs}) == sorted(due)
    assert all(r[3] == "succeeded" for r in runs), runs
    # Each through run_job: a claim for its slot (run_job's own, at the real time) …
    claimed = {row[0] for row in project.db.query("SELECT job FROM ops_slotclaim")}
    assert claimed == set(due)
    # … and the installed line's --log=OPS_LOG_DIR/<job>.log, with the job's output.
    logs = project.dir / "var" / "log"
    assert sorted(p.stem for p in logs.glob("*.log")) == sorted(due)
    for name in due:
        assert f"ran {name} " in (logs / f"{name}.log").read_text()
    assert not state.exists()  # --at asks as a first run: cron's virtual minute is not touched


@pytest.mark.process
def test_a_long_job_does_not_keep_the_dispatcher_and_it_leaves_no_zombie_and_no_child(
    sqlite_project,
):
    project = sqlite_project
    project.add_command("stamp", STAMP, 'parser.add_argument("--wait", action="store_true")')
    use_only(project, "10-jobs.cron", "* * * * * --no-ping --name=long stamp --wait\n")
    dispatcher = project.popen("run_due_jobs")
    # It exits while the job still runs (the job waits for a file nobody writes yet).
    out, err = dispatcher.communicate(timeout=60)
    assert dispatcher.returncode == 0, err
    assert (out, err) == ("", "")
    # cron's virtual minute, kept for the next minute's dispatcher: private to the app user
    state = project.dir / "var" / "lock" / "run_due_jobs.state"
    assert state.stat().st_mode & 0o777 == 0o600
    assert '"virtual": ' in state.read_text()
    log = project.dir / "var" / "log" / "long.log"
    started = wait_until(lambda: "ran long" in read(log) and read(log), "the job to start", 60)
    assert project.db.runs("long")[0][3] == "running"
    # run_job is nobody's child here: not the dispatcher's (gone, reaped by this test), and
    # not a zombie left under it.
    run_job = int(started.split(" parent ")[1].split()[0])  # the job's parent
    assert state_of(run_job) not in ("Z", "gone")
    assert parent_of(run_job) not in (dispatcher.pid, os.getpid())
    assert not [pid for pid in children_of(os.getpid()) if state_of(pid) == "Z"]
    (project.dir / "release").write_text("")
    wait_until(finished(project, ["long"]), "the long job to finish", 60)
    assert project.db.runs("long")[0][3] == "succeeded"


@pytest.mark.process
def test_install_crontab_dispatcher_installs_one_line_a_minute_and_reboot_lines_and_back(
    sqlite_project, tmp_path
):
    project = sqlite_project
    use_only(
        project,
        "10-jobs.cron",
        "0 3 * * *   --no-ping --name=nightly stamp\n"
        "*/5 * * * * --no-ping --name=often stamp\n"
        "@reboot     --no-ping --name=booted stamp\n",
    )
    project.add_command("stamp", STAMP, 'parser.add_argument("--wait", action="store_true")')
    tab = tmp_path / "tab"
    tab.write_text("0 0 * * * /usr/local/bin/backup\n")
    dry = project.manage("install_crontab", "--tabfile", str(tab), "--dispatcher", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "+* * * * * cd " in dry.stdout and "run_due_jobs --log=" in dry.stdout
    assert tab.read_text() == "0 0 * * * /usr/local/bin/backup\n"

    done = project.manage("install_crontab", "--tabfile", str(tab), "--dispatcher")
    assert done.returncode == 0, done.stderr
    lines = [x for x in tab.read_text().split("\n") if x and not x.startswith("#")]
    log_dir = project.dir / "var" / "log"
    python = lines[1].split(" && ")[1].split()[0]
    assert lines == [
        "0 0 * * * /usr/local/bin/backup",
        f"* * * * * cd {project.dir} && {python} {project.dir}/manage.py run_due_jobs "
        f"--log={log_dir}/run_due_jobs.log",
        f"@reboot cd {project.dir} && {python} {project.dir}/manage.py run_job "
        f"--log={log_dir}/booted.log --no-ping --name=booted stamp",
    ]
    again = project.manage("install_crontab", "--tabfile", str(tab), "--dispatcher", "--check")
    assert again.returncode == 0, again.stderr
    # job_status reads crontab.d, whichever lines are installed.
    status = project.manage("job_status", "--format=json")
    assert status.returncode in (0, 1) and not status.stderr, status.stderr  # 1: never run
    assert {"nightly", "often", "booted"} <= set(status.stdout.replace('"', " ").split())

    back = project.manage("install_crontab", "--tabfile", str(tab))
    assert back.returncode == 0, back.stderr
    text = tab.read_text()
    assert "run_due_jobs" not in text
    assert text.count(" run_job ") == 3


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def stat_fields(pid: int) -> list[str]:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return text.rsplit(")", 1)[1].split()


def state_of(pid: int) -> str:
    fields = stat_fields(pid)
    return fields[0] if fields else "gone"


def parent_of(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[1]) if fields else 0


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and parent_of(int(entry)) == pid:
            found.append(int(entry))
    return found


def test_a_run_job_forked_by_the_dispatcher_reuses_its_schedule_only_while_the_files_are_unchanged(
    settings, tmp_path
):
    from ops.schedule import before_fork, crontabd

    settings.OPS_CRONTAB_DIR = tmp_path
    cron = tmp_path / "10-jobs.cron"
    cron.write_text("0 3 * * * --no-ping check\n")
    saved = before_fork._kept
    try:
        kept = crontabd.load_schedule()
        before_fork.keep_for_children(kept, tmp_path)
        assert crontabd.load_schedule() is kept
        assert crontabd.load_schedule(check_args=True) is not kept  # the installer's read
        cron.write_text("0 4 * * * --no-ping check\n")  # a deploy in between
        assert crontabd.load_schedule().jobs[0].schedule == "0 4 * * *"
    finally:
        before_fork._kept = saved


@pytest.mark.process
def test_the_dispatcher_takes_its_heaps_free_chunks_before_forking_and_a_cold_fire_does_not(
    sqlite_project,
):
    """What a dispatched job's process inherits: the dispatcher's C heap with its free chunks
    taken (ops/run/heap.py), so that its allocations land on pages of its own; a per-job
    line's run_job takes none (it forks one child, after its own start-up)."""
    project = sqlite_project
    project.add_command(
        "heaptaken",
        'from ops.run import heap\nprint("taken", heap.held, flush=True)',
    )
    use_only(project, "10-jobs.cron", "* * * * * --no-ping --name=heap heaptaken\n")
    result = project.manage("run_due_jobs")
    assert result.returncode == 0, result.stderr
    runs = wait_until(finished(project, ["heap"]), "the dispatched job to finish", 60)
    assert runs[0][3] == "succeeded", runs
    log = (project.dir / "var" / "log" / "heap.log").read_text()
    assert int(log.split("taken ")[1].split()[0]) > 0, log
    cold = project.run_job("--force", "heap")  # its slot is done: run again, cold
    assert cold.returncode == 0, cold.stderr
    assert "taken 0" in cold.stdout, cold.stdout


def test_the_dispatcher_compiles_the_queries_of_its_run_jobs_before_forking_without_running_one(
    db,
):
    """What Django builds at a process's first query of each kind is built once in the
    dispatcher (its warm-up) and shared by every run_job it forks; it runs no query (it opens
    no connection: a child must never inherit one). False would mean Django's internals
    moved: the run_jobs then build it themselves, and bench/bench_dispatch.py's figures get
    worse."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ops.run import dispatch

    with CaptureQueriesContext(connection) as queries:
        assert dispatch.warm_queries() is True
    assert not queries.captured_queries


LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@pytest.mark.process
def test_the_dispatcher_run_twice_in_a_minute_starts_its_jobs_once_and_a_bad_state_is_one_line(
    sqlite_project,
):
    if not LIBFAKETIME.exists():
        pytest.skip("libfaketime (apt install faketime) holds both runs in one minute")
    project = sqlite_project
    project.add_command("stamp", STAMP, 'parser.add_argument("--wait", action="store_true")')
    use_only(project, "10-jobs.cron", "* * * * * --no-ping --name=every-minute stamp\n")

    def at(minute: str) -> dict:
        # the clock from `minute`:10 on, in this process and the run_jobs it forks; the
        # monotonic clock left real (faked, each process's would start at the same reading)
        return {
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME": f"@2027-01-04 {minute}:10",
            "DONT_FAKE_MONOTONIC": "1",
        }

    for _ in range(2):  # a second line, or cron's late wake-up starting the line again
        result = project.manage("run_due_jobs", env=at("03:00"))
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    wait_until(finished(project, ["every-minute"]), "the job to finish", 60)
    state = project.dir / "var" / "lock" / "run_due_jobs.state"
    assert json.loads(state.read_text())["virtual"] == "2027-01-04T03:00"
    state.write_text("{not json")
    result = project.manage("run_due_jobs", env=at("03:01"))
    assert result.returncode == 0 and not result.stdout
    [line] = result.stderr.splitlines()
    assert line.startswith(f"cronops: warning: the dispatcher's state {state}: "), line

    def both_done():
        rows = project.db.query("SELECT slot, outcome FROM ops_jobrun ORDER BY id")
        return rows if len(rows) == 2 and all(r[1] != "running" for r in rows) else None

    rows = wait_until(both_done, "the 03:01 run to finish", 60)
    # 03:00 once (not again by the second dispatcher), 03:01 once
    assert [slot[11:16] for slot, _ in rows] == ["03:00", "03:01"], rows
    assert [outcome for _, outcome in rows] == ["succeeded", "succeeded"], rows
    assert json.loads(state.read_text())["virtual"] == "2027-01-04T03:01"
