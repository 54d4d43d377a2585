"""Adopting cronops in an existing Django project, as README "Add cronops to your project" says.

A fresh virtualenv (with the pip `python -m venv` gives it) gets cronops from a clean copy of
the repository through the README's own `pip install` line, and its `git+file://` form too.
Then a user's project, made by `django-admin startproject` with an app of its own, gets the
README's steps typed into a shell (the code blocks of that section, read from the README):
settings, migrate, a `crontab.d` file naming the project's own command, one `run_job` by hand
(the slot is claimed: a second run is a no-op), `install_crontab` (on a file), then
`job_status` and the healthchecks.io keys (pings to the `hc` stand-in on 127.0.0.1); on SQLite
and on PostgreSQL. The steps up to install_crontab are at most 8 actions.

The distribution built with `python -m build` must hold exactly the app (`ops/`: code,
migrations, templates).
"""

import datetime as dt
import json
import sqlite3
import subprocess
import sys
import tarfile
import uuid
import zipfile
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from .adopt import (
    WHEEL_NAME,
    add_cronops,
    adoption_actions,
    clean_checkout,
    make_venv,
    pip_install_line,
    readme_blocks,
    readme_section,
    shell,
    start_project,
    typed_lines,
    user_env,
    write_schedule,
)
from .conftest import PG_URL, PING_KEY, REPO, made_once, require
from .hcserver import API_KEY
from .test_deploy import machine_time_zone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a build and a pip install

# From "I have a Django project" to "my command runs under cron" (the bound).
MOST_ACTIONS = 8


def _installed_as_the_readme_says(directory: Path) -> dict:
    """A new virtualenv (psycopg in it, as a project on PostgreSQL has), then the README's
    `pip install` line, typed with a clean clone's path."""
    checkout = clean_checkout(directory / "cronops")
    venv = make_venv(directory / "venv", "psycopg[binary]>=3.1")
    result = shell(pip_install_line(checkout), directory, user_env(venv), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"venv": str(venv)}


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory) -> Path:
    """A new virtualenv with cronops installed by the README's own line (once per run)."""
    made = made_once(tmp_path_factory, "adopt-venv", _installed_as_the_readme_says)
    return Path(made["venv"])


def test_the_adoption_is_at_most_eight_actions_ending_with_install_crontab():
    actions = adoption_actions()
    print(f"adoption: {len(actions)} actions: {actions}")
    assert len(actions) <= MOST_ACTIONS, actions
    assert actions[0].startswith("pip install") and actions[-1].endswith("install_crontab")
    assert sum("run_job" in action for action in actions) == 1  # one run by hand


