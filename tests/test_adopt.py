"""Adopting cronops in an existing Django project, as README "Add cronops to your project" says.

A fresh virtualenv (with the pip `python -m venv` gives it) gets cronops from a clean copy of
the repository through the README's own `pip install` line, and its `git+file://` form too.
Then a user's project, made by `django-admin startproject` with an app of its own (names that
are not the README's, so that nothing works only for `mysite`), in git, gets the README's
numbered steps done one by one, each its one code block read from the README: settings,
migrate, `mkdir crontab.d`, a `crontab.d` file naming the project's own command, `var/` into
`.gitignore`, one `run_job` by hand (the slot is claimed: a second run is a no-op),
`job_status`, `install_crontab` (on a file); then the healthchecks.io keys (pings to the `hc`
stand-in on 127.0.0.1), and `install_crontab --remove`; on SQLite and on PostgreSQL. The number
of steps the README states is the number walked (issue 32: it said six, a user took eight
actions).

The distribution built with `python -m build` must hold exactly the app (`ops/`: code,
migrations, templates).
"""

import datetime as dt
import json
import re
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
    OTHER_NAMES,
    README_NAMES,
    WATCH_TITLE,
    WHEEL_NAME,
    add_cronops,
    adoption_actions,
    adoption_steps,
    as_user,
    clean_checkout,
    command_lines,
    make_venv,
    pip_install_line,
    readme_blocks,
    readme_section,
    shell,
    start_project,
    stated_step_count,
    typed,
    user_env,
    write_schedule,
)
from .conftest import PG_URL, PING_KEY, REPO, made_once, require
from .hcserver import API_KEY
from .test_deploy import machine_time_zone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a build and a pip install

# A line of the user's own in the crontab (a file here), which install and remove keep.
USERS_OWN_LINE = "0 1 * * * /usr/local/bin/backup\n"


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


def test_the_readme_states_as_many_steps_as_it_numbers_and_each_is_one_action():
    """Issue 32. Before: "Six actions", and a user took eight: `mkdir crontab.d` and
    `job_status` were not among them, nor was `var/` kept out of git."""
    steps = adoption_steps()
    actions = adoption_actions()
    print(f"adoption: {len(steps)} steps: {[step.action for step in steps]}")
    assert stated_step_count() == len(steps) == len(actions)
    assert [step.number for step in steps] == list(range(1, len(steps) + 1))
    assert [step.action for step in steps] == actions
    assert actions[0].startswith("pip install") and actions[-1].endswith("install_crontab")
    assert sum("run_job" in action for action in actions) == 1  # one run by hand
    assert "mkdir crontab.d" in actions and "python manage.py job_status" in actions
    assert [a for a in actions if ".gitignore" in a and "var/" in a]
    assert actions.index("mkdir crontab.d") < actions.index("write the crontab block")
    # How to take the crontab out again is said where it is installed.
    assert "install_crontab --remove" in " ".join(steps[-1].text.split())


def test_the_git_form_of_the_install_line_installs_from_a_clone(tmp_path):
    """The README's alternative, `pip install 'git+file:///path/to/cronops'`, with the pip a
    new virtualenv has: it installs the clone's committed HEAD."""
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


def walk_the_steps(project: Path, names, env: dict, tab: Path, expr: str) -> dict:
    """Each numbered step of the README, in order, in the project of `names`: a shell line is
    typed, a block is written where its step says. Returns {action: result} of the lines."""
    outputs = {}
    walked = []
    for step in adoption_steps():
        walked.append(step.number)
        if step.lang == "sh":
            line = typed(step.action, names, tab)
            if line.startswith("pip install"):
                continue  # 1. typed by the fixture (once for every test)
            result = shell(line, project, env)
            assert result.returncode == 0, (step.number, line, result.stdout, result.stderr)
            outputs[step.action] = result
        elif step.lang == "python":  # appended to the settings file the step names
            [where] = re.findall(r"`([\w/]+/settings\.py)`", as_user(step.text, names))
            settings = project / where
            settings.write_text(settings.read_text() + "\n" + step.code)
        elif step.lang == "crontab":  # written into crontab.d, which an earlier step made
            [where] = re.findall(r"`(crontab\.d/[\w.-]+\.cron)`", as_user(step.text, names))
            code = as_user(step.code, names)
            # The README's 09:00 moved twelve hours from now: the job runs five times below
            # and must find one slot each time (a fire time in between would make it two).
            assert code.count("0 9 * * *") == 1, code
            (project / where).write_text(code.replace("0 9 * * *", expr))
        else:
            raise AssertionError(f"step {step.number}: no way to walk a {step.lang} block")
    # The count the README states is the steps walked, one action each.
    assert walked == list(range(1, stated_step_count() + 1)), walked
    return outputs


