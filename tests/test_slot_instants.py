"""One execution per instant: the same slot under two keys is one slot (README, "Slots, logical
dates and claims"), and a holder is judged by its own heartbeat interval.

Before this, a slot's key was its only identity: a schedule edit from once a day to several a
day, or another TIME_ZONE, gave one instant a second key, and both keys ran (issue 9 review).
In-process with a fake clock against the test database (SQLite; PostgreSQL in `make test`),
then two real processes started at once.
"""

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
import time_machine

from ops.claims import HeldClaim
from ops.models import JobRun, Outcome, SlotClaim
from ops.run import claims, process, runner
from ops.schedule import slots

from .conftest import Project, copy_tree, wait_until

UTC = dt.UTC


def run_at(instant: str, *argv: str) -> int:
    with time_machine.travel(instant, tick=False):
        return runner.run(list(argv))


def use(settings, tmp_path, cron: str, tz: str = "UTC") -> None:
    settings.TIME_ZONE = tz
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text(cron)


def executed() -> list[str]:
    """The keys of the slots whose command ran (one row per execution)."""
    return list(
        JobRun.objects.exclude(outcome=Outcome.SKIPPED)
        .order_by("id")
        .values_list("slot", flat=True)
    )


def another_machine(pid: int = 4242) -> process.Identity:
    me = process.identify()
    return process.Identity("another-boot", me.pid_ns, pid, 1)


def hold(job: str, key: str, at: str, *, heartbeat: float = 30.0, seen: str | None = None):
    """A running claim held by a process on another machine, heartbeating every `heartbeat` s."""
    instant = dt.datetime.fromisoformat(at)
    SlotClaim.objects.create(
        job=job,
        slot=key,
        logical_date=instant.date(),
        scheduled_at=instant,
        state=Outcome.RUNNING,
        host="host-b",
        pid=4242,
        holder_boot_id="another-boot",
        holder_pid_ns=process.identify().pid_ns,
        holder_started=1,
        started_at=instant,
        heartbeat_at=dt.datetime.fromisoformat(seen or at),
        heartbeat_interval=heartbeat,
    )


def test_a_once_a_day_slot_is_not_run_again_under_its_wall_clock_key_after_an_edit(
    transactional_db, settings, tmp_path
):
    use(settings, tmp_path, "0 3 * * * --name=editjob sleep_demo --seconds=0\n")
    assert run_at("2026-12-01T03:00:05+00:00", "editjob") == 0
    (tmp_path / "t.cron").write_text("0 3,15 * * * --name=editjob sleep_demo --seconds=0\n")
    # By hand at 03:40: the 03:00 slot is the one the daily line served, under its date key.
    assert run_at("2026-12-01T03:40:00+00:00", "editjob") == 0
    # The 15:00 slot is another instant: the daily claim does not cover it.
    assert run_at("2026-12-01T16:00:00+00:00", "editjob") == 0
    assert executed() == ["2026-12-01", "2026-12-01 15:00+00:00"]
    skip = JobRun.objects.get(outcome=Outcome.SKIPPED)
    assert skip.note == "already done for 2026-12-01 03:00+00:00"


@pytest.mark.parametrize("tz", ["Europe/Berlin", "Asia/Kolkata"])
def test_the_same_instant_under_another_time_zone_is_already_done(
    transactional_db, settings, tmp_path, tz
):
    use(settings, tmp_path, "*/15 * * * * sleep_demo --seconds=0\n")
    assert run_at("2026-12-01T11:00:05+00:00", "sleep_demo") == 0
    settings.TIME_ZONE = tz
    assert run_at("2026-12-01T11:00:09+00:00", "sleep_demo") == 0
    assert executed() == ["2026-12-01 11:00+00:00"]
    [skip] = JobRun.objects.filter(outcome=Outcome.SKIPPED)
    assert skip.note.startswith("already done for 2026-12-01 ")
    assert SlotClaim.objects.count() == 1  # the yielding run left no claim of its own


