"""The jobs page's buttons in-process: Pause, Resume, Run now and Run again, who may use them
(anonymous users, view-only staff, staff with `ops.run_job`), CSRF, the confirmation, what a
running, done or paused slot says instead of starting anything; a paused job on the pages; and
--until's spellings. The run itself, started for real: tests/test_run_now.py; in Chromium:
tests/test_jobs_page_actions_browser.py."""

import datetime as dt
import os
import re
import threading
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.urls import reverse

from ops.control import runnow
from ops.control.until import parse_until
from ops.models import JobAction, JobPause, JobRun
from tests.test_jobs_page import CAL_NOW, calendar_states, daily, daily_run, detail, staff

__all__ = ["daily"]  # a fixture, shared

UTC = dt.UTC
JOBS = reverse("admin:ops_job_changelist")


def url(kind: str, name: str = "daily", **query) -> str:
    base = reverse(f"admin:ops_job_{kind}", args=[name])
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


@pytest.fixture
def spawned(monkeypatch):
    """run_job is not started in-process (this database is the test's own): the argv is kept."""
    calls = []
    monkeypatch.setattr(runnow, "spawn", lambda argv, action_id: calls.append((argv, action_id)))
    return calls


@pytest.fixture
def operator(db, client):
    client.force_login(staff("operator", "view_jobrun", "run_job"))
    return client


def token_of(html: str) -> str:
    """The signed token of a confirmation page's form (what its POST may start, and when)."""
    found = re.search(r'name="token" value="([^"]+)"', html)
    return found[1] if found else ""


def confirmed(client, target: str, **data):
    """The confirmation page of `target` (a run URL with its query) shown, then its POST."""
    token = token_of(client.get(target).content.decode())
    return client.post(target, {**data, "token": token})


def buttons(html: str) -> list[str]:
    return re.findall(r'class="button (cronops-[a-z-]+)"', html)


@pytest.mark.django_db
def test_anonymous_users_go_to_the_login_and_view_only_staff_get_403_on_every_button_url(
    daily, client, spawned
):
    action = JobAction.objects.create(job="daily", kind="run_now", username="someone", at=CAL_NOW)
    urls = [
        url("pause"),
        url("resume"),
        url("run"),
        url("run", date="2026-11-22"),
        reverse("admin:ops_job_action", args=["daily", action.pk]),
    ]
    for target in urls:
        for method in (client.get, client.post):
            answer = method(target, {"reason": "x"})
            assert answer.status_code == 302, target
            assert answer["Location"].startswith(reverse("admin:login")), target
    client.force_login(staff("viewer", "view_jobrun"))
    with time_machine.travel(CAL_NOW, tick=False):
        assert buttons(client.get(JOBS).content.decode()) == []
        page = client.get(detail("daily")).content.decode()
    assert buttons(page) == []
    assert "cronops-run-again" not in page
    for target in urls:
        assert client.get(target).status_code == 403, target
        assert client.post(target, {"reason": "x"}).status_code == 403, target
    assert not JobPause.objects.exists()
    assert JobAction.objects.count() == 1
    assert spawned == []


@pytest.mark.django_db
def test_staff_with_the_permission_see_the_buttons_and_each_asks_before_it_acts(
    daily, operator, spawned
):
    with time_machine.travel(CAL_NOW, tick=False):
        assert buttons(operator.get(JOBS).content.decode()) == ["cronops-pause", "cronops-run-now"]
        page = operator.get(detail("daily")).content.decode()
        again = re.findall(r'class="cronops-run-again" data-date="([\d-]+)"', page)
        assert again == ["2026-11-20", "2026-11-22", "2026-11-24"]  # missing, failed, skipped
        confirm = operator.get(url("pause")).content.decode()
    assert 'name="csrfmiddlewaretoken"' in confirm
    assert 'method="post"' in confirm
    assert not JobPause.objects.exists()  # a GET only asks


@pytest.mark.django_db
def test_a_button_acts_only_on_a_post_that_carries_the_csrf_token(daily):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("operator", "view_jobrun", "run_job"))
    assert client.post(url("pause"), {"reason": "forged"}).status_code == 403
    assert not JobPause.objects.exists()
    page = client.get(url("pause")).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
    answer = client.post(url("pause"), {"reason": "db migration", "csrfmiddlewaretoken": token})
    assert answer.status_code == 302
    pause = JobPause.objects.get()
    assert (pause.job, pause.paused_by, pause.reason) == ("daily", "operator", "db migration")
    assert JobAction.objects.get().username == "operator"


