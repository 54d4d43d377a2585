"""Make docs/jobs-page.png and docs/job-calendar.png from the demo data (`make screenshots`).

A throwaway SQLite database in var/screenshots gets the demo's made-up history
(`seed_demo --history`); the project is served as a deploy serves it (DEBUG off, collectstatic,
WhiteNoise) and Debian's Chromium takes the pictures.
"""

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.browser import Server, chromium_page, log_in, manage  # noqa: E402

USER, PASSWORD = "ops", "demo-password-for-screenshots"


def main() -> None:
    var = REPO / "var" / "screenshots"
    shutil.rmtree(var, ignore_errors=True)
    env = dict(os.environ)
    # Empty values win over a developer's .env: never a real database or healthchecks project.
    env.update(
        OPS_VAR_DIR=str(var),
        OPS_CRONTAB_DIR=str(REPO / "crontab.d"),
        DATABASE_URL="",
        HEALTHCHECKS_PING_KEY="",
        HEALTHCHECKS_API_KEY="",
        TIME_ZONE=os.environ.get("SCREENSHOT_TIME_ZONE", "UTC"),
        SECRET_KEY="screenshots-only",  # noqa: S106 (a throwaway database)
        OPS_HOST="screenshots",  # the demo runs are from web1: their pids are not ours
    )
    server = Server(REPO, env)
    server.prepare(USER, PASSWORD)
    manage(REPO, server.env, "seed_demo", "--history")
    server.start()
    try:
        # 1,280 px: a laptop's width, which the page must fit (tests/test_jobs_page_browser.py)
        with chromium_page(var / "chromium-profile", width=1280, height=700) as page:
            log_in(page, server.url, USER, PASSWORD)
            page.goto(server.url + "/admin/ops/job/")
            page.screenshot(path=str(REPO / "docs" / "jobs-page.png"), full_page=True)
            page.goto(server.url + "/admin/ops/job/charge_daily/")
            page.screenshot(path=str(REPO / "docs" / "job-calendar.png"), full_page=True)
    finally:
        server.stop()
    print("docs/jobs-page.png, docs/job-calendar.png")


if __name__ == "__main__":
    main()
