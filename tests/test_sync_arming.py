"""Checks made by sync_healthchecks are armed: a job whose first run never happens alerts.

The healthchecks server evaluates a check's schedule only once it has been pinged: a `new`
check never goes down (hc/api/models.py, `get_grace_start` returns None for it). The stand-in
(tests/hcserver.py) follows that rule: `going_down_after()` is when `sendalerts` would flip the
check down, `status_at(t)` what the API would show at t.
"""

import datetime as dt
import io
import json
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from django.core.management import call_command

from .conftest import PING_KEY
from .test_sync_healthchecks import TAG, configured, sync, sync_with_stderr

__all__ = ["configured"]  # a fixture, shared

MOSCOW = ZoneInfo("Europe/Moscow")


@pytest.fixture
def pinging(hc, configured, settings):
    """The jobs ping this server by slug, with the project's ping key (the docs' .env)."""
    settings.HEALTHCHECKS_PING_URL = hc.ping_url
    settings.HEALTHCHECKS_PING_KEY = PING_KEY
    return configured


def first_alert(expr: str, after: dt.datetime, grace: int) -> dt.datetime:
    """When an armed check alerts if no run comes: the first fire time after `after`, + grace."""
    return next(CronSim(expr, after.astimezone(MOSCOW))).astimezone(dt.UTC) + dt.timedelta(
        seconds=grace
    )


def test_a_check_sync_makes_alerts_one_grace_after_its_first_slot_without_any_run(
    hc, pinging, time_machine
):
    # 15:07 in Moscow: no fire time of these schedules falls inside the test.
    time_machine.move_to(dt.datetime(2027, 1, 10, 12, 7, tzinfo=dt.UTC), tick=True)
    before = dt.datetime.now(dt.UTC)
    code, out, _ = sync()
    assert code == 0, out
    charge = hc.check("charge_daily")
    alert = first_alert("0 3 * * *", before, 1800)
    assert charge.going_down_after() == alert
    second = dt.timedelta(seconds=1)
    assert charge.status_at(alert - second) == "grace"
    assert charge.status_at(alert) == "down"
    assert hc.check("clear-sessions").going_down_after() == first_alert("0 0 * * *", before, 600)
    assert hc.check("tick").going_down_after() == first_alert("*/15 * * * *", before, 60)
    # An @reboot job has no slot to miss: its check waits for its first run.
    assert hc.check("warmup").going_down_after() is None
    # One success per armed check, by POST, saying what it is; never an alert (new -> up).
    armings = [p for p in hc.pings if p.kind == "success"]
    assert sorted(p.slug for p in armings) == ["charge_daily", "clear-sessions", "tick"]
    assert {(p.method, p.action) for p in armings} == {("POST", "success")}
    assert all(p.body.startswith(b"cronops: armed by sync_healthchecks") for p in armings)
    assert all(PING_KEY.encode() not in p.body for p in armings)
    local = alert.astimezone(MOSCOW).strftime("%Y-%m-%d %H:%M")
    assert f"armed        charge_daily: alerts at {local} if no run has pinged by then" in out
    assert out.splitlines()[-1] == "healthchecks.io: 4 created, 3 armed, 0 unchanged"
    # A second sync changes nothing, and says so (Ansible's changed_when reads that line).
    pings, writes = len(hc.pings), len(hc.writes())
    assert sync()[1].strip() == "healthchecks.io: nothing to change (4 checks up to date)"
    assert (len(hc.pings), len(hc.writes())) == (pings, writes)


def test_a_check_made_before_arming_is_armed_by_the_next_sync(hc, pinging, settings):
    settings.HEALTHCHECKS_PING_KEY = ""  # as an older cronops left them: never pinged
    sync()
    assert {c.status for c in hc.checks.values()} == {"new"}
    settings.HEALTHCHECKS_PING_KEY = PING_KEY
    code, out, _ = sync()
    assert code == 0
    assert out.splitlines()[-1] == "healthchecks.io: 3 armed, 1 unchanged"
    assert hc.check("charge_daily").status_at() == "up"
    assert hc.check("charge_daily").going_down_after() is not None