@pytest.mark.django_db
def test_pause_then_resume_from_the_page_shows_the_job_paused_then_not(daily, operator):
    with time_machine.travel(CAL_NOW, tick=False):
        bad = operator.post(url("pause"), {"until": "yesterday", "reason": "r"})
        assert bad.status_code == 200
        assert "bad --until &#x27;yesterday&#x27;" in bad.content.decode()
        assert not JobPause.objects.exists()
        operator.post(url("pause"), {"until": "2026-12-01", "reason": "migration"})
        html = operator.get(JOBS).content.decode()
        # today's run, started before the pause, is still going: running, the pause named
        assert 'data-job="daily" data-state="running"' in html
        assert "on web-2; paused by operator since 2026-11-29 12:00" in html
        JobRun.objects.filter(outcome="running").update(outcome="succeeded", duration=3.0)
        html = operator.get(JOBS).content.decode()
        assert 'data-job="daily" data-state="paused"' in html
        assert "by operator since 2026-11-29 12:00 until 2026-12-01 00:00 UTC: migration" in html
        assert buttons(html) == ["cronops-resume"]  # no Run now while paused
        run = operator.get(url("run")).content.decode()
        assert "daily is paused by operator" in run and "resume it first" in run
        assert 'input type="submit"' not in run  # nothing to start
        operator.post(url("resume"))
        assert 'data-job="daily" data-state="paused"' not in operator.get(JOBS).content.decode()
    kinds = list(JobAction.objects.order_by("id").values_list("kind", "username"))
    assert kinds == [("pause", "operator"), ("resume", "operator")]


@pytest.mark.django_db
def test_run_now_on_a_running_slot_and_run_again_on_a_done_day_say_so_and_start_nothing(
    daily, operator, spawned
):
    # today's slot is running (on web-2, its heartbeat fresh); yesterday's is done
    with time_machine.travel(CAL_NOW, tick=False):
        for method in (operator.get, operator.post):
            page = method(url("run")).content.decode()
            assert "2026-11-29 is running since 2026-11-29 03:00 on web-2 (pid 1)" in page
            assert 'input type="submit"' not in page
        done = operator.post(url("run", date="2026-11-28")).content.decode()
        assert "2026-11-28 is done already" in done
        assert 'value="Run it again (--force)"' in done
        assert spawned == []
        forced = confirmed(operator, url("run", date="2026-11-28"), date="2026-11-28", force="1")
    action = JobAction.objects.get()
    assert forced.status_code == 302
    assert forced["Location"] == reverse("admin:ops_job_action", args=["daily", action.pk])
    assert (action.kind, action.logical_date, action.force) == (
        "run_again",
        dt.date(2026, 11, 28),
        True,
    )
    [(argv, action_id)] = spawned
    assert action_id == action.pk
    assert argv[0] == "run_job" and argv[1].startswith("--log=") and argv[1].endswith("/daily.log")
    assert argv[2:] == ["--logical-date=2026-11-28", "--force", "daily"]


@pytest.mark.django_db
def test_run_now_on_a_free_slot_starts_run_job_and_answers_at_once_with_the_actions_page(
    daily, operator, spawned
):
    with time_machine.travel(CAL_NOW, tick=False):
        answer = confirmed(operator, url("run", date="2026-11-20"))  # the missing day
        page = operator.get(answer["Location"]).content.decode()
    action = JobAction.objects.get()
    assert (action.kind, action.username, action.logical_date) == (
        "run_again",
        "operator",
        dt.date(2026, 11, 20),
    )
    assert spawned[0][0][2:] == ["--logical-date=2026-11-20", "daily"]
    assert "Starting: the run appears here" in page
    assert '<meta http-equiv="refresh"' in page
    run = daily_run(20)
    JobAction.objects.filter(pk=action.pk).update(run=run)
    with time_machine.travel(CAL_NOW + dt.timedelta(seconds=5), tick=False):
        page = operator.get(answer["Location"]).content.decode()
    assert f'href="{reverse("admin:ops_jobrun_change", args=[run.pk])}">run #{run.pk}</a>' in page
    assert "Succeeded" in page and '<meta http-equiv="refresh"' not in page
    with time_machine.travel(CAL_NOW + dt.timedelta(minutes=2), tick=False):
        JobAction.objects.filter(pk=action.pk).update(run=None)
        page = operator.get(answer["Location"]).content.decode()
    assert "No run was recorded: see the job&#x27;s log" in page or "No run was recorded" in page