@pytest.mark.parametrize(
    ("held", "cron"),
    [
        # a rolling deploy: host B, edited to twice a day, holds 03:00; host A has the daily line
        ("2026-12-01 03:00+00:00", "0 3 * * * --name=editjob sleep_demo --seconds=0\n"),
        # and the other way round
        ("2026-12-01", "0 3,15 * * * --name=editjob sleep_demo --seconds=0\n"),
    ],
)
def test_a_live_holder_of_the_same_instant_under_another_key_makes_the_slot_busy(
    transactional_db, settings, tmp_path, held, cron
):
    use(settings, tmp_path, cron)
    hold("editjob", held, "2026-12-01T03:00:00+00:00", seen="2026-12-01T03:00:04+00:00")
    assert run_at("2026-12-01T03:00:05+00:00", "editjob") == runner.EXIT_SKIPPED
    assert executed() == []
    assert list(SlotClaim.objects.values_list("slot", "state")) == [(held, "running")]


def test_a_day_served_several_times_is_busy_for_a_once_a_day_slot_while_one_still_runs(
    transactional_db, settings, tmp_path
):
    """Several a day → once a day: a running claim of that date (not only a success) counts."""
    use(settings, tmp_path, "0 4 * * * --name=editjob sleep_demo --seconds=0\n")
    hold("editjob", "2026-12-01 03:00+00:00", "2026-12-01T03:00:00+00:00")
    SlotClaim.objects.update(heartbeat_at=dt.datetime(2026, 12, 1, 4, 0, tzinfo=UTC))
    assert run_at("2026-12-01T04:00:05+00:00", "editjob") == runner.EXIT_SKIPPED
    assert executed() == []


def test_a_dead_holder_under_another_key_is_recorded_abandoned_and_the_slot_runs(
    transactional_db, settings, tmp_path
):
    use(settings, tmp_path, "*/15 * * * * sleep_demo --seconds=0\n", tz="Asia/Kolkata")
    hold("sleep_demo", "2026-12-01 11:00+00:00", "2026-12-01T11:00:00+00:00", heartbeat=1)
    assert run_at("2026-12-01T11:00:30+00:00", "sleep_demo") == 0
    states = dict(SlotClaim.objects.values_list("slot", "state"))
    assert states == {"2026-12-01 11:00+00:00": "abandoned", "2026-12-01 16:30+05:30": "succeeded"}


def test_catch_up_counts_a_slot_done_at_the_same_instant_under_another_key(
    transactional_db, settings, tmp_path
):
    use(settings, tmp_path, "*/15 * * * * --catch-up=2 sleep_demo --seconds=0\n")
    assert run_at("2026-12-01T10:30:05+00:00", "sleep_demo") == 0
    assert run_at("2026-12-01T10:45:05+00:00", "sleep_demo") == 0
    settings.TIME_ZONE = "Europe/Berlin"
    assert run_at("2026-12-01T11:00:05+00:00", "sleep_demo") == 0
    assert executed() == [
        "2026-12-01 10:30+00:00",
        "2026-12-01 10:45+00:00",
        "2026-12-01 12:00+01:00",
    ]


def test_a_holder_is_judged_stale_by_its_own_heartbeat_interval_not_the_judges(db):
    """Host A heartbeats every 30 s, host B every 1 s: 5 s after A's heartbeat B must not take
    A's healthy claim (before: B's own 3 s limit decided)."""
    slot = slots.make_slot("*/15 * * * *", dt.datetime(2026, 12, 1, 11, 0, tzinfo=UTC))
    start = dt.datetime(2026, 12, 1, 11, 0, 1, tzinfo=UTC)
    a = claims.claim(
        "t", slot, host="host-a", pid=4242, now=start, stale_after=90.0, force=False,
        command="t", identity=another_machine(), heartbeat=30.0,
    )  # fmt: skip
    assert a.status == "claimed"
    assert SlotClaim.objects.get().heartbeat_interval == 30.0

    def b_at(seconds: float) -> claims.ClaimResult:
        return claims.claim(
            "t", slot, host="host-b", pid=1, now=start + dt.timedelta(seconds=seconds),
            stale_after=3.0, force=False, command="t", heartbeat=1.0,
        )  # fmt: skip

    assert b_at(5).status == "busy"
    assert b_at(89).status == "busy"
    taken = b_at(91)
    assert taken.status == "claimed" and taken.abandoned.pk == a.run.pk
    assert SlotClaim.objects.get().heartbeat_interval == 1.0  # now B's, B is the holder


