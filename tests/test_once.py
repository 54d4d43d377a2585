"""`ops.once(key)`: an effect marked done for its slot in the job's own transaction, so a run
that redoes the slot (--force, by hand, catch-up, a standby's takeover) does not redo it.

In-process against the test database (SQLite; PostgreSQL in `make test`); the runner forks its
jobs as always. The takeover by a standby on another host is tests/test_once_hosts.py, the
random sequences of redos tests/test_once_property.py.
"""

import subprocess
import sys

import pytest
import time_machine
from django.db import IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from commands.models import Subscription
from ops import once
from ops.claims import HeldClaim
from ops.models import Effect, JobRun
from ops.run import claims, runner
from ops.run.once import OutsideRun

from .conftest import REPO


@pytest.fixture
def held():
    """This process as a job run_job started: the claim of job "t", slot "2026-11-29"."""
    claim = HeldClaim(job="t", slot="2026-11-29", version=1, run_id=7)
    claims.enter(claim)
    yield claim
    claims.enter(None)


@pytest.mark.django_db(transaction=True)
def test_once_is_true_for_the_first_run_of_a_slot_and_false_for_every_redo(held):
    with transaction.atomic():
        assert once("charge 1") is True
        assert once("charge 1") is False  # within the same transaction too
        # the caller's transaction is still usable after the refused INSERT
        assert once("charge 2") is True
        Subscription.objects.create(customer="still usable", price=1)
    with transaction.atomic():
        assert once("charge 1") is False
    claims.enter(HeldClaim(job="t", slot="2026-11-30", version=1, run_id=8))
    with transaction.atomic():
        assert once("charge 1") is True  # another slot: its own effects
    claims.enter(HeldClaim(job="other", slot="2026-11-29", version=1, run_id=9))
    with transaction.atomic():
        assert once("charge 1") is True  # another job
    assert Subscription.objects.filter(customer="still usable").count() == 1
    rows = Effect.objects.order_by("id").values_list("job", "slot", "key", "run_id", "version")
    assert list(rows) == [
        ("t", "2026-11-29", "charge 1", 7, 1),
        ("t", "2026-11-29", "charge 2", 7, 1),
        ("t", "2026-11-30", "charge 1", 8, 1),
        ("other", "2026-11-29", "charge 1", 9, 1),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_clash_that_is_not_the_mark_is_raised_and_never_taken_for_done(held):
    """An INSERT that fails for another reason than the mark (on PostgreSQL, a primary-key
    sequence behind its table after a restore; anywhere, a CHECK constraint) is an error, not
    "another run did it": the new effect would be skipped for good."""
    if connection.vendor == "postgresql":
        Effect.objects.create(pk=50, job="x", slot="s", key="k", created_at=timezone.now())
        with connection.cursor() as cursor:
            cursor.execute("SELECT setval(pg_get_serial_sequence('ops_effect', 'id'), 49)")
    else:  # SQLite's AUTOINCREMENT never reuses an id: break the version's CHECK instead
        claims.enter(HeldClaim(job="t", slot="2026-11-29", version=-1, run_id=7))
    with pytest.raises(IntegrityError), transaction.atomic():
        once("a new effect")
    assert not Effect.objects.filter(key="a new effect").exists()


@pytest.mark.django_db(transaction=True)
def test_an_effect_whose_transaction_rolled_back_is_not_marked_done(held):
    with pytest.raises(RuntimeError), transaction.atomic():
        assert once("charge 1")
        raise RuntimeError("the effect failed")
    assert not Effect.objects.exists()
    with transaction.atomic():
        assert once("charge 1")  # the next run does it


@pytest.mark.django_db(transaction=True)
def test_once_outside_a_run_says_which_run_job_would_give_it_a_claim(monkeypatch):
    claims.enter(None)
    for name in ("OPS_JOB", "OPS_SLOT", "OPS_CLAIM_VERSION", "OPS_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(OutsideRun) as refused, transaction.atomic():
        once("charge 1")
    message = str(refused.value)
    assert "ops.once('charge 1') needs the slot claim of a run_job run" in message
    assert "`manage.py run_job <job>`" in message
    assert "`manage.py run_job --logical-date=YYYY-MM-DD <command>`" in message
    assert not Effect.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_once_outside_a_transaction_is_refused(held):
    assert connection.get_autocommit()
    with pytest.raises(TransactionManagementError, match=r"outside transaction\.atomic\(\)"):
        once("charge 1")
    assert not Effect.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_key_must_be_a_short_non_empty_string(held):
    with transaction.atomic():
        for bad in ("", "x" * 201, 42):
            with pytest.raises(ValueError, match="non-empty string of at most 200"):
                once(bad)  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_a_task_passes_the_claim_it_was_given_and_a_hand_made_one_is_refused():
    """An enqueued task runs in a worker, outside any run: `slot=cronops_slot` is the claim run_job
    enqueued it under (docs/tasks.md), and it is marked as that run's."""
    claims.enter(None)
    given = {"job": "t", "slot": "2026-11-29", "run_id": 7, "version": 2}
    with transaction.atomic():
        assert once("charge 1", slot=given) is True
        assert once("charge 1", slot={**given, "run_id": 8, "version": 3}) is False
    row = Effect.objects.values_list("job", "slot", "key", "run_id", "version").get()
    assert row == ("t", "2026-11-29", "charge 1", 7, 2)
    for bad in ({}, {"job": "t"}, {**given, "version": "2"}, {**given, "run_id": 0}, "t"):
        with pytest.raises(ValueError, match="the cronops_slot argument run_job gives"):
            with transaction.atomic():
                once("charge 2", slot=bad)  # type: ignore[arg-type]
    assert Effect.objects.count() == 1


@pytest.mark.process
def test_ops_imports_nothing_of_django_so_apps_can_load_it():
    code = (
        "import sys, ops; print(callable(ops.once), "
        "sorted(m for m in sys.modules if m.startswith(('ops.', 'django'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "True []"


# A job that pays each of two customers once per slot, in one transaction per customer, and
# then fails when told to (after its commits: a redo of the slot must not pay again).
PAY = """
import os
from django.conf import settings
from django.db import transaction
from commands.models import Subscription
from ops import once
from ops.claims import HeldClaim
for who in ("ann", "bob"):
    with transaction.atomic():
        if once(f"pay {who}"):
            Subscription.objects.create(customer=f"{who} {os.environ['OPS_SLOT']}", price=1)
if (settings.OPS_CRONTAB_DIR / "fail").exists():
    raise SystemExit(3)
"""


def run_at(instant: str, *argv: str) -> int:
    with time_machine.travel(instant, tick=False):
        return runner.run(list(argv))


def paid() -> dict[str, int]:
    """How many times each customer was paid for each slot ("ann 2026-11-27": 1)."""
    names = list(Subscription.objects.values_list("customer", flat=True))
    return {name: names.count(name) for name in sorted(set(names))}


def test_a_slot_redone_by_force_by_hand_and_by_catch_up_pays_each_customer_once(
    transactional_db, settings, tmp_path
):
    settings.OPS_LOCK_DIR = tmp_path / "lock"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "pay.py").write_text(PAY)
    job = f"shell --command=\"exec(open('{tmp_path}/pay.py').read())\""
    (tmp_path / "t.cron").write_text(f"0 3 * * * --name=pay {job}\n")
    (tmp_path / "fail").touch()
    # Nov 27: it pays, then fails: the slot is not done, and is run again.
    assert run_at("2026-11-27T03:00:05+00:00", "pay") == 3
    assert paid() == {"ann 2026-11-27": 1, "bob 2026-11-27": 1}
    (tmp_path / "fail").unlink()
    assert run_at("2026-11-27T03:10:00+00:00", "pay") == 0  # cron's line again, by hand
    assert run_at("2026-11-27T03:20:00+00:00", "--force", "pay") == 0
    assert run_at("2026-11-28T12:00:00+00:00", "--logical-date=2026-11-27", "--force", "pay") == 0
    # Nov 28 fails after paying; Nov 29's run catches it up, then runs its own.
    (tmp_path / "fail").touch()
    assert run_at("2026-11-28T03:00:05+00:00", "pay") == 3
    (tmp_path / "fail").unlink()
    assert run_at("2026-11-29T03:00:05+00:00", "--catch-up=2", "pay") == 0
    outcomes = list(JobRun.objects.order_by("id").values_list("slot", "outcome"))
    assert outcomes == [
        ("2026-11-27", "failed"),
        ("2026-11-27", "succeeded"),
        ("2026-11-27", "succeeded"),
        ("2026-11-27", "succeeded"),
        ("2026-11-28", "failed"),
        ("2026-11-28", "succeeded"),
        ("2026-11-29", "succeeded"),
    ]
    # Three slots, two customers, seven executions: six payments.
    assert paid() == {f"{who} 2026-11-{day}": 1 for who in ("ann", "bob") for day in (27, 28, 29)}
    assert Effect.objects.count() == 6