@pytest.mark.django_db
def test_the_calendar_shows_the_days_a_pause_covered_as_paused(daily):
    JobPause.objects.create(
        job="daily",
        paused_by="operator",
        since=dt.datetime(2026, 11, 19, 12, tzinfo=UTC),
        ended_at=dt.datetime(2026, 11, 21, 12, tzinfo=UTC),
    )
    client = Client()
    client.force_login(staff("viewer", "view_jobrun"))
    states = calendar_states(client)
    # 11-20 had no run (missing before); 11-19 and 11-21 were served before / after the pause
    assert (states["2026-11-19"], states["2026-11-20"], states["2026-11-21"]) == (
        "served",
        "paused",
        "served",
    )


@pytest.mark.django_db
def test_a_due_slot_a_pause_covered_is_not_overdue_once_the_job_is_resumed(daily):
    from io import StringIO

    from django.core.management import call_command

    JobRun.objects.filter(job="daily", logical_date=dt.date(2026, 11, 29)).delete()
    JobPause.objects.create(
        job="daily",
        paused_by="operator",
        since=dt.datetime(2026, 11, 28, 23, tzinfo=UTC),
        ended_at=dt.datetime(2026, 11, 29, 11, tzinfo=UTC),
    )
    out = StringIO()
    with time_machine.travel(CAL_NOW, tick=False):
        call_command("job_status", "--job", "daily", stdout=out)
    assert "daily: ok: its due slot 2026-11-29 03:00 was paused" in out.getvalue()


