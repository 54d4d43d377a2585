"""The jobs page's buttons as people use them, in Debian's headless Chromium: the project served
as a deploy serves it (runserver, DEBUG off, after collectstatic), its jobs' checks on the
healthchecks stand-in (tests/hcserver.py). An operator (staff with `ops.run_job`) pauses one job
and runs another now and sees its run appear; a view-only member of staff sees no buttons and
gets 403 behind them; an anonymous visitor is sent to the login and changes nothing."""

import pytest

from tests.browser import Server, chromium_page, log_in, require_browser
from tests.conftest import PING_KEY, base_env
from tests.hcserver import API_KEY
from tests.test_jobs_page_browser import shot

PASSWORD = "correct-horse-battery"
USERS = f"""
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
perms = {{p.codename: p for p in Permission.objects.filter(content_type__app_label="ops")}}
for name, codenames in (("viewer", ["view_jobrun"]), ("operator", ["view_jobrun", "run_job"])):
    user = get_user_model().objects.create_user(name, password={PASSWORD!r}, is_staff=True)
    user.user_permissions.set([perms[c] for c in codenames])
"""


@pytest.fixture
def served(sqlite_project, hc, tmp_path):
    require_browser()
    project = sqlite_project
    project.write_cron(
        "50-test.cron",
        "0 0 * * *  --timeout=30m --name=billing sleep_demo --seconds=0\n"
        "0 0 * * *  --timeout=30m --name=report sleep_demo --seconds=0\n",
    )
    project.write_env(
        HEALTHCHECKS_PING_URL=hc.ping_url,
        HEALTHCHECKS_PING_KEY=PING_KEY,
        HEALTHCHECKS_API_URL=hc.api_url,
        HEALTHCHECKS_API_KEY=API_KEY,
        HEALTHCHECKS_CHANNELS="",
    )
    server = Server(project.dir, base_env())
    server.prepare("admin", PASSWORD)
    for command in (["sync_healthchecks"], ["shell", "-c", USERS]):
        result = project.manage(*command)
        assert result.returncode == 0, result.stderr
    server.start()
    try:
        yield server, project
    finally:
        server.stop()


@pytest.mark.slow
def test_an_operator_pauses_one_job_and_runs_another_now_while_others_may_not(served, hc, tmp_path):
    server, project = served
    base = server.url
    pause_url = f"{base}/admin/ops/job/billing/pause/"
    with chromium_page(tmp_path / "anonymous") as page:
        page.goto(pause_url)
        assert "/admin/login/" in page.url  # sent to the login, nothing shown
        answer = page.request.post(pause_url, form={"reason": "forged"}, max_redirects=0)
        assert answer.status in (302, 403)
    with chromium_page(tmp_path / "viewer") as page:
        log_in(page, base, "viewer", PASSWORD)
        page.goto(base + "/admin/ops/job/")
        assert page.locator("tr.cronops-job").count() == 2
        assert page.locator(".cronops-actions, a.button").count() == 0
        assert page.goto(pause_url).status == 403
        assert page.goto(f"{base}/admin/ops/job/report/run/").status == 403
    assert project.db.query("SELECT count(*) FROM ops_jobpause") == [(0,)]
    assert project.db.query("SELECT count(*) FROM ops_jobaction") == [(0,)]

    with chromium_page(tmp_path / "operator") as page:
        log_in(page, base, "operator", PASSWORD)
        page.goto(base + "/admin/ops/job/")
        page.click("tr[data-job='billing'] a.cronops-pause")
        page.wait_for_url("**/admin/ops/job/billing/pause/")
        page.fill("#id_reason", "ledger migration")
        shot(page, "job-pause-confirmation.png")
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/ops/job/billing/")
        assert "Paused billing by operator" in page.inner_text(".messagelist")
        page.goto(base + "/admin/ops/job/")
        billing = page.locator("tr[data-job='billing']")
        assert billing.get_attribute("data-state") == "paused"
        assert "by operator since" in billing.inner_text()
        assert "ledger migration" in billing.inner_text()
        assert page.locator("tr[data-job='billing'] a.cronops-resume").count() == 1
        shot(page, "jobs-page-paused.png")
        check = hc.check("billing")
        assert (check.status, check.manual_resume) == ("paused", True)

        page.click("tr[data-job='report'] a.cronops-run-now")
        page.wait_for_url("**/admin/ops/job/report/run/")
        assert "runs the slot" in page.inner_text(".cronops-now")
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/ops/job/report/actions/*/")
        # The answer came at once; the page reloads itself until the run has ended.
        page.wait_for_selector(".cronops-run[data-outcome='succeeded']", timeout=60_000)
        shot(page, "job-run-now.png")
        page.click(".cronops-run a")
        page.wait_for_url("**/admin/ops/jobrun/*/change/")
        content = page.inner_text("#content")
        assert "Succeeded" in content and "operator" in content  # started by
        page.goto(base + "/admin/ops/job/")
        marks = page.locator("tr[data-job='report'] a.cronops-mark")
        assert marks.count() == 1
        assert marks.first.get_attribute("data-outcome") == "succeeded"
        assert page.locator("tr[data-job='report']").get_attribute("data-state") == "ok"
    audit = project.db.query("SELECT kind, username, run_id IS NOT NULL FROM ops_jobaction")
    assert audit == [("pause", "operator", 0), ("run_now", "operator", 1)]
    report = [p.kind for p in hc.pings_of("report")]
    assert report[-2:] == ["start", "success"]  # a cron fire's pings