def test_dry_run_says_which_checks_it_would_arm_and_pings_nothing(hc, pinging):
    sync()
    for check in hc.checks.values():  # back to never pinged
        check.status, check.last_ping = "new", None
    pings = len(hc.pings)
    code, out, _ = sync("--dry-run")
    assert code == 0
    assert "would arm    charge_daily: alerts at " in out
    assert out.splitlines()[-1] == (
        "healthchecks.io: 3 to arm, 1 unchanged (dry run: nothing was changed)"
    )
    assert len(hc.pings) == pings
    assert {c.status for c in hc.checks.values()} == {"new"}


def test_only_a_new_check_its_job_pings_is_armed(hc, pinging):
    # Up or down: the job's own pings armed it (a success would hide a real failure). Paused:
    # a ping would resume it. Pings going to another server: ours would go down every day.
    hc.add(slug="charge_daily", tags=TAG, schedule="0 3 * * *", kind="cron", status="down")
    hc.add(slug="clear-sessions", kind="cron", schedule="0 0 * * *", status="paused")
    # Its check here, made by hand with the job's slug, is left alone (never armed).
    hc.add(slug="elsewhere", kind="cron", schedule="0 5 * * *")
    (pinging / "20-more.cron").write_text(
        "0 5 * * * --name=elsewhere --ping=https://hc.example.com/ping/other-key/elsewhere "
        "sleep_demo --seconds=0\n"
        "0 6 * * * --name=fresh sleep_demo --seconds=0\n"
    )
    code, out, err, _ = sync_with_stderr()
    assert code == 0, out
    armed = sorted(p.slug for p in hc.pings)
    assert armed == ["fresh", "tick"]
    assert hc.check("charge_daily").status == "down"
    assert hc.check("clear-sessions").status == "paused"
    assert hc.check("elsewhere").status == "new"
    assert "elsewhere" not in out + err


@pytest.mark.parametrize(
    "ping",
    [
        "{hc.ping_url}other-project-key/{name}",  # the job's slug, another project's ping key
        "https://hc.example.com/ping/{key}/{name}",  # the job's slug, another server
    ],
)
def test_a_job_pinging_its_slug_in_another_project_or_server_gets_no_check_here(hc, pinging, ping):
    # Before: sync made a check here that no run ever pinged: `new` for ever, never armed,
    # never alerting; job_status meanwhile promised an alert one grace after a missed slot.
    url = ping.format(hc=hc, key=PING_KEY, name="elsewhere")
    (pinging / "20-more.cron").write_text(
        f"0 5 * * * --name=elsewhere --ping={url} sleep_demo --seconds=0\n"
    )
    code, out, err, _ = sync_with_stderr()
    assert code == 0, out + err
    assert "elsewhere" not in {c.slug for c in hc.checks.values()}
    assert "elsewhere" not in out + err
    assert out.splitlines()[-1] == "healthchecks.io: 4 created, 3 armed, 0 unchanged"
    assert PING_KEY not in out + err and "other-project-key" not in out + err
    # One made for it by an older sync is this project's, and stale, saying why.
    hc.add(
        slug="elsewhere", kind="cron", schedule="0 5 * * *", tags=TAG, desc="cronops job: elsewhere"
    )
    code, out, err, _ = sync_with_stderr()
    [line] = [line for line in out.splitlines() if "elsewhere" in line]
    assert line.startswith(f"stale        elsewhere: tagged {TAG!r}, its job pings a")
    assert line.endswith("(--prune deletes it)")
    assert PING_KEY not in out + err and "other-project-key" not in out + err


