"""The run history, the Jobs page and a job's page at a small window's 1,024 px and a laptop's
1,280 px, in Debian's headless Chromium: no horizontal scroll, every column title readable.

The project is served as a deploy serves it (tests/browser.py). TIME_ZONE is Europe/Moscow
(UTC+3 all year), so a time shown in UTC, or as the slot's raw key, is caught. The history is
the kind that fills the columns: long job names, a */5 job and a daily job, a failure with exit
137, a time-out, a retry, a run started by someone with a 30-character "started by".
"""

import datetime as dt
import os
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from ops.schedule.slots import current_slot, previous_slots
from tests.browser import Server, chromium_page, log_in, require_browser
from tests.conftest import REPO, base_env
from tests.test_status import insert_sql

ARTEFACTS = Path(os.environ.get("CRONOPS_TEST_ARTEFACTS") or REPO / "var/test-artefacts")
TZ = ZoneInfo("Europe/Moscow")
USER, PASSWORD = "operator", "correct-horse-battery"
DAILY = "reconcile-payment-provider-settlements"  # 0 3 * * *: its slot is a date
EVERY_5 = "expire-stale-invitations-and-reset-tokens"  # */5: its slot is a time
STARTED_BY = "on-call-operator-7"  # 18 characters, the most started_how shows
STARTED_HOW = f"{STARTED_BY} (Jobs page)"  # 30 characters, what the cell shows
WIDTHS = (1024, 1280)


def run(job, slot, outcome, started, *, exit_code=0, duration=4.2, attempt=1, **extra):
    fields = {
        "job": job,
        "slot": slot.key if slot else "",
        "logical_date": slot.logical_date if slot else None,
        "scheduled_at": slot.at if slot else None,
        "outcome": outcome,
        "note": "",
        "exit_code": None if outcome == "running" else exit_code,
        "started_at": started,
        "finished_at": None if outcome == "running" else started + dt.timedelta(seconds=duration),
        "duration": None if outcome == "running" else duration,
        "lag": (started - slot.at).total_seconds() if slot and slot.at else None,
        "host": "app-01.example.net",
        "pid": 4242,
        "rid": "",
        "command": job,
        "output_tail": "",
        "started_by": "",
        "attempt": attempt,
    }
    fields.update(extra)
    return ("run", fields)


def history(now: dt.datetime):
    """(rows, facts): 60 runs of the */5 job and 40 of the daily one; the newest runs (the
    first page of the history) are the ones that make cells long."""
    midnight = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    five = current_slot("*/5 * * * *", midnight, TZ)  # 00:00 UTC, 03:00 in Moscow
    daily = current_slot("0 3 * * *", now, TZ)
    rows = []
    for slot in previous_slots("0 3 * * *", daily, 40, TZ):
        rows.append(run(DAILY, slot, "succeeded", slot.at + dt.timedelta(seconds=2), duration=95))
    for slot in previous_slots("*/5 * * * *", five, 60, TZ):
        rows.append(run(EVERY_5, slot, "succeeded", slot.at + dt.timedelta(seconds=1)))
    started = five.at + dt.timedelta(seconds=1)
    rows += [
        run(EVERY_5, five, "failed", started, exit_code=137, note="killed"),
        run(
            EVERY_5,
            five,
            "succeeded",
            started + dt.timedelta(minutes=2),
            attempt=2,
            started_by=STARTED_BY,  # started from the jobs page
            trigger="page",
        ),
        run(
            DAILY,
            daily,
            "timed_out",
            daily.at + dt.timedelta(seconds=3),
            exit_code=124,
            duration=1800.0,
        ),
        run(DAILY, daily, "skipped", daily.at + dt.timedelta(minutes=1), exit_code=75),
        run("one-off-data-fix", None, "succeeded", now - dt.timedelta(hours=1), duration=5400),
    ]
    return rows, {"five": five, "daily": daily}


@pytest.fixture
def served(sqlite_project):
    require_browser()
    project = sqlite_project
    project.write_cron(
        "50-test.cron",
        f"0 3 * * *    --timeout=30m --name={DAILY} sleep_demo --seconds=0\n"
        f"*/5 * * * *  --name={EVERY_5} sleep_demo --seconds=0\n",
    )
    # TIME_ZONE differs from the system's here: a warning for runserver, not an error.
    project.write_env(TIME_ZONE="Europe/Moscow", OPS_HEARTBEAT_SECONDS=600)
    rows, facts = history(dt.datetime.now(dt.UTC))
    insert_sql(project.db, rows)
    server = Server(project.dir, base_env())
    server.prepare(USER, PASSWORD)
    server.start()
    try:
        yield server, facts
    finally:
        server.stop()


