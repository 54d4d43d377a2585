"""`ops.once` as a property (issue 20): whatever redoes a slot, an effect happens once.

hypothesis drives the real runner from this process (its jobs run in forked children, as
always), against the test database (SQLite, and PostgreSQL in `make test`), with random
sequences of scheduled runs, `--force` runs, runs by hand (`--logical-date`, with or without
`--force`), catch-up, failing commands, and runs that die mid-job: inside an effect's
transaction (it rolls back) or right after its commit (run_job with it, nothing recorded). A
dead run's claim is left to be taken over, either as a dead process of this machine or as a
holder on another machine whose heartbeat went stale (a standby's takeover).

The job pays two customers per slot, each in a transaction of its own: `once(key)`, then the
effect, a row without a unique constraint of its own. After every step:

- no (slot, customer) was paid twice;
- every slot whose claim succeeded paid both customers.
"""

import datetime as dt
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import time_machine
from django.core.management import get_commands
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from commands.models import Subscription
from ops import once
from ops.models import Effect, JobRun, Outcome, SlotClaim
from ops.run import claims, process, runner

# The job is forked (a real process); a dead holder is a real process that is gone.
pytestmark = [pytest.mark.process, pytest.mark.timeout(600), pytest.mark.first]

UTC = dt.UTC
COMMAND = "pay_once"
KEYS = ("ann", "bob")
EXAMPLES = int(os.environ.get("CRONOPS_PROPERTY_EXAMPLES") or 30)
STEPS = int(os.environ.get("CRONOPS_PROPERTY_STEPS") or 20)
WINDOW = dt.datetime(2026, 11, 26, 0, 0, tzinfo=UTC)
DAYS = [dt.date(2026, 11, d) for d in (26, 27, 28, 29)]
SCHEDULES = ["0 3 * * *", "0 */6 * * *"]  # slot keys by date, and by fire time


class Crash(BaseException):
    """run_job dies with its job: nothing after the job's end runs (no record, no release)."""


@dataclass
class World:
    """What the next call's job is told to do; its child reads the copy its fork inherited."""

    ledger: Path = Path()
    fail: bool = False
    crash: tuple[int, str, int] | None = None  # (execution of the call, inside|after, key)
    executions: int = 0  # in this call, so far (the child counts from the ledger)
    stats: dict = field(default_factory=dict)


WORLD = World()


def ledger() -> list[dict]:
    if not WORLD.ledger.exists():
        return []
    return [json.loads(line) for line in WORLD.ledger.read_text().splitlines()]


def note(entry: dict) -> None:
    with WORLD.ledger.open("a") as f:
        f.write(json.dumps(entry) + "\n")


class PayOnce(BaseCommand):
    help = "Pays each customer once per slot (the property test's job)."

    def add_arguments(self, parser):
        parser.add_argument("--logical-date")

    def handle(self, *args, logical_date=None, **options):
        slot = claims.current_claim().slot
        n = sum(e["event"] == "start" for e in ledger()) - WORLD.executions
        note({"event": "start", "slot": slot})
        for i, who in enumerate(KEYS):
            with transaction.atomic():
                first = once(f"pay {who}")
                if first:
                    Subscription.objects.create(customer=f"{slot}|{who}", price=0)
                if WORLD.crash == (n, "inside", i):
                    note({"event": "crashed"})
                    os._exit(137)  # the transaction dies with the connection: rolled back
            note({"event": "paid" if first else "already paid", "slot": slot, "who": who})
            if WORLD.crash == (n, "after", i):
                note({"event": "crashed"})
                os._exit(137)  # committed, then the machine froze or died
        if WORLD.fail:
            raise CommandError("the job failed after paying")


def conclude_unless_crashed(conclude):
    def concluding(self, *args, **kwargs):
        found = ledger()
        if found and found[-1]["event"] == "crashed":
            raise Crash
        return conclude(self, *args, **kwargs)

    return concluding


def dead_holder() -> process.Identity:
    """A process of this machine that has exited: its holder identity is provably gone."""
    child = subprocess.Popen(["sleep", "60"])
    identity = process.identify(child.pid)
    child.kill()
    child.wait()
    return identity


instants = st.integers(0, 4 * 24 * 60 - 1).map(
    lambda m: WINDOW + dt.timedelta(minutes=m, seconds=5)
)
CRASHES = st.one_of(
    st.none(),
    st.none(),
    st.tuples(st.integers(0, 1), st.sampled_from(["inside", "after"]), st.integers(0, 1)),
)
GONE = st.sampled_from(["dead on this machine", "stale on another machine"])


