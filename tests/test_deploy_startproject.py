"""The deploy playbook (ansible/deploy.yml) on another project: a startproject project with
cronops added as the README says (`mysite` of tests/test_adopt.py), its own settings module
and a requirements file naming the built wheel, deployed with the same role onto this machine.
Its own file so that xdist deploys it on another worker than tests/test_deploy.py's copy.

Needs what tests/test_deploy.py needs: skipped on a developer machine without it, required in
CI (CRONOPS_REQUIRE_ALL=1).
"""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import require
from tests.test_deploy import PLAYBOOK, TARGET_PYTHON, Deployment, machine_time_zone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


# docs/settings.md: manage.py reads .env before it picks its settings module.
MANAGE_PY_LOADS_ENV = """\
    from pathlib import Path

    from ops.env import load_env

    load_env(Path(__file__).resolve().parent / ".env")
"""


def mysite_repository(scratch: Path, dist: Path) -> Path:
    """A repository holding a startproject project in `mysite/` (manage.py one level down), with
    cronops added as the README says, production settings that keep the database in var/, a
    manage.py that reads .env first (docs/settings.md), and a requirements file naming the
    built wheel, vendored in the repository as a project would until cronops is on PyPI."""
    from .adopt import WHEEL_NAME, add_cronops, start_project, user_env, write_schedule

    repo = scratch / "mysite-repo"
    repo.mkdir()
    (repo / "wheels").mkdir()
    shutil.copy2(dist / WHEEL_NAME, repo / "wheels" / WHEEL_NAME)
    (repo / "requirements.txt").write_text(f"Django>=5.2,<7\n./wheels/{WHEEL_NAME}\n")
    # TIME_ZONE: the machine's, which the deploy keeps (cronops_time_zone, see Deployment).
    project = start_project(repo, user_env(Path(sys.executable).parent.parent), machine_time_zone())
    add_cronops(project)
    write_schedule(project)
    (project / "mysite" / "settings_prod.py").write_text(
        "from .settings import *  # noqa: F403\n\n"
        "# The project directory is root's: the database lives in var/, the app user's.\n"
        'DATABASES["default"]["NAME"] = BASE_DIR.parent / "var" / "db.sqlite3"  # noqa: F405\n'
    )
    manage = project / "manage.py"
    text, found = re.subn(
        r"^(    os\.environ\.setdefault\(.DJANGO_SETTINGS_MODULE.)",
        lambda m: MANAGE_PY_LOADS_ENV + m.group(1),
        manage.read_text(),
        flags=re.M,
    )
    assert found == 1, text
    manage.write_text(text)
    return repo


@pytest.fixture(scope="module")
def mysite_deployment(tmp_path_factory, dist):
    require(os.geteuid() == 0, "the deploy test runs the playbook as root on this machine")
    require(PLAYBOOK.exists(), "ansible-core is not installed (pip install -e '.[dev]')")
    require(Path(TARGET_PYTHON).exists(), f"{TARGET_PYTHON} (Debian's python3) is missing")
    require(shutil.which("apt-get") is not None, "the deploy targets Debian (apt-get)")
    scratch = tmp_path_factory.mktemp("deploy-mysite")
    deployment = Deployment(scratch, tree=mysite_repository(scratch, dist))
    deployment.mysite = {
        "cronops_manage_py": "mysite/manage.py",
        "cronops_settings_module": "mysite.settings_prod",
        "cronops_requirements_file": "requirements.txt",
        "cronops_pip_packages": [],
        "cronops_collectstatic": False,
        "cronops_env": {"OPS_HOST": "mysite-test"},
    }
    try:
        deployment.first = deployment.playbook("mysite-first", **deployment.mysite)
        yield deployment
    finally:
        deployment.remove()


def test_a_startproject_project_deploys_and_its_job_runs_from_the_cron_line(mysite_deployment):
    deployment = mysite_deployment
    result = deployment.first
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    site = deployment.dir / "mysite"
    env_file = (site / ".env").read_text()
    assert 'DJANGO_SETTINGS_MODULE="mysite.settings_prod"' in env_file
    [line] = [x for x in deployment.crontab().splitlines() if x.endswith(" send_reminders")]
    assert line.startswith("0 9 * * * ")
    log = f"--log={deployment.dir}/var/log/send_reminders.log"
    assert f"{deployment.dir}/.venv/bin/python {site}/manage.py run_job {log} " in line
    # cronops came from the vendored wheel: ops is in the virtualenv, the project is not.
    code = "import ops, importlib.util as u; print(ops.__file__, u.find_spec('shop') is None)"
    where = deployment.as_user(str(deployment.dir / ".venv/bin/python"), "-c", code, cwd=Path("/"))
    assert where.returncode == 0, where.stderr
    module, shop_absent = where.stdout.split()
    assert module.startswith(f"{deployment.dir}/.venv/lib/") and shop_absent == "True"

    # The installed line as cron runs it (/bin/sh -c, bare environment): settings_prod is the
    # one that keeps the database in var/, where the claim lands.
    from_cron = deployment.as_user("/bin/sh", "-c", line.split(None, 5)[5])
    assert from_cron.returncode == 0, from_cron.stderr
    assert "reminded 3 customers" in (deployment.dir / "var/log/send_reminders.log").read_text()
    assert deployment.query("SELECT job, state, host FROM ops_slotclaim") == [
        ("send_reminders", "succeeded", "mysite-test")
    ]


def test_a_settings_module_that_cron_would_not_see_fails_the_deploy(mysite_deployment):
    """Without manage.py reading .env first, cron's runs would use manage.py's default
    settings module, not cronops_settings_module: the deploy says so and stops."""
    deployment = mysite_deployment
    tree = deployment.scratch / "mysite-no-load-env"
    shutil.copytree(deployment.tree, tree)
    manage = tree / "mysite" / "manage.py"
    assert MANAGE_PY_LOADS_ENV in manage.read_text()
    manage.write_text(manage.read_text().replace(MANAGE_PY_LOADS_ENV, ""))
    before = deployment.crontab()

    result = deployment.playbook("mysite-no-load-env", cronops_source=str(tree), **{
        k: v for k, v in deployment.mysite.items() if k != "cronops_source"
    })  # fmt: skip

    assert result.returncode != 0
    assert "Under cron (a bare environment) manage.py uses mysite.settings, not" in result.stdout
    assert "mysite.settings_prod" in result.stdout
    assert deployment.crontab() == before  # stopped before install_crontab
