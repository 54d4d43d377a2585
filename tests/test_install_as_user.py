"""install_crontab run by the app user itself (the usual deploy): its own crontab, no root."""

import shutil
import subprocess

import pytest

from .conftest import add_echo_args, base_env, copy_tree, require
from .test_cron_e2e import python_for
from .test_install import FOREIGN, GOOD, MINUS

pytestmark = pytest.mark.slow


@pytest.fixture
def user_project(cron_user, migrated_templates):
    python = python_for(cron_user.name)
    require(
        python is not None,
        f"no Python that {cron_user.name} can execute (bash .ci/services.sh builds one)",
    )
    app = copy_tree(cron_user.home / "app")
    add_echo_args(app)
    shutil.copy2(migrated_templates["sqlite"], app / "db.sqlite3")
    (app / ".env").write_text(
        f"DATABASE_URL=sqlite:///{app / 'db.sqlite3'}\nSECRET_KEY={'z' * 50}\nTIME_ZONE=UTC\n"
    )
    (app / ".env").chmod(0o600)
    (app / "crontab.d" / "10-billing.cron").write_text(GOOD)
    subprocess.run(["chown", "-R", f"{cron_user.name}:{cron_user.name}", str(app)], check=True)

    def run(*args):
        return subprocess.run(
            ["runuser", "-u", cron_user.name, "--", python, str(app / "manage.py"), *args],
            cwd=app,
            env=base_env(HOME=str(cron_user.home)),
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def test_the_app_user_installs_into_its_own_crontab_without_root(user_project, cron_user):
    cron_user.set_crontab(FOREIGN)

    result = user_project("install_crontab")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"installed 1 job: +1 {MINUS}0 ~0"
    assert cron_user.crontab().startswith(FOREIGN)
    assert user_project("install_crontab").stdout.strip() == "crontab up to date"
    assert user_project("install_crontab", "--remove").returncode == 0
    assert cron_user.crontab() == FOREIGN


def test_another_users_crontab_needs_root(user_project, cron_user):
    result = user_project("install_crontab", "--user", "root")

    assert result.returncode == 2
    assert "--user root needs root" in result.stderr
    assert cron_user.crontab() is None


def test_a_carriage_return_the_user_cannot_read_back_exactly_is_refused(user_project, cron_user):
    with_cr = FOREIGN + b"0 6 * * * echo windows\r\n"
    cron_user.set_crontab(with_cr)

    result = user_project("install_crontab")

    assert result.returncode == 4
    assert "carriage return" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert cron_user.crontab() == with_cr.replace(b"\r", b"\\r")  # as `crontab -l` shows it