def make_machine(cron_dir, dead: process.Identity):
    class Machine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            for model in (Effect, SlotClaim, JobRun, Subscription):
                model.objects.all().delete()
            WORLD.ledger.unlink(missing_ok=True)
            WORLD.stats["examples"] += 1

        @initialize(expr=st.sampled_from(SCHEDULES))
        def schedule(self, expr):
            (cron_dir / "job.cron").write_text(f"{expr} {COMMAND}\n")

        def run(self, argv, now, *, crash=None, gone="", fail=False):
            WORLD.fail, WORLD.crash = fail, crash
            before = ledger()
            WORLD.executions = sum(e["event"] == "start" for e in before)
            with time_machine.travel(now, tick=False):
                try:
                    code = runner.run(list(argv))
                except Crash:
                    code = None
            stats = WORLD.stats
            stats["runs"] += 1
            for entry in ledger()[len(before) :]:
                if entry["event"] in ("paid", "already paid"):
                    stats[entry["event"]] += 1
            stats["outcomes"][str(code)] = stats["outcomes"].get(str(code), 0) + 1
            if code is None:
                # Its claim stays running: the holder is gone, as a dead process of this
                # machine, or as another machine's whose heartbeat stopped long ago.
                stats["crashes"][gone] = stats["crashes"].get(gone, 0) + 1
                running = SlotClaim.objects.filter(state=Outcome.RUNNING)
                if gone == "dead on this machine":
                    running.update(
                        pid=dead.pid,
                        holder_boot_id=dead.boot_id,
                        holder_pid_ns=dead.pid_ns,
                        holder_started=dead.started,
                    )
                else:
                    running.update(
                        holder_boot_id="another-machine",
                        heartbeat_at=WINDOW - dt.timedelta(days=1),
                    )
            assert code in (0, 1, 75, None), (argv, now, code)
            return code

        @rule(now=instants, crash=CRASHES, gone=GONE, fail=st.sampled_from([False] * 3 + [True]))
        def scheduled_run(self, now, crash, gone, fail):
            self.run([COMMAND], now, crash=crash, gone=gone, fail=fail)

        @rule(now=instants, crash=CRASHES, gone=GONE)
        def forced_run(self, now, crash, gone):
            self.run(["--force", COMMAND], now, crash=crash, gone=gone)

        @rule(
            now=instants, day=st.sampled_from(DAYS), force=st.booleans(), crash=CRASHES, gone=GONE
        )
        def by_hand(self, now, day, force, crash, gone):
            if day >= now.date():
                return  # a date whose slot may not have come yet is refused (exit 2)
            argv = [*(["--force"] if force else []), f"--logical-date={day}", COMMAND]
            self.run(argv, now, crash=crash, gone=gone)

        @rule(now=instants, catch_up=st.integers(1, 3), crash=CRASHES, gone=GONE)
        def catch_up(self, now, catch_up, crash, gone):
            self.run([f"--catch-up={catch_up}", COMMAND], now, crash=crash, gone=gone)

        @invariant()
        def no_customer_was_paid_twice_for_a_slot(self):
            paid = list(Subscription.objects.values_list("customer", flat=True))
            twice = {p for p in paid if paid.count(p) > 1}
            assert not twice, (twice, ledger())

        @invariant()
        def every_succeeded_slot_paid_everyone(self):
            paid = set(Subscription.objects.values_list("customer", flat=True))
            for slot in SlotClaim.objects.filter(state=Outcome.SUCCEEDED).values_list(
                "slot", flat=True
            ):
                assert {f"{slot}|{who}" for who in KEYS} <= paid, (slot, paid)

    return Machine


def explore(settings, tmp_path) -> dict:
    settings.TIME_ZONE = "UTC"
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path / "crontab.d"
    settings.OPS_CRONTAB_DIR.mkdir()
    commands = get_commands()
    commands[COMMAND] = PayOnce()
    WORLD.ledger = tmp_path / "ledger.jsonl"
    WORLD.stats = {
        "examples": 0,
        "runs": 0,
        "outcomes": {},
        "crashes": {},
        "paid": 0,
        "already paid": 0,
    }
    conclude = runner.Runner.conclude
    runner.Runner.conclude = conclude_unless_crashed(conclude)  # type: ignore[method-assign]
    try:
        run_state_machine_as_test(
            make_machine(settings.OPS_CRONTAB_DIR, dead_holder()),
            settings=hsettings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                derandomize=not os.environ.get("CRONOPS_PROPERTY_RANDOM"),
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        runner.Runner.conclude = conclude  # type: ignore[method-assign]
        del commands[COMMAND]
    return dict(WORLD.stats)


def test_no_redo_of_a_slot_pays_anyone_twice_whatever_the_sequence(
    transactional_db, settings, tmp_path
):
    stats = explore(settings, tmp_path)
    print(stats)
    assert stats["examples"] >= EXAMPLES and stats["runs"] > EXAMPLES
    # The sequences did redo effects (once() said no), and left holders gone both ways.
    assert stats["already paid"] and stats["paid"]
    assert len(stats["crashes"]) == 2, stats
