"""The jobs page as an operator sees it: the project served the way a deploy serves it
(`runserver` with DEBUG off after `collectstatic`, static files through WhiteNoise), looked at
in Debian's headless Chromium.

The history is prepared relative to the real clock (the server is another process): every job
fires daily three hours ago in TIME_ZONE (Asia/Tokyo, so a time shown in UTC would be wrong by
nine hours), and nothing on the page is near a boundary while the test runs.
"""

import datetime as dt
import os
import re
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from ops import jobs_page
from ops.schedule.slots import current_slot, previous_slots
from tests.browser import Server, chromium_page, log_in, require_browser, rgb, style
from tests.conftest import REPO, base_env
from tests.test_status import insert_sql

# The screenshots outlive the test run (pytest's tmp_path does not): `make test` leaves them
# here for a look, and CI can keep the folder.
ARTEFACTS = Path(os.environ.get("CRONOPS_TEST_ARTEFACTS") or REPO / "var/test-artefacts")

TZ = ZoneInfo("Asia/Tokyo")
USER, PASSWORD = "operator", "correct-horse-battery"
HEADER_BG = "rgb(65, 118, 144)"  # the admin's --header-bg (#417690): base.css applied


def shot(page, name: str) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    target = ARTEFACTS / name
    target.unlink(missing_ok=True)
    page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 10_000  # a page, not an empty canvas


def row(job, slot, outcome, started, duration=4.0, exit_code=0, note=""):
    return (
        "run",
        {
            "job": job,
            "slot": slot.key if slot else "",
            "logical_date": slot.logical_date if slot else None,
            "scheduled_at": slot.at if slot else None,
            "outcome": outcome,
            "note": note,
            "exit_code": None if outcome == "running" else exit_code,
            "started_at": started,
            "finished_at": None
            if outcome == "running"
            else started + dt.timedelta(seconds=duration),
            "duration": None if outcome == "running" else duration,
            "lag": (started - slot.at).total_seconds() if slot else None,
            "host": "web-2",  # another host: its pids mean nothing here
            "pid": 4242,
            "rid": "",
            "command": job,
            "output_tail": "",
        },
    )


def claim(job, slot, state, started, beat):
    return (
        "claim",
        {
            "job": job,
            "slot": slot.key,
            "logical_date": slot.logical_date,
            "state": state,
            "host": "web-2",
            "pid": 4242,
            "started_at": started,
            "heartbeat_at": beat,
        },
    )


def prepared_history(now: dt.datetime, expr: str):
    """(rows, facts): 40 days of five daily jobs and one ad-hoc job, newest slot 3 h ago."""
    latest = current_slot(expr, now, TZ)
    slots = [*previous_slots(expr, latest, 39, TZ), latest]  # oldest first
    age = {s.key: len(slots) - 1 - i for i, s in enumerate(slots)}
    rows = []

    def attempt(job, slot, outcome, later=0.0, claims=True, **kw):
        started = slot.at.astimezone(dt.UTC) + dt.timedelta(seconds=2 + later)
        rows.append(row(job, slot, outcome, started, **kw))
        if claims and outcome != "skipped":  # one claim per slot: its latest attempt's
            beat = now if outcome == "running" else started
            rows.append(claim(job, slot, outcome, started, beat))

    for slot in slots:
        a = age[slot.key]
        # billing: missing 5 days ago, failed 8 days ago, only skipped 15 days ago, failed
        # then run again by hand 2 days ago; ok today
        if a == 5:
            pass
        elif a == 8:
            attempt("billing", slot, "failed", exit_code=1, note="CommandError: gateway down")
        elif a == 15:
            attempt("billing", slot, "skipped", exit_code=75)
        elif a == 2:
            attempt("billing", slot, "failed", claims=False, exit_code=1, note="gateway down")
            attempt("billing", slot, "succeeded", later=3600, duration=30.0)
        else:
            attempt("billing", slot, "succeeded", duration=10.0 + a % 7)
        # sweeper: failing for the last two days
        attempt("sweeper", slot, "failed" if a <= 1 else "succeeded", exit_code=int(a <= 1))
        # reindex: nothing for the last three days: overdue
        if a >= 3:
            attempt("reindex", slot, "succeeded")
        # export: running now
        attempt("export", slot, "running" if a == 0 else "succeeded")
    one_off = now - dt.timedelta(days=2)
    rows.append(row("one-off", None, "succeeded", one_off, duration=95.0))
    return rows, {"latest": latest, "day": {age[s.key]: s.logical_date for s in slots}}


def billing_strip(rows) -> list[str]:
    """The colours the strip must show: billing's last 30 attempts (skips are not), oldest
    first."""
    runs = [f for kind, f in rows if kind == "run" and f["job"] == "billing"]
    runs.sort(key=lambda f: f["started_at"])
    attempts = [f["outcome"] for f in runs if f["outcome"] != "skipped"][-30:]
    return [rgb(jobs_page.OUTCOME_COLOURS[o]) for o in attempts]


@pytest.fixture
def served(sqlite_project, tmp_path):
    """The deployed copy with a prepared history, served by `runserver` with DEBUG off."""
    require_browser()
    project = sqlite_project
    now = dt.datetime.now(dt.UTC)
    three_hours_ago = now.astimezone(TZ) - dt.timedelta(hours=3)
    expr = f"{three_hours_ago.minute} {three_hours_ago.hour} * * *"
    project.write_cron(
        "50-test.cron",
        "".join(
            f"{expr}  --timeout=30m --name={name} sleep_demo --seconds=0\n"
            for name in ("billing", "sweeper", "reindex", "export", "fresh")
        ),
    )
    # TIME_ZONE differs from the system's here: a warning for runserver, not an error.
    project.write_env(TIME_ZONE="Asia/Tokyo", OPS_HEARTBEAT_SECONDS=600)
    rows, facts = prepared_history(now, expr)
    insert_sql(project.db, rows)
    server = Server(project.dir, base_env())
    server.prepare(USER, PASSWORD)
    server.start()
    try:
        yield server, rows, facts
    finally:
        server.stop()