def test_a_new_user_follows_the_readme_from_pip_install_to_a_monitored_job(
    fresh_venv, tmp_path, database, hc
):
    backend, url = database
    env = user_env(fresh_venv)
    names = OTHER_NAMES
    assert names.project != README_NAMES.project and names.command != README_NAMES.command
    project = start_project(tmp_path, env, machine_time_zone(), names)
    assert shell("git init -q", project, env).returncode == 0  # the user's project is in git
    if backend == "pg":
        settings = project / names.project / "settings.py"
        settings.write_text(settings.read_text() + pg_settings(url))
    tab = tmp_path / "crontab.txt"
    tab.write_text(USERS_OWN_LINE)
    hour = (dt.datetime.now(ZoneInfo(machine_time_zone())).hour + 12) % 24
    expr = f"0 {hour} * * *"

    outputs = walk_the_steps(project, names, env, tab, expr)

    job = names.command
    [run] = [r for line, r in outputs.items() if "run_job" in line]
    assert "reminded 3 customers" in run.stdout
    # "Run it again and it says `already done for <that slot's date>`"
    second = shell(f"python manage.py run_job --no-ping {job}", project, env)
    assert second.returncode == 0, second.stderr
    assert "already done for" in second.stdout and "reminded" not in second.stdout
    assert claims(project, backend, url) == [(job, "succeeded")]

    [status] = [r for line, r in outputs.items() if "job_status" in line]
    assert job in status.stdout and " ok " in f" {status.stdout} "
    as_json = shell("python manage.py job_status --json", project, env)
    assert as_json.returncode == 0, as_json.stderr
    [row] = json.loads(as_json.stdout)["jobs"]
    assert (row["job"], row["state"]) == (job, "ok")

    installed = tab.read_text()
    assert installed.startswith(USERS_OWN_LINE)
    [job_line] = [line for line in installed.splitlines() if "run_job" in line]
    assert f"{fresh_venv / 'bin' / 'python'} {project / 'manage.py'} run_job" in job_line
    assert job_line.endswith(job) and job_line.startswith(expr)

    # var/ (the run's lock file is there now) is ignored by git; nothing else of cronops' is
    # left untracked but what the user commits (crontab.d, .gitignore, the settings).
    assert (project / "var" / "lock").is_dir()
    ignored = shell("git check-ignore var/lock var/log", project, env)
    assert ignored.returncode == 0 and len(ignored.stdout.split()) == 2, ignored.stderr
    untracked = shell("git status --porcelain --untracked-files=all", project, env).stdout
    assert "var/" not in untracked and "crontab.d/" in untracked, untracked

    # "Watch it": the keys in .env as the README shows them (this server instead of
    # hc-ping.com), then its sync_healthchecks line.
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
    watch = readme_section().split(WATCH_TITLE)[1]
    [sync] = [line for lang, code in readme_blocks(watch) if lang == "sh"
              for line in command_lines(code)]  # fmt: skip
    synced = shell(typed(sync, names, tab), project, env)
    assert synced.returncode == 0, synced.stdout + synced.stderr

    # The check exists (sync_healthchecks armed it: one success that is not a run), and runs
    # ping it: a done slot logs, --force succeeds.
    assert hc.check(job).schedule == expr
    [armed] = hc.pings_of(job)
    assert armed.body.startswith(b"cronops: armed by sync_healthchecks")
    again = shell(f"python manage.py run_job {job}", project, env)
    forced = shell(f"python manage.py run_job --force {job}", project, env)
    assert again.returncode == forced.returncode == 0, again.stderr + forced.stderr
    kinds = [p.kind for p in hc.pings_of(job)]
    assert kinds == ["success", "log", "start", "success"], kinds
    assert PING_KEY not in again.stdout + again.stderr + forced.stdout + forced.stderr

    # How the README says to take the crontab out again: the block goes, the user's line stays.
    [remove] = re.findall(r"`(python manage.py install_crontab\s+--remove)`", readme_section())
    removed = shell(typed(remove, names, tab), project, env)
    assert removed.returncode == 0, removed.stderr
    assert tab.read_text() == USERS_OWN_LINE


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
    assert result.stderr.strip() == (
        "cronops: error: cronops' tables are missing from database 'default' "
        "(run `manage.py migrate`)"
    ), result.stderr
