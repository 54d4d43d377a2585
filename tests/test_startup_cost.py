"""What cronops adds to every other command of a project: its app, its admin and its system
checks, and nothing of the run, the schedule or the jobs page (bench/RESULTS.md, P9: another
command of a fresh startproject costs within a few percent of its CPU with cronops adopted).
A module list, not a timing: what a command imports is what it pays for."""

import json
import subprocess
import sys

import pytest

from .conftest import PING_KEY, REPO, base_env

PROBE = """
import json, sys
sys.argv = ["manage.py", "some_command"]  # any command but check and runserver
sys.path.insert(0, ".")
import django
from django.core.checks import run_checks
from django.urls import reverse
django.setup()
run_checks()
reverse("admin:index")  # the URL checks build every admin URL the same way
ours = ("ops", "cronsim", "crontab", "dotenv", "requests")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ours)))
"""


@pytest.mark.process
def test_another_command_imports_none_of_the_run_the_schedule_or_the_jobs_page():
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env=base_env(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL="sqlite:///:memory:"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    heavy = {
        m
        for m in loaded
        if m.startswith(("ops.run.", "ops.control.", "ops.monitors.", "ops.schedule.crontabd"))
        or m in ("ops.jobs_page", "cronsim", "crontab", "requests")
        if m != "ops.monitors.redact"  # OPS_REDACT's names are a check (ops.W006): small
    }
    assert heavy == set(), sorted(heavy)


def test_a_run_loads_the_monitors_slot_claim_retry_and_after_modules_only_when_it_uses_them(
    sqlite_project, hc
):
    """Issue 33: a fire pays for what it uses. The job, forked from run_job, lists what run_job
    had imported by then."""
    project = sqlite_project
    project.add_command(
        "t_modules",
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('ops.') or m == 'shlex')))",
    )
    optional = {
        "ops.monitors.pings",
        "ops.monitors.sentry",
        "ops.monitors.dsn",
        "ops.run.claimstep",
        "ops.run.retries",
        "ops.run.after",
        "ops.run.enqueue",
        "ops.run.held",  # the job's process makes its HeldClaim when it asks for it
        "shlex",
    }
    plain = project.run_job("t_modules")
    assert plain.returncode == 0, plain.stderr
    assert set(plain.stdout.split()) & optional == set()

    project.write_env(HEALTHCHECKS_PING_URL=hc.ping_url, HEALTHCHECKS_PING_KEY=PING_KEY)
    project.write_cron("t.cron", "0 3 * * * --retries=1 t_modules\n")
    declared = project.run_job("--logical-date=2026-01-01", "t_modules")
    assert declared.returncode == 0, declared.stderr
    loaded = set(declared.stdout.split()) & optional
    assert loaded == {"ops.monitors.pings", "ops.run.claimstep", "ops.run.retries"}
