"""The run history in the Django admin, driven in headless Chromium (Debian's `chromium`)."""

import datetime as dt
import os
import re

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from ops.models import Effect, JobRun, Outcome, SlotClaim
from tests.browser import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import require

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the browser tests skip (fail in CI) without it
    expect = sync_playwright = None


PASSWORD = "correct-horse-battery"
FAILED_OUTPUT = "charging 12 subscriptions\nTraceback (most recent call last):\nupstream down\n"


def make_run(job, outcome, slot, started, exit_code, output=""):
    """A finished run as the runner records it (runs are inserted in the order they start)."""
    slot_at = dt.datetime.fromisoformat(slot).replace(tzinfo=dt.UTC)
    start = dt.datetime.fromisoformat(started).replace(tzinfo=dt.UTC)
    return JobRun.objects.create(
        job=job,
        slot=slot,
        logical_date=slot_at.date(),
        scheduled_at=slot_at,
        outcome=outcome,
        exit_code=exit_code,
        note="CommandError: upstream down" if outcome == Outcome.FAILED else "",
        started_at=start,
        finished_at=start + dt.timedelta(seconds=4.2),
        duration=4.2,
        lag=(start - slot_at).total_seconds(),
        host="web1",
        pid=4242,
        command=f"charge_daily --logical-date={slot_at.date().isoformat()}",
        output_tail=output,
    )


@pytest.fixture
def history(db):
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    ok = make_run(
        "charge_daily", Outcome.SUCCEEDED, "2026-11-28 03:00", "2026-11-28 03:00:02", 0, "charged\n"
    )
    make_run("clear-sessions", Outcome.SUCCEEDED, "2026-11-29 00:00", "2026-11-29 00:00:01", 0)
    failed = make_run(
        "charge_daily", Outcome.FAILED, "2026-11-29 03:00", "2026-11-29 03:00:03", 3, FAILED_OUTPUT
    )
    SlotClaim.objects.create(
        job="charge_daily",
        slot=failed.slot,
        logical_date=failed.logical_date,
        state=Outcome.FAILED,
        run=failed,
        host="web1",
        pid=4242,
        started_at=failed.started_at,
        heartbeat_at=failed.started_at,
    )
    return {"ok": ok, "failed": failed}


@pytest.fixture
def browser_page(tmp_path):
    require(os.path.exists(CHROMIUM), f"chromium not found at {CHROMIUM} (apt install chromium)")
    if sync_playwright is None:
        require(False, "playwright not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh profile per test
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
        )
        context.set_default_timeout(15_000)
        try:
            yield context.new_page()
        finally:
            context.close()