def test_a_run_with_a_short_heartbeat_setting_leaves_a_slow_heartbeating_holder_alone(
    transactional_db, settings, tmp_path
):
    use(settings, tmp_path, "*/15 * * * * sleep_demo --seconds=0\n")
    settings.OPS_HEARTBEAT_SECONDS = 1
    hold("sleep_demo", "2026-12-01 11:00+00:00", "2026-12-01T11:00:00+00:00", heartbeat=30)
    assert run_at("2026-12-01T11:00:05+00:00", "sleep_demo") == runner.EXIT_SKIPPED
    assert executed() == []


# --- two real processes at once --------------------------------------------------------------

# Both serve the instant 2026-01-01 00:00 UTC (the most recent fire of either schedule, whenever
# the test runs): a once-a-day key "2026-01-01" in UTC, and "2026-01-01 05:30+05:30" for a
# twice-that-day schedule in Kolkata.
LINES = {"UTC": "0 0 1 1 * t_once\n", "Asia/Kolkata": "30 4,5 1 1 * t_once\n"}
RECORDER = """
with open(os.environ["RAN_FILE"], "a") as f:
    f.write(f"{os.getpid()}\\n")
deadline = time.monotonic() + 60
while not os.path.exists(os.environ["GO_FILE"]) and time.monotonic() < deadline:
    time.sleep(0.02)
"""


@pytest.mark.parametrize("standby", [False, True], ids=["no standby", "standby"])
def test_two_processes_with_two_keys_for_one_instant_execute_it_once(project, tmp_path, standby):
    """Two deployed copies (own OPS_CRONTAB_DIR, lock directory and TIME_ZONE) start at once:
    a rolling deploy of a schedule edit, or one server left on another TIME_ZONE."""
    ran, go = tmp_path / "ran.txt", tmp_path / "go"
    other = Project(copy_tree(tmp_path / "server-b"), project.db, dict(project.settings))
    for each, tz in ((project, "UTC"), (other, "Asia/Kolkata")):
        each.add_command("t_once", RECORDER)
        each.write_cron("t.cron", LINES[tz])
        each.write_env(RAN_FILE=ran, GO_FILE=go, TIME_ZONE=tz)
    flags = ["--standby=60s"] if standby else []
    for _ in range(3):
        ran.unlink(missing_ok=True)
        go.unlink(missing_ok=True)
        project.db.execute("DELETE FROM ops_slotclaim")
        both = [each.popen("run_job", *flags, "t_once") for each in (project, other)]
        if standby:
            # one runs; the other stands by (or has not claimed yet)
            wait_until(ran.exists, "one of the two to run the job", 60)
        else:
            wait_until(  # the loser exits 75 at once
                lambda: any(p.poll() is not None for p in both), "one of the two to exit", 60
            )
        go.touch()
        results = [p.communicate(timeout=60) for p in both]
        codes = sorted(p.returncode for p in both)
        assert len(ran.read_text().splitlines()) == 1, results
        assert codes == ([0, 0] if standby else [0, 75]), results
        assert len(project.db.query("SELECT id FROM ops_slotclaim")) == 1


def test_the_two_copies_lines_serve_one_instant_under_two_keys():
    keys = set()
    for tz, line in LINES.items():
        expr = line.split(" t_once")[0]
        slot = slots.current_slot(expr, dt.datetime(2026, 6, 1, tzinfo=UTC), ZoneInfo(tz))
        assert slot.at.astimezone(UTC) == dt.datetime(2026, 1, 1, tzinfo=UTC)
        keys.add(slot.key)
    assert keys == {"2026-01-01", "2026-01-01 05:30+05:30"}


def fenced_claim():
    """Today's 03:00 slot of job "t", held by a process on another machine (heartbeat 30 s):
    (slot, claim time, the claim, the holder's fence)."""
    slot = slots.make_slot("0 3 * * *", dt.datetime(2026, 12, 1, 3, 0, tzinfo=UTC))
    start = dt.datetime(2026, 12, 1, 3, 0, 1, tzinfo=UTC)
    held = claims.claim(
        "t", slot, host="host-a", pid=4242, now=start, stale_after=90.0, force=False,
        command="t", identity=another_machine(), heartbeat=30.0,
    )  # fmt: skip
    fence = HeldClaim(job="t", slot=slot.key, version=held.version, run_id=held.run.pk)
    return slot, start, held, fence