def test_the_git_form_of_the_install_line_installs_from_a_clone(tmp_path):
    """The README's alternative, `pip install 'git+file:///path/to/cronops'`, with the pip a
    new virtualenv has: it installs the clone's committed HEAD."""
    import re

    [line] = re.findall(r"`(pip install 'git\+file://[^`]+)`", readme_section())
    checkout = clean_checkout(tmp_path / "cronops")
    for git in (
        "git init -q",
        "git add -A",
        "git -c user.name=t -c user.email=t@example.com commit -qm clone",
    ):
        assert shell(git, checkout, dict(user_env(tmp_path), HOME=str(tmp_path))).returncode == 0
    venv = make_venv(tmp_path / "venv")
    typed = line.replace("/path/to/cronops", str(checkout))
    result = shell(typed, tmp_path, user_env(venv), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    imported = shell(
        "python -c 'import ops, ops.schedule.slots, django, cronsim, crontab; print(ops.__file__)'",
        tmp_path,
        user_env(venv),
    )
    assert imported.returncode == 0 and imported.stdout.startswith(str(venv)), imported.stderr


def app_files() -> set[str]:
    return {
        str(path.relative_to(REPO))
        for path in (REPO / "ops").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def test_the_wheel_holds_exactly_the_app_its_migrations_and_templates(dist):
    names = zipfile.ZipFile(dist / WHEEL_NAME).namelist()
    shipped = {n for n in names if not n.startswith("cronops-0.1.0.dist-info/")}

    assert shipped == app_files()
    assert {"ops/migrations/0001_initial.py", "ops/templates/admin/ops/job/jobs.html"} <= shipped
    assert not {n.split("/")[0] for n in shipped} - {"ops"}  # no commands/, config/, tests/


def test_the_sdist_holds_the_app_the_readme_and_pyproject_only(dist):
    [sdist] = dist.glob("cronops-0.1.0.tar.gz")
    names = tarfile.open(sdist).getnames()
    top = {n.split("/")[1] for n in names if n.count("/") >= 1}

    assert top == {
        "ops", "README.md", "pyproject.toml", "MANIFEST.in", "PKG-INFO", "setup.cfg",
        "cronops.egg-info",
    }  # fmt: skip
    assert {n.split("/", 1)[1] for n in names if "/ops/" in n and not n.endswith("/ops")} >= (
        app_files()
    )


def test_twine_check_passes_on_both_distributions(dist):
    files = sorted(str(p) for p in dist.iterdir())
    result = subprocess.run(
        [str(Path(sys.executable).parent / "twine"), "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2


def test_the_wheel_installs_and_imports_without_the_repository(fresh_venv, tmp_path):
    code = (
        "import importlib.resources, importlib.util, ops, django; "
        "files = importlib.resources.files('ops'); "
        "print(ops.__file__); "
        "print((files / 'templates/admin/ops/job/jobs.html').is_file(), "
        "(files / 'migrations/0001_initial.py').is_file(), "
        "importlib.util.find_spec('commands') is None, importlib.util.find_spec('config') is None)"
    )
    result = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=user_env(fresh_venv),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    where, found = result.stdout.splitlines()
    assert where.startswith(str(fresh_venv / "lib"))
    assert found.split() == ["True", "True", "True", "True"]


def pg_settings(url: str) -> str:
    """The project's own database settings for PostgreSQL (what its settings would say)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    config = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }
    return f"\nDATABASES = {{'default': {config!r}}}\n"


@pytest.fixture(params=["sqlite", "pg"])
def database(request):
    """("sqlite", None) or ("pg", url of a throwaway database, dropped afterwards)."""
    if request.param == "sqlite":
        yield "sqlite", None
        return
    require(bool(PG_URL), "PostgreSQL not available (set CRONOPS_TEST_PG_URL)")
    import psycopg

    name = f"cronops_adopt_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    try:
        yield "pg", PG_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def claims(project: Path, backend: str, url: str | None) -> list[tuple]:
    sql = "SELECT job, state FROM ops_slotclaim ORDER BY id"
    if backend == "sqlite":
        con = sqlite3.connect(project / "db.sqlite3")
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()
    import psycopg

    with psycopg.connect(url) as con:
        return con.execute(sql).fetchall()


def test_a_new_user_follows_the_readme_from_pip_install_to_a_monitored_job(
    fresh_venv, tmp_path, database, hc
):
    backend, url = database
    env = user_env(fresh_venv)
    project = start_project(tmp_path, env, machine_time_zone())
    if backend == "pg":
        settings = project / "mysite" / "settings.py"
        settings.write_text(settings.read_text() + pg_settings(url))

    # 1. install: the fixture typed the README's line (once for every test)
    lines = typed_lines(tmp_path / "crontab.txt")
    # 2. settings, 4. crontab.d: the README's blocks, as written
    add_cronops(project)
    schedule = write_schedule(project)
    assert "send_reminders" in schedule.read_text()
    # The README's 09:00 moved twelve hours from now: the job runs five times below and must
    # find one slot each time (a fire time in between would make it two, at 09:00 in CI).
    hour = (dt.datetime.now(ZoneInfo(machine_time_zone())).hour + 12) % 24
    expr = f"0 {hour} * * *"
    assert schedule.read_text().count("0 9 * * *") == 1
    schedule.write_text(schedule.read_text().replace("0 9 * * *", expr))

    outputs = []
    for line in lines:
        if line.startswith("pip install"):
            continue
        if "sync_healthchecks" in line:
            # 7. the keys, in .env as the README shows them (this server instead of hc-ping.com)
            [dotenv] = [code for lang, code in readme_blocks() if lang == "dotenv"]
            assert {"HEALTHCHECKS_PING_KEY", "HEALTHCHECKS_API_KEY"} <= {
                entry.split("=")[0] for entry in dotenv.splitlines()
            }
            env_file = project / ".env"
            env_file.write_text(
                f"HEALTHCHECKS_PING_KEY={PING_KEY}\nHEALTHCHECKS_API_KEY={API_KEY}\n"
                f"HEALTHCHECKS_PING_URL={hc.ping_url}\nHEALTHCHECKS_API_URL={hc.api_url}\n"
            )
            env_file.chmod(0o600)
        result = shell(line, project, env)
        outputs.append((line, result))
        assert result.returncode == 0, (line, result.stdout, result.stderr)

    [run] = [r for line, r in outputs if "run_job send_reminders" in line]
    assert "reminded 3 customers" in run.stdout
    # "Run it again and it says `already done for <that slot's date>`"
    second = shell("python manage.py run_job --no-ping send_reminders", project, env)
    assert second.returncode == 0, second.stderr
    assert "already done for" in second.stdout and "reminded" not in second.stdout
    assert claims(project, backend, url) == [("send_reminders", "succeeded")]

    installed = (tmp_path / "crontab.txt").read_text()
    [job_line] = [line for line in installed.splitlines() if "run_job" in line]
    assert f"{fresh_venv / 'bin' / 'python'} {project / 'manage.py'} run_job" in job_line
    assert job_line.endswith("send_reminders") and job_line.startswith(expr)

    [status] = [r for line, r in outputs if "job_status" in line]
    assert "send_reminders" in status.stdout and " ok " in f" {status.stdout} "
    as_json = shell("python manage.py job_status --json", project, env)
    assert as_json.returncode == 0, as_json.stderr
    [job] = json.loads(as_json.stdout)["jobs"]
    assert (job["job"], job["state"]) == ("send_reminders", "ok")

    # The check exists (sync_healthchecks armed it: one success that is not a run), and runs
    # ping it: a done slot logs, --force succeeds.
    assert hc.check("send_reminders").schedule == expr
    [armed] = hc.pings_of("send_reminders")
    assert armed.body.startswith(b"cronops: armed by sync_healthchecks")
    again = shell("python manage.py run_job send_reminders", project, env)
    forced = shell("python manage.py run_job --force send_reminders", project, env)
    assert again.returncode == forced.returncode == 0, again.stderr + forced.stderr
    kinds = [p.kind for p in hc.pings_of("send_reminders")]
    assert kinds == ["success", "log", "start", "success"], kinds
    assert PING_KEY not in again.stdout + again.stderr + forced.stdout + forced.stderr


def test_manage_py_check_tells_a_new_user_what_is_missing(fresh_venv, tmp_path):
    """Before crontab.d exists: a warning naming the directory, not an error that would stop
    migrate; a broken value and USE_TZ off: one error line each, with the setting's name."""
    env = user_env(fresh_venv)
    project = start_project(tmp_path, env, machine_time_zone())
    add_cronops(project)

    fresh = shell("python manage.py check", project, env)
    assert fresh.returncode == 0, fresh.stderr
    assert f"(ops.W004) OPS_CRONTAB_DIR {project / 'crontab.d'} does not exist" in fresh.stderr

    settings = project / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\nUSE_TZ = False\n")
    broken = shell("OPS_HEARTBEAT_SECONDS=soon python manage.py check", project, env)
    assert broken.returncode == 1
    assert (
        "(ops.E006) OPS_HEARTBEAT_SECONDS: 'soon' (from the environment) is not a number of "
        "seconds above 0" in broken.stderr
    )
    assert "(ops.E008) USE_TZ is off" in broken.stderr


def test_a_run_before_migrate_says_to_migrate(fresh_venv, tmp_path):
    env = user_env(fresh_venv)
    project = start_project(tmp_path, env, machine_time_zone())
    add_cronops(project)
    write_schedule(project)

    result = shell("python manage.py run_job --no-ping send_reminders", project, env)

    assert result.returncode == 1
    assert result.stderr.strip().endswith("(run `manage.py migrate`)"), result.stderr
