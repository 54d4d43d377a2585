"""cronops' migrations: claims written before issue 9 keep working after `migrate` (SQLite and
PostgreSQL), and the models need no migration the migrations lack.

Old slot keys were wall-clock text ("2026-10-25 02:30"); migration 0002 gives them their UTC
offset in TIME_ZONE ("2026-10-25 02:30+02:00", the first occurrence for a repeated time) and the
claim its `scheduled_at`. A once-a-day job's old key for a date counts as that date done.
"""

import datetime as dt
import io
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.db import models
from django.test.utils import isolate_apps

from ops.models import Job, JobRun, named
from ops.schedule.slots import current_slot, time_key

BERLIN = ZoneInfo("Europe/Berlin")


def stamp(db, value: dt.datetime) -> str:
    utc = value.astimezone(dt.UTC)
    return utc.strftime("%Y-%m-%d %H:%M:%S") + ("" if db.backend == "sqlite" else "+00")


def insert_legacy(db, job: str, key: str, state: str, started: dt.datetime) -> None:
    """A run and its claim as cronops wrote them before migration 0002."""
    logical = key[:10]
    db.execute(
        "INSERT INTO ops_jobrun (job, slot, logical_date, outcome, note, started_at, host, pid, "
        "rid, command, output_tail) VALUES (?, ?, ?, ?, '', ?, 'old-host', 1, '', ?, '')",
        (job, key, logical, state, stamp(db, started), job),
    )
    [(run_id,)] = db.query("SELECT max(id) FROM ops_jobrun")
    db.execute(
        "INSERT INTO ops_slotclaim (job, slot, logical_date, state, host, pid, started_at, "
        "heartbeat_at, run_id) VALUES (?, ?, ?, ?, 'old-host', 1, ?, ?, ?)",
        (job, key, logical, state, stamp(db, started), stamp(db, started), run_id),
    )


def far_hour(now: dt.datetime) -> int:
    """An hour of the day in Berlin six hours from `now`'s (never in the night's DST hours):
    a schedule firing then and twelve hours later is three hours or more away from `now`, so
    `now`'s slots are still the current ones when run_job runs them again."""
    hour = (now.astimezone(BERLIN).hour + 6) % 24
    return 4 if hour in (1, 2, 3) else hour


def test_old_slot_keys_get_their_offset_and_old_successes_stay_done(project):
    now = dt.datetime.now(dt.UTC)
    hour = far_hour(now)
    daily_expr = f"0 {hour} * * *"
    twice_expr = f"0 {min(hour, (hour + 12) % 24)},{max(hour, (hour + 12) % 24)} * * *"
    project.write_env(TIME_ZONE="Europe/Berlin")
    project.add_command("t_ok", "print('ran')")
    project.write_cron(
        "t.cron", f"{daily_expr} --name=daily t_ok\n{twice_expr} --name=twice t_ok\n"
    )
    back = project.manage("migrate", "ops", "0001", "-v0")
    assert back.returncode == 0, back.stderr
    db = project.db
    daily = current_slot(daily_expr, now, BERLIN)
    twice = current_slot(twice_expr, now, BERLIN)
    legacy_today = f"{daily.logical_date} {hour:02d}:00"  # the old key of today's daily slot
    insert_legacy(db, "daily", legacy_today, "succeeded", now)
    insert_legacy(db, "twice", twice.key[:16], "succeeded", now)
    insert_legacy(db, "autumn", "2026-10-25 02:30", "succeeded", now)  # the repeated hour
    insert_legacy(db, "winter", "2026-12-24 03:00", "failed", now)
    insert_legacy(db, "by-hand", "2026-01-06", "succeeded", now)  # an unscheduled date slot

    forward = project.manage("migrate", "-v0")
    assert forward.returncode == 0, forward.stderr
    claims = db.query(
        "SELECT job, slot, version, holder_boot_id FROM ops_slotclaim ORDER BY job, slot"
    )
    assert claims == sorted(
        [
            ("daily", time_key(daily.at), 1, ""),
            ("twice", twice.key, 1, ""),
            ("autumn", "2026-10-25 02:30+02:00", 1, ""),
            ("winter", "2026-12-24 03:00+01:00", 1, ""),
            ("by-hand", "2026-01-06", 1, ""),
        ]
    )
    runs = db.query("SELECT job, slot FROM ops_jobrun ORDER BY job")
    assert runs == sorted((job, slot) for job, slot, _, _ in claims)
    instants = dict(db.query("SELECT job, scheduled_at FROM ops_slotclaim"))
    assert instants["by-hand"] is None
    assert _utc(instants["autumn"]) == dt.datetime(2026, 10, 25, 0, 30, tzinfo=dt.UTC)
    assert _utc(instants["winter"]) == dt.datetime(2026, 12, 24, 2, 0, tzinfo=dt.UTC)

    # Today's slots were done under their old keys: neither job runs again.
    for job in ("daily", "twice"):
        again = project.run_job(job)
        assert again.returncode == 0, again.stderr
        assert "already done for" in again.stdout and "ran" not in again.stdout

    # And back: offsets stripped; of two claims that then share a key, the success stays.
    db.execute(
        "INSERT INTO ops_slotclaim (job, slot, logical_date, state, host, pid, started_at, "
        "heartbeat_at, version, holder_boot_id) VALUES ('autumn', '2026-10-25 02:30+01:00', "
        "'2026-10-25', 'failed', 'h', 1, ?, ?, 1, '')",
        (stamp(db, now), stamp(db, now)),
    )
    back = project.manage("migrate", "ops", "0001", "-v0")
    assert back.returncode == 0, back.stderr
    assert db.query("SELECT slot, state FROM ops_slotclaim WHERE job = 'autumn'") == [
        ("2026-10-25 02:30", "succeeded")
    ]
    assert db.query("SELECT slot FROM ops_slotclaim WHERE job = 'daily'") == [(legacy_today,)]