@pytest.mark.django_db(transaction=True)
def test_a_fencing_transaction_holds_back_only_a_takeover_of_its_own_claim():
    """A job inside `still_held(lock=True)` for longer than three heartbeats must not look
    dead: its heartbeats (the runner's thread, its own connection) go on, a second run of the
    slot is told busy at once, another slot of the job is claimed at once, and only a takeover
    of its claim waits for the commit. Before: the row lock blocked the heartbeat too, and then
    a job-wide lock every claim of the job."""
    import threading

    from django.db import OperationalError, connection, transaction

    if connection.vendor != "postgresql":
        pytest.skip("SQLite has one writer at a time: no fencing lock to share")
    slot, start, held, fence = fenced_claim()
    later = start + dt.timedelta(minutes=10)  # the job's transaction has lasted 10 minutes

    def on_its_own_connection(step):
        seen = []

        def run():
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SET lock_timeout = '2s'")
                seen.append(step())
            except OperationalError as exc:
                seen.append(type(exc).__name__)
            finally:
                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return seen[0]

    def another_host(at: dt.datetime, which=slot) -> str:
        return claims.claim(
            "t", which, host="host-b", pid=1, now=at, stale_after=90.0, force=False,
            command="t", heartbeat=30.0,
        ).status  # fmt: skip

    tomorrow = slots.make_slot("0 3 * * *", dt.datetime(2026, 12, 2, 3, 0, tzinfo=UTC))
    with transaction.atomic():
        assert fence.still_held(lock=True)
        assert on_its_own_connection(lambda: claims.heartbeat(held.run, lambda: later)) == 1
        assert on_its_own_connection(lambda: another_host(later + dt.timedelta(seconds=30))) == (
            "busy"
        )
        assert on_its_own_connection(lambda: another_host(later, tomorrow)) == "claimed"
        # stale by then (no heartbeat for an hour): a takeover, which comes after the commit.
        # It waits outside its claim transaction (issue 20): without a wait it is told busy.
        stale = later + dt.timedelta(hours=1)

        def take_over():
            taker = claims.claim(
                "t", slot, host="host-b", pid=1, now=stale, stale_after=90.0, force=False,
                command="t", heartbeat=30.0,
            )  # fmt: skip
            return taker.status, taker.fenced

        assert on_its_own_connection(take_over) == ("busy", True)
    assert another_host(later + dt.timedelta(seconds=30)) == "busy"  # the heartbeat keeps it
    assert fence.still_held()


@pytest.mark.django_db(transaction=True)
def test_a_fence_outside_a_transaction_is_refused_not_silently_empty():
    # Autocommit: the advisory lock would end with its own statement (before: the row lock's
    # select_for_update raised the same on PostgreSQL).
    from django.db.transaction import TransactionManagementError

    *_, fence = fenced_claim()
    with pytest.raises(TransactionManagementError):
        fence.still_held(lock=True)
    assert fence.still_held()  # without the lock: a plain read, fine in autocommit


@pytest.mark.django_db(transaction=True)
def test_a_fence_under_repeatable_read_is_refused_its_snapshot_predates_the_lock():
    import threading

    from django.db import connection, transaction
    from django.db.transaction import TransactionManagementError

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's isolation levels")
    slot, start, _, fence = fenced_claim()
    seen = {}

    def take_over():
        try:
            seen["status"] = claims.claim(
                "t", slot, host="host-b", pid=1, now=start + dt.timedelta(hours=1),
                stale_after=90.0, force=False, command="t", heartbeat=30.0,
            ).status  # fmt: skip
        finally:
            connection.close()

    with pytest.raises(TransactionManagementError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT 1 FROM ops_jobrun LIMIT 1")  # the snapshot is taken here
        thread = threading.Thread(target=take_over)
        thread.start()
        thread.join()
        assert seen == {"status": "claimed"}
        fence.still_held(lock=True)  # before: True, from the snapshot, after the takeover
    assert not fence.still_held()
