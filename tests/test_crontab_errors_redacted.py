"""A broken crontab.d line that holds secrets, through every path that shows it (issue 29,
item 3): each prints `file:line` and the line, with every secret cronops knows replaced by
`<redacted NAME>`, whoever reads it (a job's log and cron mail, a monitoring probe, a view-only
member of staff, a deploy's checks, a ping)."""

import html

import pytest

from .conftest import DAILY, PING_KEY, ping_to

DB_PASSWORD = "Pw-S3cretDbPass-77"
SECRET_KEY = "sk-Django-S3cret-" + "k" * 30
API_KEY = "ak-Hc-S3cretApiKey-42"
STRIPE = "rk_live_S3cretStripe99"  # a secret of the project's own, named in OPS_REDACT
SECRETS = {
    "the database password": DB_PASSWORD,
    "SECRET_KEY": SECRET_KEY,
    "HEALTHCHECKS_API_KEY": API_KEY,
    "HEALTHCHECKS_PING_KEY": PING_KEY,
    "STRIPE_API_KEY": STRIPE,
}
# The line: a schedule Debian's cron misreads, a command given every secret.
BAD_LINE = (
    f"0~5 3 * * * --name=bad2 secrets_arg --token={DB_PASSWORD} --key={SECRET_KEY} "
    f"--api={API_KEY} --hc={PING_KEY} --stripe={STRIPE}\n"
)
VIEWER_PAGES = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()  # the test client's host, `testserver`, allowed
viewer = get_user_model().objects.create_user("viewer", is_staff=True)
viewer.user_permissions.set(Permission.objects.filter(codename="view_jobrun"))
client = Client()
client.force_login(viewer)
for url in ("/admin/ops/job/", "/admin/ops/job/t_ok/"):
    page = client.get(url)
    assert page.status_code == 200, (url, page.status_code)
    print(page.content.decode())
"""


def shown(result) -> str:
    return result.stdout + result.stderr


def run_job_log(project, tmp_path, server):
    log = tmp_path / "t_ok.log"
    result = project.run_job(f"--log={log}", "t_ok")
    assert result.returncode == 0, shown(result)
    return log.read_text()


def run_job_output(project, tmp_path, server):  # what cron mails
    result = project.run_job("t_ok")
    assert result.returncode == 0, shown(result)
    return shown(result)


def pings(project, tmp_path, server):
    assert project.run_job("t_ok").returncode == 0
    bodies = "\n".join(request.get_data(as_text=True) for request, _ in server.log)
    assert "fine" in bodies, "no ping with the job's output arrived"
    return bodies


def job_status(*options):
    def path(project, tmp_path, server):
        result = project.manage("job_status", *options)
        assert result.returncode == 2, shown(result)
        return shown(result)

    return path


def textfile(project, tmp_path, server):
    target = tmp_path / "cronops.prom"
    result = project.manage("job_status", "--format=prometheus", f"--output={target}")
    assert result.returncode == 2, shown(result)
    return shown(result) + (target.read_text() if target.exists() else "")


def pages_to_a_viewer(project, tmp_path, server):
    assert project.run_job("t_ok").returncode == 0  # a history: its page, despite crontab.d
    result = project.manage("shell", "-c", VIEWER_PAGES)
    assert result.returncode == 0, result.stderr
    return html.unescape(result.stdout)


def command(*args):
    def path(project, tmp_path, server):
        result = project.manage(*args)
        assert result.returncode != 0, shown(result)
        return shown(result)

    return path


PATHS = {
    "run_job's --log": run_job_log,
    "run_job's output (cron mail)": run_job_output,
    "pings": pings,
    "job_status": job_status(),
    "job_status --json": job_status("--json"),
    "job_status --format=prometheus": job_status("--format=prometheus"),
    "the Prometheus textfile": textfile,
    "the jobs page and a job's page, to view-only staff": pages_to_a_viewer,
    "manage.py check": command("check"),
    "install_crontab": command("install_crontab", "--dry-run", "--tabfile=/dev/null"),
    "sync_healthchecks": command("sync_healthchecks"),
    "export_schedule": command(
        "export_schedule", "--format=kubernetes", "--image=app:1", "--env-secret=app"
    ),
}


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
def test_every_path_that_shows_a_broken_crontab_d_line_shows_it_without_its_secrets(
    pg_project, ping_server, tmp_path, path
):
    project = pg_project
    ping_to(project, ping_server)
    project.write_env(
        # trust authentication: the server never asks for the password, cronops still knows it
        DATABASE_URL=project.db.url.replace("://postgres@", f"://postgres:{DB_PASSWORD}@", 1),
        SECRET_KEY=SECRET_KEY,
        HEALTHCHECKS_API_KEY=API_KEY,
        STRIPE_API_KEY=STRIPE,
        OPS_REDACT="STRIPE_API_KEY",
    )
    assert DB_PASSWORD in project.settings["DATABASE_URL"]
    project.add_command("t_ok", "print('fine')")
    project.write_cron("10-good.cron", f"{DAILY} t_ok\n")
    bad = project.write_cron("20-bad.cron", BAD_LINE)

    text = path(project, tmp_path, ping_server)

    assert [name for name, value in SECRETS.items() if value in text] == [], text
    if path is not pings:  # a ping carries the job's output, never run_job's warnings
        assert f"{bad}:1: bad minute '0~5'" in text, text
        line = "0~5 3 * * * --name=bad2 secrets_arg --token=<redacted the database password>"
        assert line in text, text
        assert "--stripe=<redacted STRIPE_API_KEY>" in text, text