# Measures the table in its box (the admin's div.results, which scrolls sideways when the
# table is wider): its widths, and every column title and cell whose text is cut or hidden.
MEASURE = """table => {
  const box = table.closest('.results') || table.parentElement;
  const boxRect = box.getBoundingClientRect();
  const cut = [];
  for (const cell of table.querySelectorAll('thead th, tbody td, tbody th')) {
    const text = cell.querySelector(':scope > .text') || cell;
    const range = document.createRange();
    range.selectNodeContents(text);
    const right = range.getBoundingClientRect().right;
    const cellRight = cell.getBoundingClientRect().right;
    if (text.scrollWidth > text.clientWidth || cell.scrollWidth > cell.clientWidth
        || right > cellRight + 0.5 || right > boxRect.right + 0.5 || right > innerWidth) {
      cut.push(`${cell.closest('thead') ? 'title' : 'cell'} ${JSON.stringify(text.innerText)}`
               + ` (${text.scrollWidth} px in ${text.clientWidth})`);
    }
  }
  return {table: table.scrollWidth, box: box.clientWidth, boxScroll: box.scrollWidth,
          page: document.documentElement.scrollWidth,
          titles: [...table.querySelectorAll('thead th')].map(th => th.innerText.trim()),
          cut};
}"""

SPANS = """cells => cells.filter(c => c.querySelector('svg.cronops-spark')).map(c => [
  c.querySelector('.cronops-strip').getBoundingClientRect().width,
  c.querySelector('svg.cronops-spark').getBoundingClientRect().width])"""


def measure(page, selector: str) -> dict:
    return page.eval_on_selector(selector, MEASURE)


def shot(page, name: str) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTEFACTS / name))  # the window: the top of the page


@pytest.mark.slow
def test_the_run_history_the_jobs_page_and_a_jobs_page_fit_1024_and_1280_px_titles_readable(
    served, tmp_path
):
    server, _ = served
    pages = {
        "history": ("/admin/ops/jobrun/", "#result_list"),
        "jobs": ("/admin/ops/job/", "#cronops-jobs"),
        "job": (f"/admin/ops/job/{EVERY_5}/", "#cronops-jobs"),
    }
    found, problems = {}, []
    with chromium_page(tmp_path / "chromium-profile", width=WIDTHS[0], height=800) as page:
        log_in(page, server.url, USER, PASSWORD)
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 800})
            for name, (path, table) in pages.items():
                page.goto(server.url + path)
                m = found[name, width] = measure(page, table)
                shot(page, f"fit-{name}-{width}.png")
                if m["table"] > m["box"] or m["boxScroll"] > m["box"] or m["page"] > width:
                    problems.append(
                        f"{name} at {width} px: table {m['table']} px in a {m['box']} px box "
                        f"(page {m['page']} px)"
                    )
                cut = sorted(set(m["cut"]), key=m["cut"].index)
                if cut:
                    problems.append(f"{name} at {width} px: {len(m['cut'])} cut: {cut[:8]}")
                assert all(m["titles"]), (name, width, m["titles"])  # no empty column title
                if name != "history":  # the durations line spans the attempt bars above it
                    problems += [
                        f"{name} at {width} px: durations {line} px under bars {bars} px"
                        for bars, line in page.eval_on_selector_all("td.cronops-history", SPANS)
                        if abs(bars - line) > 1
                    ]
    assert not problems, "\n".join(problems)
    assert len(found["history", 1024]["titles"]) >= 4  # a changelist, not one merged column


@pytest.mark.slow
def test_the_run_history_shows_slots_in_time_zone_with_exit_codes_and_who_started_each_run(
    served, tmp_path
):
    server, facts = served
    five, daily = facts["five"], facts["daily"]
    with chromium_page(tmp_path / "chromium-profile", width=1024, height=800) as page:
        log_in(page, server.url, USER, PASSWORD)
        page.goto(server.url + "/admin/ops/jobrun/")
        breadcrumbs = page.inner_text("div.breadcrumbs")
        assert "Cron operations" in breadcrumbs, breadcrumbs
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 50  # a full page of the history
        newest = [rows.nth(i).inner_text() for i in range(5)]
        one_off, skipped, timed_out, retried, failed = newest
        # the */5 job's slot at 00:00 UTC reads 03:00, Moscow's time, as the admin shows times
        moscow = five.at.astimezone(TZ).strftime("%Y-%m-%d %H:%M")
        assert moscow.endswith(" 03:00")

        def slot(i: int) -> str:
            return rows.nth(i).locator(".cronops-slot").inner_text()

        assert slot(4) == slot(3) == moscow
        assert "+03:00" not in failed and "+00:00" not in failed
        assert slot(2) == daily.key  # the daily job's slot is its date
        assert "Failed" in failed and "137" in failed
        assert "Timed out" in timed_out and "124" in timed_out
        assert STARTED_HOW in retried and "attempt 2" in retried
        assert "Skipped" in skipped
        assert "one-off-data-fix" in one_off and "1.5h" in one_off
        for text in newest:
            assert "app-01.example.net" in text
        started = rows.nth(3).locator(".cronops-started-by")
        width = started.evaluate("e => e.getBoundingClientRect().width")
        assert started.inner_text() == STARTED_HOW
        assert width >= 150  # room for ~30 characters on one line
        assert started.evaluate("e => e.getClientRects().length") == 1, "wrapped"