def _utc(value) -> dt.datetime:
    if isinstance(value, str):  # SQLite: Django's text in UTC
        return dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def makemigrations_check() -> str:
    """What `manage.py makemigrations ops --check --dry-run` says, raising SystemExit(1) as the
    command does when ops' models ask for a migration its migrations do not have."""
    out = io.StringIO()
    call_command("makemigrations", "ops", check=True, dry_run=True, stdout=out, verbosity=3)
    return out.getvalue()


@pytest.mark.django_db
def test_cronops_models_need_no_migration_its_migrations_lack():
    assert "No changes detected" in makemigrations_check()


@pytest.mark.django_db
def test_an_index_or_constraint_missing_from_the_migrations_is_found(monkeypatch):
    """The indexes and constraints set by ops.models.named() are the ones migrations read: one
    more of each, or one fewer, is a change."""
    meta = JobRun._meta
    more = models.Index(fields=["job", "host"], name="ops_run_job_host")
    for name, value in [
        ("indexes", [*meta.indexes, more]),
        ("indexes", meta.indexes[1:]),
        ("constraints", []),
    ]:
        with monkeypatch.context() as patched:
            patched.setattr(meta, name, value)
            with pytest.raises(SystemExit) as exited:
                makemigrations_check()
        assert exited.value.code == 1


@isolate_apps("ops")
def test_named_wants_each_index_and_constraint_named_in_full():
    class Bare(models.Model):
        job = models.CharField(max_length=10)

        class Meta:
            app_label = "ops"

        def __str__(self) -> str:
            return self.job

    unnamed = models.Index(fields=["job"])
    with pytest.raises(ValueError, match="needs its final name"):
        named(indexes=[unnamed])(Bare)
    templated = models.UniqueConstraint(fields=["job"], name="%(class)s_job")
    with pytest.raises(ValueError, match="needs its final name"):
        named(constraints=[templated])(Bare)
    assert Bare._meta.indexes == Bare._meta.constraints == []  # nothing set by a refusal
    index = models.Index(fields=["job"], name="ops_bare_job")
    assert named(indexes=[index])(Bare)._meta.indexes == [index]


@isolate_apps("ops")
def test_named_is_for_a_concrete_model_whose_meta_declares_neither():
    """It sets, not merges: a Meta's indexes would be lost, and an abstract model's children
    or a proxy would not get them."""

    class Base(models.Model):
        job = models.CharField(max_length=10)

        class Meta:
            abstract = True
            app_label = "ops"

    index = models.Index(fields=["job"], name="ops_x_job")
    for model in (Base, Job, JobRun):  # abstract, a proxy, Meta's (here named()'s) already
        with pytest.raises(ValueError, match="concrete model without Meta's"):
            named(indexes=[index])(model)
