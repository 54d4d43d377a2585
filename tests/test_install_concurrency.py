"""Installs of one user's crontab never undo each other (issue 20, item 5): ten projects install
into one throwaway user's crontab at once, three rounds, with the real `crontab` binary."""

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import base_env, copy_tree

pytestmark = pytest.mark.slow

PROJECTS = 10


def test_ten_concurrent_installs_into_one_crontab_keep_every_projects_block(
    cron_user, migrated_templates, tmp_path
):
    apps = []
    for i in range(PROJECTS):
        app = copy_tree(tmp_path / f"app{i}")
        shutil.copy2(migrated_templates["sqlite"], app / "db.sqlite3")
        (app / ".env").write_text(
            f"DATABASE_URL=sqlite:///{app / 'db.sqlite3'}\nSECRET_KEY={'z' * 50}\n"
            f"TIME_ZONE=UTC\nOPS_CRONTAB_ID=project-{i}\n"
        )
        (app / ".env").chmod(0o600)
        apps.append(app)

    def install(app):
        return subprocess.run(
            [sys.executable, "manage.py", "install_crontab", "--user", cron_user.name],
            cwd=app,
            env=base_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )

    for round_ in range(3):
        for app in apps:  # every round changes every project's block
            (app / "crontab.d" / "10-billing.cron").write_text(f"{round_} 3 * * * charge_daily\n")
        with ThreadPoolExecutor(PROJECTS) as pool:
            results = list(pool.map(install, apps))
        for result in results:
            assert result.returncode == 0, result.stderr
            assert result.stdout.startswith("installed 1 job"), result.stdout
        text = cron_user.crontab().decode()
        for i in range(PROJECTS):
            assert f"# BEGIN cronops project-{i} " in text, (round_, i, text)
        assert text.count(f"{round_} 3 * * * ") == PROJECTS, text