def test_job_status_promises_no_alert_for_a_check_sync_does_not_arm(hc, pinging, db):
    # Before: a never-run job pinging another check said "once sync_healthchecks has armed its
    # healthchecks.io check, a slot that passes without a run alerts one grace later": that
    # check is never armed by sync, and a check never pinged never alerts.
    other = hc.add(slug="shared", kind="cron", schedule="0 4 * * *")
    (pinging / "20-more.cron").write_text(
        f"0 5 * * * --name=by-uuid --ping={other.uuid} sleep_demo --seconds=0\n"
        f"0 5 * * * --name=by-slug --ping={hc.ping_url}{PING_KEY}/shared sleep_demo --seconds=0\n"
        f"0 5 * * * --name=other-key --ping={hc.ping_url}k2/other-key sleep_demo --seconds=0\n"
    )
    reasons = {}
    for name in ("by-uuid", "by-slug", "other-key", "charge_daily"):
        out = io.StringIO()
        with pytest.raises(SystemExit):
            call_command("job_status", "--json", "--job", name, stdout=out)
        [job] = json.loads(out.getvalue())["jobs"]
        reasons[name] = job["reason"]
    for name in ("by-slug", "other-key"):
        assert "alerts one grace later" not in reasons[name], reasons[name]
        assert reasons[name].endswith(
            ": sync_healthchecks arms only the check with the job's slug, and healthchecks.io "
            "never alerts on a check before its first ping"
        )
    # Its UUID may be the slug's own check (sync arms that one) or another: no promise either way.
    assert "alerts one grace later" not in reasons["by-uuid"]
    assert reasons["by-uuid"].endswith(
        "; it pings the check its --ping UUID names, which alerts on a slot that passes without "
        "a run only once armed: sync_healthchecks arms it when it is the check with the job's "
        "slug, and healthchecks.io never alerts on a check before its first ping"
    )
    assert "; it pings another check (--ping):" in reasons["by-slug"]
    assert "; it pings a check of another project (its --ping URL holds" in reasons["other-key"]
    assert "alerts one grace later" in reasons["charge_daily"]  # its own slug: armed by sync


def test_without_a_ping_key_the_checks_are_not_armed_and_sync_says_why(hc, configured):
    code, out, err, _ = sync_with_stderr()
    assert code == 0
    assert hc.pings == []
    assert out.splitlines()[-1] == "healthchecks.io: 4 created, 0 unchanged"
    assert err.splitlines() == [
        "warning: charge_daily, clear-sessions, tick: checks not armed: HEALTHCHECKS_PING_KEY "
        "is not set, so their runs send no pings (an armed check would go down after its "
        "first slot)"
    ]


def test_a_check_filtering_by_body_is_armed_with_its_success_keyword(hc, pinging):
    sync()
    for slug in ("charge_daily", "tick"):
        hc.check(slug).status, hc.check(slug).last_ping = "new", None
    hc.check("charge_daily").filter_http_body = True
    hc.check("charge_daily").success_kw = "ALL DONE, fine"
    hc.check("tick").filter_http_body = True  # no keyword: a ping could only be ignored
    code, _, err, _ = sync_with_stderr()
    assert code == 0
    assert hc.check("charge_daily").status_at() == "up"
    assert hc.check("tick").status == "new"
    assert "tick" in err and "not armed" in err


def test_job_status_says_when_a_never_run_job_alerts_once_its_check_is_armed(
    hc, pinging, db, settings
):
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("job_status", "--json", "--job", "charge_daily", stdout=out)
    [job] = json.loads(out.getvalue())["jobs"]
    assert job["state"] == "never run"
    nxt = dt.datetime.fromisoformat(job["next_fire"]).astimezone(MOSCOW)
    alert = (nxt + dt.timedelta(minutes=30)).strftime("%Y-%m-%d %H:%M")
    assert job["reason"] == (
        "no run in the history; once sync_healthchecks has armed its healthchecks.io check, "
        f"a slot that passes without a run alerts one grace later (the next: {alert})"
    )
    settings.HEALTHCHECKS_PING_KEY = ""  # no pings: healthchecks.io hears nothing of it
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("job_status", "--json", "--job", "charge_daily", stdout=out)
    assert json.loads(out.getvalue())["jobs"][0]["reason"] == "no run in the history"


def test_an_arming_ping_the_server_refuses_is_one_line_and_exit_1(hc, pinging):
    # The checks are made; the next sync arms them.
    hc.ping = lambda request: hc._answer("boom", 503)
    code, out, error = sync()
    assert code == 1
    assert error.startswith("healthchecks.io: arming check 'charge_daily': ")
    assert "HTTP 503" in error and "\n" not in error
    assert "created      charge_daily" in out
    assert {c.status for c in hc.checks.values()} == {"new"}