NOW = dt.datetime(2026, 12, 2, 10, 30, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(
    ("when", "until"),
    [
        ("90m", "2026-12-02 12:00+00:00"),
        ("1.5h", "2026-12-02 12:00+00:00"),
        ("3d", "2026-12-05 10:30+00:00"),
        ("2026-12-07", "2026-12-07 00:00+01:00"),
        ("2026-12-07T14:00", "2026-12-07 14:00+01:00"),
        ("2026-12-07 14:00:30", "2026-12-07 14:00:30+01:00"),
        ("14:00", "2026-12-02 14:00+01:00"),
        ("9:15", "2026-12-03 09:15+01:00"),  # 09:15 has passed in Berlin (11:30): tomorrow's
    ],
)
def test_until_is_a_duration_a_date_a_date_and_time_or_a_time_in_time_zone(when, until):
    assert parse_until(when, NOW, BERLIN) == dt.datetime.fromisoformat(until)


@pytest.mark.parametrize(
    ("when", "why"),
    [
        ("2026-12-01", "is not in the future"),
        ("11:30", None),  # now, in Berlin: the next is tomorrow's
        ("400d", "bad --until"),
        ("2028-01-01", "more than 365 days ahead"),
        ("tomorrow", "use a duration (2h, 90m, 3d), a date (2026-12-07), a date and time"),
        ("90", "bad --until"),  # a bare number could be minutes or hours: refused
        ("25:00", "bad --until"),
    ],
)
def test_until_refuses_the_past_the_far_future_and_anything_else(when, why):
    if why is None:
        tomorrow = dt.datetime(2026, 12, 3, 11, 30, tzinfo=BERLIN)
        assert parse_until(when, NOW, BERLIN) == tomorrow
        return
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_until(when, NOW, BERLIN)


def test_run_now_spawns_with_this_virtualenvs_python(monkeypatch):
    monkeypatch.setattr("sys.executable", "/srv/app/.venv/bin/uwsgi")
    monkeypatch.setattr("sys.prefix", "/srv/app/.venv")
    assert runnow.python() == os.path.join("/srv/app/.venv", "bin", "python")


@pytest.mark.django_db
def test_the_audit_trail_lists_every_action_with_who_and_when_read_only(daily, operator, spawned):
    with time_machine.travel(CAL_NOW, tick=False):
        operator.post(url("pause"), {"reason": "migration"})
        operator.post(url("resume"))
        confirmed(operator, url("run", date="2026-11-20"))
    client = Client()
    client.force_login(staff("auditor", "view_jobaction"))
    page = client.get(reverse("admin:ops_jobaction_changelist")).content.decode()
    rows = re.findall(r"<tr>.*?</tr>", page.split("<tbody>", 1)[1], re.S)
    assert len(rows) == 3
    assert all("operator" in row and "2026-11-29 " in row for row in rows)  # ISO, in TIME_ZONE
    kinds = [re.search(r'field-kind">([^<]+)<', row)[1] for row in rows]
    assert kinds == ["run again", "resume", "pause"]  # newest first
    assert "addlink" not in page and "Delete" not in page
    action = JobAction.objects.first()
    assert client.post(reverse("admin:ops_jobaction_change", args=[action.pk])).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_a_double_click_on_run_it_again_force_starts_one_run(daily, spawned):
    """Issue 22, item 3. Before: two POSTs at once of "Run it again (--force)" recorded two
    actions and started two runs of one slot (--force passes the claim)."""
    clients = []
    for _ in range(2):
        client = Client()
        clients.append(client)
    user = staff("operator", "view_jobrun", "run_job")
    for client in clients:
        client.force_login(user)
    target = url("run", date="2026-11-28")
    answers: list = [None, None]
    with time_machine.travel(CAL_NOW, tick=False):
        page = clients[0].get(target).content.decode()
        assert 'value="Run it again (--force)"' in page
        form = {"date": "2026-11-28", "force": "1", "token": token_of(page)}
        barrier = threading.Barrier(2)

        def click(i: int) -> None:
            try:
                barrier.wait(10)
                answers[i] = clients[i].post(target, form)
            finally:
                connection.close()

        threads = [threading.Thread(target=click, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    [action] = JobAction.objects.all()
    assert len(spawned) == 1 and spawned[0][1] == action.pk
    assert sorted(a.status_code for a in answers) == [302, 409]
    [refused] = [a for a in answers if a.status_code == 409]
    text = refused.content.decode()
    assert f"already started by operator at 2026-11-29 12:00 UTC: see action #{action.pk}" in text
    assert reverse("admin:ops_job_action", args=["daily", action.pk]) in text
    assert 'input type="submit"' not in text
    # the page shown again (a reload, or the back button) may be posted once more
    with time_machine.travel(CAL_NOW + dt.timedelta(minutes=1), tick=False):
        again = confirmed(clients[0], target, date="2026-11-28", force="1")
    assert again.status_code == 302 and JobAction.objects.count() == 2


@pytest.mark.django_db
def test_a_run_post_without_its_pages_token_starts_nothing(daily, operator, spawned):
    with time_machine.travel(CAL_NOW, tick=False):
        other = token_of(operator.get(url("run", date="2026-11-21")).content.decode())
        for token in ("", "forged", other):  # none, not signed, another date's
            answer = operator.post(url("run", date="2026-11-20"), {"token": token})
            page = answer.content.decode()
            assert answer.status_code == 200
            assert "this confirmation is not this page&#x27;s, or is over an hour old" in page
            assert 'value="Yes, run it"' in page  # confirm again, with a token of its own
    with time_machine.travel(CAL_NOW + dt.timedelta(hours=2), tick=False):
        late = operator.post(url("run", date="2026-11-20"), {"token": token_of(page)})
        assert "over an hour old" in late.content.decode()
    assert not JobAction.objects.exists() and spawned == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("date", "why"),
    [
        ("1969-12-31", "bad date &#x27;1969-12-31&#x27;: logical dates start at 1970-01-01"),
        ("20261120", "bad date &#x27;20261120&#x27;: use YYYY-MM-DD"),
        ("2026-W47-1", "bad date &#x27;2026-W47-1&#x27;: use YYYY-MM-DD"),
    ],
)
def test_run_again_refuses_a_date_run_job_refuses_in_its_words(daily, operator, spawned, date, why):
    """Issue 22, item 4. Before: fromisoformat took them (1969-12-31 as a day, 20261120 and
    2026-W47-1 as 2026-11-20 and 2026-11-16): confirmation shown, the POST recorded an action
    and started run_job, which exited 2."""
    with time_machine.travel(CAL_NOW, tick=False):
        page = operator.get(url("run", date=date)).content.decode()
        assert why in page
        assert 'input type="submit"' not in page
        answer = operator.post(url("run", date=date), {"date": date, "token": token_of(page)})
        assert why in answer.content.decode()
    assert not JobAction.objects.exists() and spawned == []


@pytest.mark.django_db
def test_an_until_in_a_dst_gap_is_echoed_as_the_time_it_is_and_audit_notes_use_time_zone(
    tmp_path, settings
):
    """Issue 22, item 5. Before: `--until=2027-03-28T02:30` in Berlin (a time the clocks skip)
    was echoed `until 2027-03-28 02:30` while job_status showed 03:30+02:00; the resume's
    audit note said `since 2026-12-02 10:30`, in unlabelled UTC."""
    from io import StringIO

    from django.core.management import call_command

    settings.TIME_ZONE = "Europe/Berlin"
    settings.OPS_CRONTAB_DIR = tmp_path
    (tmp_path / "t.cron").write_text("0 3 * * * --name=nightly sleep_demo --seconds=0\n")
    until = parse_until("2027-03-28T02:30", NOW, BERLIN)
    assert until.isoformat() == "2027-03-28T03:30:00+02:00"
    out = StringIO()
    with time_machine.travel(NOW, tick=False):
        call_command("job_pause", "nightly", "--until=2027-03-28T02:30", stdout=out)
        call_command("job_resume", "nightly", stdout=StringIO())
    assert "until 2027-03-28 03:30 Europe/Berlin" in out.getvalue()
    assert JobPause.objects.get().until == until
    note = JobAction.objects.get(kind="resume").note
    assert note.endswith("since 2026-12-02 11:30 Europe/Berlin resumed"), note
    changed = JobAction.objects.get(kind="pause").note
    assert changed.startswith("until 2027-03-28 03:30 Europe/Berlin"), changed


NUL = "a%00b"  # a NUL byte, as a browser or curl sends it in an address
NUL_REQUESTS = [
    ("post", "daily/pause/", {"reason": "nul\x00byte"}, "the field 'reason'"),
    ("post", "daily/pause/", {"until": "1\x00h", "reason": "r"}, "the field 'until'"),
    ("get", f"{NUL}/", {}, "the address"),
    ("get", f"{NUL}/pause/", {}, "the address"),
    ("post", f"{NUL}/resume/", {}, "the address"),
    ("get", f"{NUL}/run/", {}, "the address"),
    ("get", f"{NUL}/actions/1/", {}, "the address"),
    ("get", "daily/run/", {"date": "2026-11-2\x002"}, "the field 'date'"),
    ("post", "daily/run/", {"token": "\x00"}, "the field 'token'"),
    ("get", "/admin/ops/jobrun/", {"job": "a\x00b"}, "the field 'job'"),
    ("get", "/admin/ops/jobrun/", {"outcome__exact": "\x00"}, "the field 'outcome__exact'"),
    ("get", "/admin/ops/slotclaim/", {"state": "\x00"}, "the field 'state'"),
    ("get", "/admin/ops/effect/", {"job": "a\x00b"}, "the field 'job'"),
    ("get", "/admin/ops/jobaction/", {"kind": "\x00"}, "the field 'kind'"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "data", "where"),
    NUL_REQUESTS,
    ids=[f"{m} {p} {sorted(d)}" for m, p, d, _ in NUL_REQUESTS],
)
def test_a_nul_byte_in_a_job_name_or_a_field_is_a_400_saying_where_and_changes_nothing(
    daily, client, spawned, method, path, data, where
):
    """Issue 29, item 6. Before: PostgreSQL refused the NUL in its query (DataError: a 500);
    SQLite stored a pause whose reason held it, or said 404 / 200. `make test-postgresql`
    runs this again on PostgreSQL."""
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    client.raise_request_exception = False  # the 500 it was, not the DataError in the test
    target = path if path.startswith("/") else JOBS + path  # the jobs page's, or the history's
    with time_machine.travel(CAL_NOW, tick=False):
        answer = getattr(client, method)(target, data)
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    assert answer.content.decode() == (
        f"Bad request: {where} holds a NUL byte (%00), which no job name or text can contain.\n"
    )
    assert not JobPause.objects.exists() and not JobAction.objects.exists() and spawned == []
