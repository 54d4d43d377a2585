"""The admin's jobs page and a job's calendar, in-process (the browser test is in
tests/test_jobs_page_browser.py): the same states as job_status, the strip, the sparkline,
the calendar's days, the links, and who may see it."""

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from ops import jobs_page
from ops.models import JobRun, Outcome, SlotClaim
from tests import test_status
from tests.test_status import EXPECTED, NOW, at, insert_orm, scenario_rows

cron_dir = test_status.cron_dir  # the shared fixture (a crontab.d of test jobs)
UTC = dt.UTC
JOBS = reverse("admin:ops_job_changelist")


def detail(name: str) -> str:
    return reverse("admin:ops_job_detail", args=[name])


def rows_of(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<tr class="cronops-job" data-job="([^"]+)" data-state="([^"]+)"', html)


def marks_of(html: str, job: str) -> list[str]:
    row = html.split(f'data-job="{job}"', 1)[1].split("</tr>", 1)[0]
    return re.findall(r'class="cronops-mark" data-outcome="([^"]+)"', row)


@pytest.fixture
def scenario(request, db):
    directory = request.getfixturevalue("cron_dir")
    insert_orm(scenario_rows())
    return directory


@pytest.mark.django_db
def test_the_jobs_page_shows_problems_first_then_job_status_order_under_a_summary(
    scenario, admin_client
):
    with time_machine.travel(NOW, tick=False):
        page = admin_client.get(JOBS)
    assert page.status_code == 200
    html = page.content.decode()
    # failing, overdue, never run, running, (paused,) ok; crontab.d's order within a state
    assert rows_of(html) == [
        ("bad-job", "failing"),
        ("late-job", "overdue"),
        ("new-job", "never run"),
        ("busy-job", "running"),
        ("ok-job", "ok"),
        ("boot-job", "ok"),
        ("export", "ok"),
    ]
    assert sorted(rows_of(html)) == sorted(EXPECTED.items())
    assert re.search(
        r'id="cronops-summary">1 failing · 1 overdue · 1 never run · 1 running · 3 ok<', html
    )
    assert "last run timed out (exit 124), 2 failures in a row" in html
    # bad-job: succeeded, failed, timed out (the skip is not an attempt), oldest first
    assert marks_of(html, "bad-job") == ["succeeded", "failed", "timed_out"]
    assert marks_of(html, "busy-job") == ["succeeded", "running"]
    assert marks_of(html, "new-job") == []
    assert 'title="slot 2026-11-29 11:00+00:00 · timed out · exit 124 · 5m"' in html


@pytest.mark.django_db
def test_a_run_taken_over_shows_in_its_own_colour_and_changes_no_state(scenario, admin_client):
    ok = JobRun.objects.filter(job="ok-job").order_by("started_at").last()
    JobRun.objects.create(
        job="ok-job",
        slot=ok.slot,
        logical_date=ok.logical_date,
        scheduled_at=ok.scheduled_at,
        outcome=Outcome.TAKEN_OVER,
        exit_code=75,
        started_at=ok.started_at - dt.timedelta(minutes=2),  # the frozen holder started first
        finished_at=ok.finished_at + dt.timedelta(minutes=1),
        duration=180.0,
        host="web-1",
        pid=1,
    )
    with time_machine.travel(NOW, tick=False):
        html = admin_client.get(JOBS).content.decode()
    assert dict(rows_of(html))["ok-job"] == "ok"
    assert marks_of(html, "ok-job") == ["succeeded", "taken_over", "succeeded"]
    colour = jobs_page.OUTCOME_COLOURS[Outcome.TAKEN_OVER]
    others = {c for o, c in jobs_page.OUTCOME_COLOURS.items() if o != Outcome.TAKEN_OVER}
    assert colour not in others
    assert f'background-color:{colour}"></span>taken over' in html  # the legend
    legend = html.split('class="cronops-legend"', 1)[1].split("</p>", 1)[0]
    assert "</span>skipped" not in legend  # skips are never marks of the strip


@pytest.mark.django_db
def test_a_running_run_whose_process_is_gone_is_marked_abandoned_not_running(
    scenario, admin_client
):
    from ops import conf

    JobRun.objects.create(
        job="adhoc-dead",
        outcome=Outcome.RUNNING,
        started_at=NOW - dt.timedelta(minutes=5),
        host=conf.host(),
        pid=2**22 + 7,  # above Linux's pid_max: no such process
    )
    with time_machine.travel(NOW, tick=False):
        html = admin_client.get(JOBS).content.decode()
    assert dict(rows_of(html))["adhoc-dead"] == "failing"
    assert marks_of(html, "adhoc-dead") == ["abandoned"]


# --- who may see it -------------------------------------------------------------------------


def staff(username: str, *perms: str):
    user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.mark.django_db
def test_only_staff_who_may_view_the_history_see_the_jobs_page(scenario, client):
    client.force_login(staff("claims-only", "view_slotclaim"))
    assert client.get(JOBS).status_code == 403
    assert client.get(detail("ok-job")).status_code == 403
    index = client.get(reverse("admin:index")).content.decode()
    assert "Slot claims" in index  # the user sees the Ops app ...
    assert JOBS not in index  # ... but no Jobs entry
    client.force_login(staff("history", "view_jobrun"))
    assert client.get(JOBS).status_code == 200
    assert client.get(detail("ok-job")).status_code == 200
    assert JOBS in client.get(reverse("admin:index")).content.decode()
    client.logout()
    assert client.get(JOBS).status_code == 302  # to the login page


@pytest.mark.django_db
def test_the_jobs_page_offers_no_add_change_or_delete(scenario, admin_client):
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert "/admin/ops/job/add/" not in html
    assert admin_client.get("/admin/ops/job/add/").status_code == 404  # no such job
    assert admin_client.get(detail("no-such-job")).status_code == 404


# --- what it shows --------------------------------------------------------------------------


@pytest.mark.django_db
def test_times_are_shown_in_time_zone(scenario, admin_client, settings):
    settings.TIME_ZONE = "Asia/Tokyo"
    with time_machine.travel(NOW, tick=False):
        html = admin_client.get(JOBS).content.decode()
    # ok-job fires at 03:00 Tokyo time; at NOW (21:00 Tokyo) the next one is tomorrow's
    row = html.split('data-job="ok-job"', 1)[1].split("</tr>", 1)[0]
    assert '<div class="cronops-next" title="next fire time">2026-11-30 03:00</div>' in row
    assert "as of 2026-11-29 21:00 (Asia/Tokyo)" in html


@pytest.mark.django_db
def test_a_broken_crontab_d_is_one_line_above_the_jobs_of_the_history(scenario, admin_client):
    (scenario / "60-bad.cron").write_text("61 * * * * sleep_demo\n")
    with time_machine.travel(NOW, tick=False):
        html = admin_client.get(JOBS).content.decode()
    assert re.search(r'class="cronops-error">crontab.d: .*60-bad.cron:1: bad minute', html)
    assert sorted(job for job, _ in rows_of(html)) == sorted(
        j for j in EXPECTED if j != "new-job"
    )  # the declared jobs become ad hoc; the never-run one is unknown without crontab.d


@pytest.mark.django_db
def test_the_query_count_grows_neither_with_the_history_nor_with_the_jobs(scenario, admin_client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> int:
        with time_machine.travel(NOW, tick=False), CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(JOBS).status_code == 200
        return len(ctx.captured_queries)

    test_status.grow_history(0, more_jobs=3)  # one of each kind of job
    before = queries()
    test_status.grow_history(200, more_jobs=60, first=3)
    assert queries() == before
    assert before <= 14  # the session and user, job_status's statements, the pictures'


# --- the calendar ---------------------------------------------------------------------------

DAILY = "0 3 * * *\t--timeout=30m --name=daily sleep_demo --seconds=0\n"
CAL_NOW = at("2026-11-29 12:00")


def daily_run(day: int, outcome=Outcome.SUCCEEDED, *, month=11, later=0, claim=True):
    slot_at = dt.datetime(2026, month, day, 3, 0, tzinfo=UTC)
    start = slot_at + dt.timedelta(seconds=2 + later)
    run = JobRun.objects.create(
        job="daily",
        slot=slot_at.strftime("%Y-%m-%d %H:%M"),
        logical_date=slot_at.date(),
        scheduled_at=slot_at,
        outcome=outcome,
        exit_code=None if outcome == Outcome.RUNNING else 0,
        started_at=start,
        finished_at=None if outcome == Outcome.RUNNING else start + dt.timedelta(seconds=3),
        duration=None if outcome == Outcome.RUNNING else 3.0,
        host="web-2",
        pid=1,
    )
    if claim and outcome != Outcome.SKIPPED:
        SlotClaim.objects.update_or_create(
            job="daily",
            slot=run.slot,
            defaults=dict(
                logical_date=run.logical_date,
                state=outcome,
                run=run,
                host="web-2",
                pid=1,
                started_at=start,
                heartbeat_at=CAL_NOW if outcome == Outcome.RUNNING else start,
            ),
        )
    return run


@pytest.fixture
def daily(tmp_path, settings, db):
    directory = tmp_path / "crontab.d"
    directory.mkdir()
    (directory / "50-daily.cron").write_text(DAILY)
    settings.OPS_CRONTAB_DIR = directory
    settings.TIME_ZONE = "UTC"
    for day in range(10, 29):
        if day == 20:
            continue  # missing: no run at all
        if day == 22:
            daily_run(day, Outcome.FAILED)
        elif day == 24:
            daily_run(day, Outcome.SKIPPED)
        elif day == 26:
            daily_run(day, Outcome.FAILED, claim=False)
            daily_run(day, Outcome.SUCCEEDED, later=3600)
        else:
            daily_run(day)
    daily_run(29, Outcome.RUNNING)


def calendar_states(client, name="daily") -> dict[str, str]:
    with time_machine.travel(CAL_NOW, tick=False):
        html = client.get(detail(name)).content.decode()
    return dict(re.findall(r'data-date="([\d-]+)" data-state="([^"]+)"', html))


@pytest.mark.django_db
def test_the_calendar_shows_each_logical_date_served_failed_skipped_missing_in_progress(
    daily, admin_client
):
    states = calendar_states(admin_client)
    assert len(states) == 90
    assert sorted(states)[0] == "2026-09-01"
    assert sorted(states)[-1] == "2026-11-29"
    assert states["2026-11-09"] == "before history"
    assert states["2026-11-10"] == "served"
    assert states["2026-11-20"] == "missing"
    assert states["2026-11-22"] == "failed"
    assert states["2026-11-24"] == "skipped"
    assert states["2026-11-26"] == "served"  # failed, then served by a run by hand
    assert states["2026-11-28"] == "served"
    assert states["2026-11-29"] == "in progress"


@pytest.mark.django_db
def test_a_slot_counts_as_missing_only_once_its_grace_has_passed(daily, admin_client):
    JobRun.objects.filter(logical_date=dt.date(2026, 11, 29)).delete()
    SlotClaim.objects.filter(logical_date=dt.date(2026, 11, 29)).delete()
    with time_machine.travel(at("2026-11-29 03:20"), tick=False):
        html = admin_client.get(detail("daily")).content.decode()
    assert 'data-date="2026-11-29" data-state="nothing due"' in html  # grace: 30 minutes
    with time_machine.travel(at("2026-11-29 03:31"), tick=False):
        html = admin_client.get(detail("daily")).content.decode()
    assert 'data-date="2026-11-29" data-state="missing"' in html


@pytest.mark.django_db
def test_each_day_links_to_its_runs_in_the_history(daily, admin_client):
    with time_machine.travel(CAL_NOW, tick=False):
        html = admin_client.get(detail("daily")).content.decode()
    link = re.search(r'data-date="2026-11-26"[^>]*href="([^"]+)"', html).group(1)
    assert link == reverse("admin:ops_jobrun_changelist") + "?job=daily&amp;logical_date=2026-11-26"
    runs = admin_client.get(link.replace("&amp;", "&")).content.decode()
    table = runs.split('id="result_list"', 1)[1].split("</table>", 1)[0]
    rows = table.split("<tbody>", 1)[1].count("<tr")
    assert rows == 2
    assert "Succeeded" in table and "Failed" in table
    assert "2026-11-25" not in table


@pytest.mark.parametrize(
    "expr",
    ["* * * * *", "*/15 * * * *", "0 3 * * *", "30 2 * * *", "0,30 9-17 * * 1-5", "0 4 1 * *"],
)
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_due_slots_counted_from_the_fields_agree_with_cronsim_fire_by_fire(expr, zone):
    from cronsim import CronSim

    tz = ZoneInfo(zone)
    day = dt.date(2026, 3, 20)  # over the spring DST night in Berlin (29 March)
    for _ in range(15):
        midnight = dt.datetime.combine(day, dt.time(0), tzinfo=tz)
        end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(0), tzinfo=tz)
        fires = 0
        for fire in CronSim(expr, midnight - dt.timedelta(minutes=1)):
            if fire >= end:
                break
            fires += fire >= midnight
        assert jobs_page.due_slots(expr, day, midnight, end, tz) == fires, (expr, day)
        day += dt.timedelta(days=1)


@pytest.mark.django_db
def test_an_ad_hoc_jobs_calendar_counts_runs_on_the_day_they_started(scenario, admin_client):
    with time_machine.travel(NOW, tick=False):
        html = admin_client.get(detail("export")).content.decode()
    states = dict(re.findall(r'data-date="([\d-]+)" data-state="([^"]+)"', html))
    assert states["2026-11-29"] == "served"
    assert states["2026-11-28"] == "before history"
    link = re.search(r'data-date="2026-11-29"[^>]*href="([^"]+)"', html).group(1)
    runs = admin_client.get(link.replace("&amp;", "&")).content.decode()
    table = runs.split('id="result_list"', 1)[1].split("</table>", 1)[0]
    assert table.split("<tbody>", 1)[1].count("<tr") == 1
    assert "2026-11-29 08:00:00" in table


@pytest.mark.django_db
def test_what_a_crontab_d_or_a_run_says_is_escaped_on_both_pages(scenario, admin_client):
    evil = "<script>alert(1)</script>"
    (scenario / "60-evil.cron").write_text(f"# {evil}\n0 5 * * * --name=evil sleep_demo\n")
    JobRun.objects.create(
        job="evil",
        slot="2026-11-29",
        outcome=Outcome.FAILED,
        exit_code=1,
        started_at=NOW - dt.timedelta(hours=2),
        finished_at=NOW - dt.timedelta(hours=2),
        duration=1.0,
        host=evil,
        note=evil,
        pid=1,
    )
    with time_machine.travel(NOW, tick=False):
        pages = [admin_client.get(JOBS), admin_client.get(detail("evil"))]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert "<script>" not in html
        assert "&lt;script&gt;" in html


@pytest.mark.django_db
def test_a_retried_slot_shows_each_attempt_and_is_judged_by_its_last(scenario, admin_client):
    """--retries: the failed attempt before the success is a mark of its own, titled with its
    attempt number; the job stays ok (the slot's outcome is its last attempt's)."""
    ok = JobRun.objects.filter(job="ok-job").order_by("started_at").last()
    first = JobRun.objects.create(
        job="ok-job",
        slot=ok.slot,
        logical_date=ok.logical_date,
        scheduled_at=ok.scheduled_at,
        outcome=Outcome.FAILED,
        exit_code=75,
        started_at=ok.started_at - dt.timedelta(minutes=2),
        finished_at=ok.started_at - dt.timedelta(minutes=1),
        duration=60.0,
        host="web-1",
        pid=1,
    )
    ok.attempt = 2
    ok.save()
    with time_machine.travel(NOW, tick=False):
        html = admin_client.get(JOBS).content.decode()
    assert dict(rows_of(html))["ok-job"] == "ok"
    assert marks_of(html, "ok-job")[-2:] == ["failed", "succeeded"]
    assert f"slot {ok.slot} · attempt 2 · succeeded" in html
    assert f'href="/admin/ops/jobrun/{first.pk}/change/"' in html