def log_in(page, base):
    page.goto(base + "/admin/login/?next=/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_operator_logs_in_sees_the_failed_run_and_reads_its_output(
    history, live_server, browser_page
):
    page = browser_page
    log_in(page, live_server.url)
    page.click("text=Job runs")
    page.wait_for_url("**/admin/ops/jobrun/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    newest = rows.nth(0).inner_text()
    assert "Failed" in newest
    assert "2026-11-29 03:00:03" in newest
    assert "3.0s" in newest  # start lag
    assert "web1" in newest
    assert "2026-11-29" in newest and "Nov. 29" not in newest  # the logical date, as ISO
    # the outcome filter's labels, capitalised alike
    labels = page.locator("#changelist-filter li a").all_inner_texts()
    assert {"Succeeded", "Timed out", "Taken over"} <= set(labels), labels

    page.click("#changelist-filter >> text=Failed")
    page.wait_for_url("**/admin/ops/jobrun/?outcome__exact=failed")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    page.locator("#result_list tbody tr").nth(0).locator("a").first.click()
    page.wait_for_url(re.compile(rf"/admin/ops/jobrun/{history['failed'].pk}/change/"))

    output = page.locator("pre.cronops-output")
    expect(output).to_be_visible()
    assert "Traceback (most recent call last):" in output.inner_text()
    assert "upstream down" in output.inner_text()
    body = page.inner_text("#content")
    assert "CommandError: upstream down" in body
    assert "2026-11-29 03:00" in body
    # read-only: no form field, no save button, no delete link
    assert page.locator("input[name=job]").count() == 0
    assert page.locator("input[type=submit][name=_save]").count() == 0
    assert page.locator("a.deletelink").count() == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_history_filters_by_job_and_searches(history, live_server, browser_page):
    page = browser_page
    log_in(page, live_server.url)
    page.goto(live_server.url + reverse("admin:ops_jobrun_changelist"))
    page.click("#changelist-filter >> text=clear-sessions")
    page.wait_for_url("**/admin/ops/jobrun/?job=clear-sessions")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    page.goto(live_server.url + reverse("admin:ops_jobrun_changelist"))
    page.fill("#searchbar", "upstream")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**/admin/ops/jobrun/?q=upstream")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(page.locator("#result_list tbody tr")).to_contain_text("Failed")


def test_the_admin_refuses_to_add_change_or_delete_runs(history, admin_client):
    failed = history["failed"]
    assert admin_client.get(reverse("admin:ops_jobrun_add")).status_code == 403
    change = reverse("admin:ops_jobrun_change", args=[failed.pk])
    page = admin_client.get(change)
    assert page.status_code == 200
    assert b"Traceback (most recent call last):" in page.content
    assert admin_client.post(change, {"job": "tampered"}).status_code == 403
    delete = reverse("admin:ops_jobrun_delete", args=[failed.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert JobRun.objects.get(pk=failed.pk).job == "charge_daily"
    claim = SlotClaim.objects.get()
    assert admin_client.get(reverse("admin:ops_slotclaim_add")).status_code == 403
    claim_page = admin_client.get(reverse("admin:ops_slotclaim_change", args=[claim.pk]))
    assert claim_page.status_code == 200
    assert (
        admin_client.post(
            reverse("admin:ops_slotclaim_delete", args=[claim.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert SlotClaim.objects.filter(pk=claim.pk).exists()


def test_the_claims_list_links_each_claim_to_its_run(history, admin_client):
    page = admin_client.get(reverse("admin:ops_slotclaim_changelist"))
    assert page.status_code == 200
    link = reverse("admin:ops_jobrun_change", args=[history["failed"].pk])
    assert link.encode() in page.content


def test_the_effects_done_once_are_listed_read_only_each_with_a_link_to_its_run(
    history, admin_client
):
    failed = history["failed"]
    effect = Effect.objects.create(
        job="charge_daily",
        slot=failed.slot,
        key="charge subscription 3",
        run_id=failed.pk,
        version=1,
        created_at=failed.started_at,
    )
    page = admin_client.get(reverse("admin:ops_effect_changelist"))
    assert page.status_code == 200
    assert b"charge subscription 3" in page.content
    assert reverse("admin:ops_jobrun_change", args=[failed.pk]).encode() in page.content
    assert admin_client.get(reverse("admin:ops_effect_add")).status_code == 403
    change = reverse("admin:ops_effect_change", args=[effect.pk])
    assert admin_client.get(change).status_code == 200
    assert admin_client.post(change, {"key": "tampered"}).status_code == 403
    delete = reverse("admin:ops_effect_delete", args=[effect.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Effect.objects.get(pk=effect.pk).key == "charge subscription 3"


def test_the_admin_section_reads_cron_operations_capitalised_like_every_other_section(
    history, admin_client
):
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert "Cron operations" in index and "cron operations" not in index
    runs = admin_client.get(reverse("admin:ops_jobrun_changelist")).content.decode()
    # Django 5.2's breadcrumbs are a div, 6's an ordered list
    breadcrumbs = re.search(r'class="breadcrumbs">(.*?)</(?:div|ol)>', runs, re.S)
    assert breadcrumbs and "Cron operations" in breadcrumbs.group(1)


@pytest.mark.parametrize(
    "key, at, shown",
    [
        ("2026-12-03", None, "2026-12-03"),  # a daily job's slot is its date
        ("2026-12-03 03:00+03:00", None, "2026-12-03 01:00"),  # keyed in Moscow, shown in Berlin
        ("2026-07-01 12:05+02:00", None, "2026-07-01 12:05"),
        # the repeated autumn hour: the two 02:30s keep their offsets
        ("2026-10-25 02:30+02:00", None, "2026-10-25 02:30+02:00"),
        ("2026-10-25 02:30+01:00", None, "2026-10-25 02:30+01:00"),
        # a key without offset (older rows) is read from the slot's fire time
        ("2026-11-29 03:00", dt.datetime(2026, 11, 29, 3, tzinfo=dt.UTC), "2026-11-29 04:00"),
        ("2026-11-29 03:00", None, "2026-11-29 03:00"),
        ("", None, ""),
    ],
)
def test_the_history_shows_a_slot_in_time_zone_as_the_admin_shows_times(settings, key, at, shown):
    from ops.admin import local_slot

    settings.TIME_ZONE = "Europe/Berlin"
    assert local_slot(key, at) == shown


def test_a_read_only_admin_is_set_up_as_djangos_model_admin_is():
    """ReadOnlyAdmin skips BaseModelAdmin.__init__'s deep copy of the form-field defaults (a
    start-up cost of every command, bench/RESULTS.md P9): what Django's __init__ sets must all
    be there (a newer Django setting more fails here)."""
    from django.contrib.admin import ModelAdmin, site

    from ops.admin import ReadOnlyAdmin

    ours, djangos = ReadOnlyAdmin(JobRun, site), ModelAdmin(JobRun, site)
    assert ours.formfield_overrides == djangos.formfield_overrides
    assert ours.formfield_overrides is ours.formfield_overrides  # made once
    assert set(vars(ours)) - {"_formfield_overrides"} == set(vars(djangos)) - {
        "formfield_overrides"
    }


def test_a_read_only_admins_urls_are_djangos_routes_and_names():
    """ReadOnlyAdmin builds Django's ModelAdmin URL list itself (one wrapper a view, made at
    the request): the same routes and names, so a newer Django's change shows here."""
    from django.contrib.admin import ModelAdmin, site

    from ops.admin import ReadOnlyAdmin

    def shape(urls):
        return [
            (type(u.pattern), str(u.pattern), u.pattern._is_endpoint, u.default_args, u.name)
            for u in urls
        ]

    assert shape(ReadOnlyAdmin(JobRun, site).get_urls()) == shape(
        ModelAdmin(JobRun, site).get_urls()
    )


def test_a_projects_subclass_of_a_read_only_admin_gets_djangos_set_up_whole():
    from django import forms
    from django.contrib.admin import site
    from django.db import models

    from ops.admin import ReadOnlyAdmin

    class Mine(ReadOnlyAdmin):
        formfield_overrides = {models.TextField: {"widget": forms.TextInput}}

        def __init__(self, model, admin_site):
            super().__init__(model, admin_site)
            self.seen = True

    mine = Mine(JobRun, site)
    assert mine.seen
    assert mine.formfield_overrides[models.TextField]["widget"] is forms.TextInput
    assert models.DateTimeField in mine.formfield_overrides  # Django's defaults merged in
    mine.formfield_overrides = {}
    assert mine.formfield_overrides == {}


def test_a_projects_subclass_of_an_ops_admin_has_its_urls_checked_under_its_commands(
    monkeypatch,
):
    """cronops' own admin URLs are checked in its test suite only (OwnURL); a project's
    subclass may add routes of its own, and `manage.py check` checks them as the project's."""
    from django.contrib.admin import site

    from ops.admin import JobRunAdmin

    def extra(request):
        return None

    class MyRunAdmin(JobRunAdmin):
        def views(self):
            return [*super().views(), ("/extra/", extra, "extra")]

    monkeypatch.setattr("sys.argv", ["manage.py", "check"])
    found = [m.id for url in MyRunAdmin(JobRun, site).get_urls() for m in url.check()]
    assert found == ["urls.W002"]  # the route beginning with "/"
    assert [m for url in JobRunAdmin(JobRun, site).get_urls() for m in url.check()] == []
