"""An ad hoc --name belongs to the command that made its history (ops/run/commandargs.py):
`history_command` in one written statement reads what the ORM's two queries read."""

import datetime as dt

import pytest
from django.db.models import Q

from ops.models import JobRun, Outcome, SlotClaim
from ops.run.commandargs import history_command

NOW = dt.datetime(2026, 11, 29, 4, 30, tzinfo=dt.UTC)


def run(job: str, command: str, *, claimed_as: str | None = None) -> JobRun:
    row = JobRun.objects.create(
        job=job, command=command, started_at=NOW, host="h", pid=1, outcome=Outcome.SUCCEEDED
    )
    if claimed_as is not None:
        SlotClaim.objects.create(
            job=claimed_as,
            slot=f"2026-11-{row.pk:02d}",
            state=Outcome.SUCCEEDED,
            run=row,
            host="h",
            pid=1,
            started_at=NOW,
            heartbeat_at=NOW,
        )
    return row


def by_the_orm(name: str, command: str) -> str | None:
    """What the runner asked before: the job's runs, then the runs its claims point to."""

    def same(field: str) -> Q:
        return (
            Q(**{field: command}) | Q(**{f"{field}__startswith": command + " "}) | Q(**{field: ""})
        )

    other = JobRun.objects.filter(job=name).exclude(same("command")).values_list("command")
    found = other.first()
    if found is None:
        claimed = SlotClaim.objects.filter(job=name, run__isnull=False)
        found = claimed.exclude(same("run__command")).values_list("run__command").first()
    return found[0].split(" ", 1)[0] if found is not None else None


@pytest.mark.django_db
def test_a_history_made_by_the_same_command_its_arguments_or_none_names_no_other():
    run("foo", "sleep_demo --seconds=0")
    run("foo", "sleep_demo")
    run("foo", "")  # a row written before commands were recorded
    run("bar", "charge_daily")  # another job's
    assert history_command("foo", "sleep_demo") is None
    assert history_command("nothing", "sleep_demo") is None
    assert history_command("foo", "sleep_demo") == by_the_orm("foo", "sleep_demo")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("recorded", "command"),
    [
        ("sleep_demo_x --seconds=0", "sleep_demo"),  # a longer name that starts alike
        ("sleep --seconds=0", "sleep_demo"),  # a shorter one
        ("a_b", "axb"),  # LIKE's wildcards are no wildcards here
        ("axb --x", "a_b"),
        ("a%b --x", "a"),
        ("charge_daily", "sleep_demo"),
    ],
)
def test_a_run_of_another_command_is_named(recorded, command):
    run("foo", recorded)
    assert history_command("foo", command) == recorded.split(" ")[0]
    assert history_command("foo", command) == by_the_orm("foo", command)


@pytest.mark.django_db
def test_a_claim_of_the_job_pointing_to_another_commands_run_is_named():
    run("other", "charge_daily --x", claimed_as="foo")
    run("foo", "sleep_demo")
    assert history_command("foo", "sleep_demo") == "charge_daily"
    assert by_the_orm("foo", "sleep_demo") == "charge_daily"
    # Another job's claim on such a run does not count.
    assert history_command("bar", "sleep_demo") is None


@pytest.mark.django_db
def test_a_command_differing_only_in_case_is_another_command():
    """SQLite's LIKE ignored case: the ORM took `Sleep_demo x` for sleep_demo's own run."""
    run("foo", "Sleep_demo --x")
    assert history_command("foo", "sleep_demo") == "Sleep_demo"