@pytest.mark.slow
def test_the_jobs_page_served_with_debug_off_is_styled_and_pictures_the_history(served, tmp_path):
    server, rows, facts = served
    with chromium_page(tmp_path / "chromium-profile") as page:
        log_in(page, server.url, USER, PASSWORD)
        # the admin's stylesheet reached the browser (no CSS: a transparent header)
        assert style(page, "#header") == HEADER_BG
        page.click("a[href='/admin/ops/job/']")  # Ops → Jobs, from the admin's index
        page.wait_for_url("**/admin/ops/job/")
        assert style(page, "#header") == HEADER_BG

        jobs = page.locator("tr.cronops-job")
        states = [
            (jobs.nth(i).get_attribute("data-job"), jobs.nth(i).get_attribute("data-state"))
            for i in range(jobs.count())
        ]
        assert states == [  # problems first
            ("sweeper", "failing"),
            ("reindex", "overdue"),
            ("fresh", "never run"),
            ("export", "running"),
            ("billing", "ok"),
            ("one-off", "ok"),
        ]
        summary = "1 failing · 1 overdue · 1 never run · 1 running · 2 ok"
        assert page.inner_text("#cronops-summary") == summary
        for job, state in states:  # each state in its colour
            badge = f"tr[data-job='{job}'] .cronops-state"
            assert style(page, badge) == rgb(jobs_page.STATE_COLOURS[state])
            assert page.inner_text(badge) == state
        sweeper = page.inner_text("tr[data-job='sweeper']")
        assert "last run failed (exit 1), 2 failures in a row" in sweeper

        marks = page.locator("tr[data-job='billing'] a.cronops-mark")
        assert marks.count() == 30
        colours = [
            marks.nth(i).evaluate("e => getComputedStyle(e).backgroundColor") for i in range(30)
        ]
        assert colours == billing_strip(rows)
        assert colours.count(rgb(jobs_page.OUTCOME_COLOURS["failed"])) == 2
        failed = marks.nth(colours.index(rgb(jobs_page.OUTCOME_COLOURS["failed"])))
        assert re.fullmatch(r"slot .+ · failed · exit 1 · 4\.0s", failed.get_attribute("title"))
        assert page.get_attribute("tr[data-job='billing'] svg.cronops-spark", "data-count") == "30"
        assert page.locator("tr[data-job='billing'] svg line.cronops-median").count() == 1

        # times in TIME_ZONE: the next fire is tomorrow's slot, in Tokyo time
        next_fire = (facts["latest"].at + dt.timedelta(days=1)).astimezone(TZ)
        shown = page.inner_text("tr[data-job='billing'] .cronops-next")
        assert shown == next_fire.strftime("%Y-%m-%d %H:%M")
        shot(page, "jobs-page.png")

        page.click("tr[data-job='billing'] th a")
        page.wait_for_url("**/admin/ops/job/billing/")
        day = facts["day"]

        def cell(age: int) -> str:
            return f"a.cronops-day[data-date='{day[age].isoformat()}']"

        expected = {
            0: "served",
            2: "served",
            5: "missing",
            8: "failed",
            15: "skipped",
            30: "served",
        }
        for age, state in expected.items():
            assert page.get_attribute(cell(age), "data-state") == state, age
            assert style(page, cell(age)) == rgb(jobs_page.DAY_COLOURS[state]), age
        before = day[39] - dt.timedelta(days=1)
        assert page.get_attribute(f"a.cronops-day[data-date='{before}']", "data-state") == (
            "before history"
        )
        assert page.locator("a.cronops-day").count() == 90
        assert "0 of 1 slots served" in page.get_attribute(cell(5), "title")
        shot(page, "job-calendar.png")

        # a day links to its runs: the failure and the run by hand that served it
        page.click(cell(2))
        page.wait_for_url(re.compile(r"/admin/ops/jobrun/\?"))
        runs = page.locator("#result_list tbody tr")
        assert runs.count() == 2
        assert "Succeeded" in runs.nth(0).inner_text()
        assert "Failed" in runs.nth(1).inner_text()


def page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 1024])
def test_the_jobs_page_and_a_calendar_fit_the_window_without_a_horizontal_scroll(
    served, tmp_path, width
):
    """A laptop's 1,280 px and a small window's 1,024 px: the page is no wider than its
    viewport, every column (the strip and the sparkline too) inside it."""
    server, _, _ = served
    with chromium_page(tmp_path / "chromium-profile", width=width, height=800) as page:
        log_in(page, server.url, USER, PASSWORD)
        for path, name in (("/admin/ops/job/", "jobs"), ("/admin/ops/job/billing/", "calendar")):
            page.goto(server.url + path)
            assert page_width(page) <= width, (name, page_width(page))
            shot(page, f"{name}-{width}.png")
            right = page.evaluate(
                "Math.max(...[...document.querySelectorAll('#cronops-jobs th, #cronops-jobs td,"
                " svg.cronops-spark')].map(e => e.getBoundingClientRect().right))"
            )
            assert right <= width, (name, right)
