"""`.env` as the Ansible role writes it and the settings read it: every value arrives byte for
byte (python-dotenv without interpolation), and the permission checks an operator sees."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import REPO, app_of_its_own, base_env, require

ANSIBLE = Path(sys.executable).parent / "ansible"
TEMPLATE = REPO / "ansible" / "roles" / "cronops" / "templates" / "env.j2"
# What a generated or hand-picked secret may hold; each one used to be changed or cut.
TRICKY = {
    "SECRET_KEY": "s3cr3t ${HOME} $HOME ${UNSET:-dflt} $ ${ #not-a-comment 'single' \"double\"",
    "HEALTHCHECKS_PING_KEY": "  spaces around, a back\\slash, \\' and \\\" and \\n  ",
    "HEALTHCHECKS_API_KEY": "#starts-with-a-hash=and=equals",
    "OPS_HC_TAG": "multi\nline\r\nand\rcarriage return\ttab, trailing backslash\\",
    "ALLOWED_HOSTS": "é, ü, \u2028 and ${A:+b}",
}


def environment_seen_by_settings(project) -> dict:
    code = (
        "import json, os; from django.conf import settings; "
        f"print(json.dumps({{k: os.environ.get(k) for k in {sorted(TRICKY)!r}}} | "
        "{'settings.SECRET_KEY': settings.SECRET_KEY}))"
    )
    result = project.manage("shell", "-v", "0", "-c", code, env={"HOME": "/home/not-this"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_dollar_brace_in_env_is_kept_literally_not_interpolated(sqlite_project):
    """python-dotenv expands `${VAR}` (and `$VAR` in braces) by default: a secret containing
    `${` was silently changed."""
    sqlite_project.write_env(SECRET_KEY="abc${HOME}def$HOME${X:-y}")

    seen = environment_seen_by_settings(sqlite_project)

    assert seen["settings.SECRET_KEY"] == "abc${HOME}def$HOME${X:-y}"


def test_of_two_assignments_in_env_the_last_wins_and_the_real_environment_over_both(
    sqlite_project,
):
    """Issue 29, item 8: python-dotenv, docker compose and a shell's `source` let the last
    assignment win. Before, load_env kept the first, so an override appended at the end of
    `.env` was silently ignored."""
    project = sqlite_project
    env_file = project.dir / ".env"
    with env_file.open("a") as file:
        file.write("OPS_HOST=host-b\nexport OPS_HOST='host-c'\n")  # appended: host-a was first
    code = "from ops import conf; print(conf.host())"

    seen = project.manage("shell", "-v", "0", "-c", code)
    told = project.manage("shell", "-v", "0", "-c", code, env={"OPS_HOST": "from-the-shell"})

    assert (seen.stdout, seen.stderr) == ("host-c\n", "")
    assert (told.stdout, told.stderr) == ("from-the-shell\n", "")


def test_the_roles_env_template_round_trips_every_value_through_the_settings_loader(
    sqlite_project, tmp_path
):
    """The role's own template, rendered by Ansible's template module, read by config/settings.py:
    the exact values, whatever quotes, `$`, `${`, `#`, backslashes or line breaks they hold."""
    require(ANSIBLE.exists(), "ansible-core is not installed (pip install -e '.[dev]')")
    project = sqlite_project
    values = {
        "cronops_user": "app",
        "cronops_group": "app",
        "cronops_time_zone": "UTC",
        "cronops_lock_dir": str(project.dir / "var" / "lock"),
        "cronops_log_dir": str(project.dir / "var" / "log"),
        "cronops_env": {**TRICKY, "DATABASE_URL": project.settings["DATABASE_URL"]},
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    variables = tmp_path / "vars.json"
    variables.write_text(json.dumps(values))
    env_file = project.dir / ".env"
    rendered = subprocess.run(
        [str(ANSIBLE), "-i", "localhost,", "-c", "local", "localhost", "-m",
         "ansible.builtin.template", "-a", f"src={TEMPLATE} dest={env_file} mode=0600",
         "-e", f"@{variables}"],
        env={**os.environ, "PATH": f"{ANSIBLE.parent}:{os.environ['PATH']}", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr

    seen = environment_seen_by_settings(project)

    assert seen == {**TRICKY, "settings.SECRET_KEY": TRICKY["SECRET_KEY"]}
    assert len(env_file.read_text().split("\n")) == 4 + 3 + len(values["cronops_env"]) + 1


# --- the permission checks (manage.py check) -------------------------------------------------


def check(project):
    result = project.manage("check")
    return result.returncode, result.stdout + result.stderr


def test_an_env_file_readable_by_others_is_an_error_and_by_a_foreign_group_a_warning(
    sqlite_project,
):
    env_file = sqlite_project.dir / ".env"
    env_file.chmod(0o644)
    code, output = check(sqlite_project)
    assert code == 1
    assert "(ops.E005)" in output and f"chmod 600 {env_file}" in output

    require(os.geteuid() == 0, "needs root to give .env another group")
    os.chown(env_file, 0, 65534)  # nogroup: not this process's group
    env_file.chmod(0o640)
    code, output = check(sqlite_project)
    assert code == 0
    assert f"(ops.W002) {env_file} is readable by its group nogroup" in output


def test_a_root_owned_env_file_readable_by_the_apps_group_is_the_recommended_layout(
    cron_user, migrated_templates
):
    """What the Ansible role writes (root:<app group> 0640): the app reads it, cannot rewrite
    it, and `manage.py check` does not warn about it (it used to: ops.W002)."""
    python, app = app_of_its_own(cron_user, migrated_templates)
    env_file = app / ".env"
    shutil.chown(env_file, "root", cron_user.name)
    env_file.chmod(0o640)

    def as_user(*argv):
        return subprocess.run(
            ["runuser", "-u", cron_user.name, "--", *argv],
            cwd=app,
            env=base_env(HOME=str(cron_user.home)),
            capture_output=True,
            text=True,
            timeout=120,
        )

    result = as_user(python, "manage.py", "check")
    assert result.returncode == 0, result.stderr
    assert "ops.W002" not in result.stdout + result.stderr
    assert "ops.E005" not in result.stdout + result.stderr
    assert as_user("test", "-r", str(env_file)).returncode == 0
    assert as_user("test", "-w", str(env_file)).returncode == 1
