"""The dispatcher's memory of cron's virtual minute (ops/run/virtual_minute.py, issue 33): what
it starts when the state file is missing, old, shared, broken or of another time zone. Real
files in tmp_path; the clock is `now=`, the monotonic clock and the boot are given."""

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from ops.run.virtual_minute import State, VirtualMinute
from ops.schedule.firing import Daemon, Expr, due_at, minutes

from .conftest import wait_until

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")
JOBS = {
    "minutely": Expr("* * * * *"),
    "quarter": Expr("*/15 * * * *"),
    "at0230": Expr("30 2 * * *"),
    "at0300": Expr("0 3 * * *"),
    "at1200": Expr("0 12 * * *"),
}
# 2027-06-10 (no DST) 00:00 CEST
NIGHT = dt.datetime(2027, 6, 9, 22, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parent.parent


class Clock:
    """A monotonic clock the test sets (seconds)."""

    def __init__(self, at: float = 1000.0):
        self.at = at

    def __call__(self) -> float:
        return self.at


def memory(path: Path, clock: Clock, boot: str = "boot 1") -> tuple[VirtualMinute, list[str]]:
    said: list[str] = []
    return VirtualMinute(path, said.append, boot=boot, monotonic=clock), said


def local(hour: int, minute: int, day: int = 10) -> dt.datetime:
    return dt.datetime(2027, 6, day, hour, minute, 0, tzinfo=BERLIN)


def test_a_first_run_starts_the_minutes_jobs_and_keeps_a_private_state(tmp_path):
    path = tmp_path / "lock" / "run_due_jobs.state"
    mem, said = memory(path, Clock())
    assert mem.due(JOBS, BERLIN, local(3, 0)) == due_at(JOBS, local(3, 0), BERLIN)
    assert said == []
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    state = State.loads(path.read_bytes())
    assert (state.tz, state.virtual) == ("Europe/Berlin", dt.datetime(2027, 6, 10, 3, 0))
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_same_minute_dispatched_twice_starts_its_jobs_once(tmp_path):
    mem, said = memory(tmp_path / "run_due_jobs.state", Clock())
    assert mem.due(JOBS, BERLIN, local(3, 0, 10)) == ["minutely", "quarter", "at0300"]
    # a second line, or cron's late wake-up starting the line again, in the same minute
    assert mem.due(JOBS, BERLIN, local(3, 0, 10) + dt.timedelta(seconds=40)) == []
    assert mem.due(JOBS, BERLIN, local(3, 1, 10)) == ["minutely"]
    assert said == []


def test_cron_woken_late_starts_the_missed_minutes_jobs_once_however_often_it_starts_the_line(
    tmp_path,
):
    clock = Clock()
    mem, _ = memory(tmp_path / "run_due_jobs.state", clock)
    mem.due(JOBS, BERLIN, local(2, 58))
    clock.at += 5 * 60  # woken at 03:03: cron starts the dispatcher's line once a missed minute
    starts = [mem.due(JOBS, BERLIN, local(3, 3) + dt.timedelta(seconds=s)) for s in range(5)]
    assert starts == [["minutely", "quarter", "at0300"], [], [], [], []]


def test_a_clock_stepped_forward_starts_the_skipped_fixed_time_jobs_once(tmp_path):
    clock = Clock()
    mem, _ = memory(tmp_path / "run_due_jobs.state", clock)
    mem.due(JOBS, BERLIN, local(2, 10))
    clock.at += 60  # a minute later the clock reads 03:11
    assert mem.due(JOBS, BERLIN, local(3, 11)) == ["at0230", "at0300", "minutely"]
    clock.at += 60
    assert mem.due(JOBS, BERLIN, local(3, 12)) == ["minutely"]


def test_a_clock_stepped_back_does_not_start_fixed_time_jobs_again(tmp_path):
    clock = Clock()
    mem, _ = memory(tmp_path / "run_due_jobs.state", clock)
    for minute in range(25, 35):  # 02:25 … 02:34: 02:30 ran
        mem.due(JOBS, BERLIN, local(2, minute))
        clock.at += 60
    again = {}
    for minute in range(25, 40):  # set back to 02:25: wildcard jobs follow the wall clock
        again[minute] = mem.due(JOBS, BERLIN, local(2, minute) + dt.timedelta(seconds=5))
        clock.at += 60
    assert again[30] == ["minutely", "quarter"]  # not at0230
    assert again[35] == ["minutely"]  # past the virtual minute: as usual again
    assert all(names == ["minutely"] for m, names in again.items() if m != 30)


def test_a_dispatcher_not_run_for_hours_catches_up_nothing_a_restarted_cron_would_not(
    tmp_path,
):
    clock = Clock()
    path = tmp_path / "run_due_jobs.state"
    mem, _ = memory(path, clock)
    mem.due(JOBS, BERLIN, local(2, 0))
    # Two hours later, real time too (cron stopped, a broken deploy, the line switched off):
    # the minute alone, not 02:30's and 03:00's jobs.
    clock.at += 2 * 3600 + 60
    assert mem.due(JOBS, BERLIN, local(4, 1)) == ["minutely"]
    # The clock jumping two hours in a minute is cron's to replay (its 6-180 minute rule).
    mem.due(JOBS, BERLIN, local(10, 30))
    clock.at += 60
    assert mem.due(JOBS, BERLIN, local(12, 31)) == ["at1200", "minutely"]


def test_a_state_of_another_boot_or_days_old_is_a_first_run(tmp_path):
    path = tmp_path / "run_due_jobs.state"
    old, _ = memory(path, Clock(50_000.0), boot="boot 1")
    old.due(JOBS, BERLIN, local(1, 0, day=7))
    # The machine was down since: another boot, its monotonic clock from zero.
    after, said = memory(path, Clock(30.0), boot="boot 2")
    assert after.due(JOBS, BERLIN, local(3, 0)) == ["minutely", "quarter", "at0300"]
    assert said == []
    assert State.loads(path.read_bytes()).boot == "boot 2"
    # Days later on the same boot (more than cron's 3 h: the minute alone, as cron too).
    same, _ = memory(path, Clock(30.0 + 3 * 86400), boot="boot 2")
    assert same.due(JOBS, BERLIN, local(2, 30, day=13)) == ["minutely", "quarter", "at0230"]


def test_a_changed_time_zone_starts_from_the_minute_as_a_first_run(tmp_path):
    path = tmp_path / "run_due_jobs.state"
    clock = Clock()
    mem, said = memory(path, clock)
    mem.due(JOBS, BERLIN, local(2, 0))
    clock.at += 60
    # TIME_ZONE is now UTC: 00:01 UTC (02:01 in Berlin), nothing of Berlin's virtual minute.
    utc = ZoneInfo("UTC")
    assert mem.due(JOBS, utc, local(2, 1)) == ["minutely"]
    assert said == []
    assert State.loads(path.read_bytes()).tz == "UTC"


@pytest.mark.parametrize("damage", ["garbage", "a state with a wrong field", "empty"])
def test_a_corrupt_state_is_said_once_and_the_minute_dispatched_from_the_clock(tmp_path, damage):
    path = tmp_path / "run_due_jobs.state"
    clock = Clock()
    mem, said = memory(path, clock)
    mem.due(JOBS, BERLIN, local(2, 29))
    text = {
        "garbage": b"\x00\xffnot json",
        "a state with a wrong field": path.read_bytes().replace(b'"virtual": "', b'"virtual": "x'),
        "empty": b"",
    }[damage]
    path.write_bytes(text)
    clock.at += 60
    assert mem.due(JOBS, BERLIN, local(2, 30)) == ["minutely", "quarter", "at0230"]
    assert len(said) == 1 and said[0].startswith("warning: the dispatcher's state "), said
    assert "from the clock alone" in said[0]
    # Replaced by a good one: the next minute is quiet.
    clock.at += 60
    assert mem.due(JOBS, BERLIN, local(2, 31)) == ["minutely"]
    assert len(said) == 1


def test_a_state_file_of_another_user_is_not_trusted_and_the_minute_still_dispatched(tmp_path):
    path = tmp_path / "run_due_jobs.state"
    clock = Clock()
    mem, said = memory(path, clock)
    mem.due(JOBS, BERLIN, local(2, 29))
    # Someone else's state saying 02:30 ran already.
    path.write_bytes(
        State("Europe/Berlin", "boot 1", dt.datetime(2027, 6, 10, 2, 30),
              local(2, 30).astimezone(UTC), clock.at).dumps()
    )  # fmt: skip
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    else:
        pytest.skip("chown needs root")
    clock.at += 60
    assert mem.due(JOBS, BERLIN, local(2, 30)) == ["minutely", "quarter", "at0230"]
    assert len(said) == 1 and "owned by uid 65534" in said[0]


def test_a_lock_file_of_another_user_is_said_and_the_minute_still_dispatched(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    path = tmp_path / "run_due_jobs.state"
    lock = tmp_path / "run_due_jobs.state.lock"
    lock.write_text("")
    os.chown(lock, 65534, 65534)
    mem, said = memory(path, Clock())
    assert mem.due(JOBS, BERLIN, local(2, 30)) == ["minutely", "quarter", "at0230"]
    assert len(said) == 1 and "owned by uid 65534" in said[0] and str(path) in said[0]
    assert not path.exists()


def test_a_state_path_that_is_a_directory_or_a_link_is_said_once_and_the_minute_dispatched(
    tmp_path,
):
    (tmp_path / "elsewhere").write_text("{}")
    for path in (tmp_path / "dir.state", tmp_path / "link.state"):
        if path.name == "dir.state":
            path.mkdir()
        else:
            path.symlink_to(tmp_path / "elsewhere")
        mem, said = memory(path, Clock())
        assert mem.due(JOBS, BERLIN, local(2, 30)) == ["minutely", "quarter", "at0230"]
        assert len(said) == 1, said
    assert (tmp_path / "elsewhere").read_text() == "{}"  # a link is never followed


@pytest.mark.parametrize("night", ["spring", "autumn"])
def test_on_a_dst_night_the_dispatcher_with_its_state_starts_what_cron_starts(tmp_path, night):
    first = {
        "spring": dt.datetime(2027, 3, 27, 22, 0, tzinfo=UTC),
        "autumn": dt.datetime(2027, 10, 30, 22, 0, tzinfo=UTC),
    }[night]
    daemon = Daemon(JOBS)
    clock = Clock()
    mem, said = memory(tmp_path / "run_due_jobs.state", clock)
    for reading in minutes(first, first + dt.timedelta(hours=6)):
        clock.at += 60
        assert mem.due(JOBS, BERLIN, reading) == daemon.wake(reading.astimezone(BERLIN)), reading
    assert said == []


CONCURRENT = """
import datetime as dt, json, os, sys, time
from pathlib import Path
from zoneinfo import ZoneInfo
from ops.run.virtual_minute import VirtualMinute
from ops.schedule.firing import Expr

state, go, at = Path(sys.argv[1]), Path(sys.argv[2]), dt.datetime.fromisoformat(sys.argv[3])
go.with_name(f"ready.{os.getpid()}").write_text("")
deadline = time.monotonic() + 60
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.001)
jobs = {"minutely": Expr("* * * * *"), "at0300": Expr("0 3 * * *")}
said = []
memory = VirtualMinute(state, said.append, boot="b", monotonic=lambda: 100.0)
print(json.dumps([memory.due(jobs, ZoneInfo("Europe/Berlin"), at), said]))
"""


@pytest.mark.process
def test_dispatchers_started_together_in_one_minute_start_each_job_once(tmp_path):
    state, go = tmp_path / "run_due_jobs.state", tmp_path / "go"
    at = local(3, 0).isoformat()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, str(state), str(go), at],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    # All set up and polling, then all let go at once.
    wait_until(lambda: len(list(tmp_path.glob("ready.*"))) == 6, "the six to be ready", 60)
    go.write_text("")
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    started = sorted(name for due, _ in outs for name in due)
    assert started == ["at0300", "minutely"]
    assert [said for _, said in outs] == [[]] * 6


def test_a_restarted_cron_daemon_is_a_first_run_as_cron_has_no_memory_either(tmp_path):
    path = tmp_path / "run_due_jobs.state"
    clock = Clock()
    said: list[str] = []
    before = VirtualMinute(path, said.append, boot="b", monotonic=clock, cron="100:5000")
    before.due(JOBS, BERLIN, local(2, 25))
    # Stopped at 02:26, started again at 02:31 (5 minutes: within cron's late-wake-up rule).
    clock.at += 6 * 60
    again = VirtualMinute(path, said.append, boot="b", monotonic=clock, cron="200:9000")
    assert again.due(JOBS, BERLIN, local(2, 31)) == ["minutely"]  # not 02:30's at0230
    # Run by hand (no cron among its ancestors): the daemon's memory, and the daemon, kept.
    clock.at += 60
    by_hand = VirtualMinute(path, said.append, boot="b", monotonic=clock, cron="")
    assert by_hand.due(JOBS, BERLIN, local(2, 32)) == ["minutely"]
    assert State.loads(path.read_bytes()).cron == "200:9000"
    assert said == []


ASK_DAEMON = "from ops.run.virtual_minute import cron_daemon; print(cron_daemon())"


@pytest.mark.process
def test_the_cron_daemon_is_the_farthest_of_the_cron_named_ancestors(tmp_path):
    import shutil

    # A shell copied to the name `cron` stands for the daemon and the child it forks per job.
    cron = tmp_path / "cron"
    shutil.copy("/bin/dash", cron)
    inner = f"{cron} -c \"{sys.executable} -c '{ASK_DAEMON}'; true\"; true"
    run = {"cwd": REPO, "capture_output": True, "text": True, "timeout": 60}
    out = subprocess.run([str(cron), "-c", f'{inner}; echo "$$"'], **run)
    assert out.returncode == 0, out.stderr
    found, daemon = out.stdout.split()
    assert found.split(":")[0] == daemon
    mine = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    assert int(found.split(":")[1]) >= int(mine)  # its start time, after this test's
    plain = subprocess.run([sys.executable, "-c", ASK_DAEMON], **run)
    assert plain.stdout == "\n"  # not under cron


def test_two_projects_sharing_a_lock_directory_each_start_their_jobs_every_minute(tmp_path):
    path = tmp_path / "run_due_jobs.state"  # OPS_LOCK_DIR=/run/lock for both, say
    clock = Clock()
    said: list[str] = []
    first, second = (
        VirtualMinute(path, said.append, boot="b", monotonic=clock, cron="", project=name)
        for name in ("/srv/a/crontab.d", "/srv/b/crontab.d")
    )
    for minute in range(28, 32):
        assert first.due(JOBS, BERLIN, local(2, minute)) == second.due(
            JOBS, BERLIN, local(2, minute)
        )
        assert second.due(JOBS, BERLIN, local(2, minute)) == []  # its own minute, once
        clock.at += 60
    assert said == []


def test_a_slow_dispatcher_overtaken_by_the_next_minutes_starts_nothing_and_no_minute_is_lost(
    tmp_path,
):
    clock = Clock()
    path = tmp_path / "run_due_jobs.state"
    mem, _ = memory(path, clock)
    mem.due(JOBS, BERLIN, local(2, 59))
    # 03:00's dispatcher is slow to start; 03:01's takes the lock first, at 03:01:05: it finds
    # 03:00 not dispatched (cron's late-wake-up rule) and starts both minutes' jobs.
    clock.at += 125
    assert mem.due(JOBS, BERLIN, local(3, 1) + dt.timedelta(seconds=5)) == [
        "minutely",
        "quarter",
        "at0300",
    ]
    # 03:00's reads the clock under the lock after it: 03:01:30, a minute dispatched already.
    clock.at += 25
    assert mem.due(JOBS, BERLIN, local(3, 1) + dt.timedelta(seconds=30)) == []
