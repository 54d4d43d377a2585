"""A real deploy with ansible/deploy.yml onto this machine, checked the way an operator would.

The playbook runs with `-c local` as root into a throwaway app user and directory (unique per
test run, removed afterwards with the user's crontab and logrotate rule). It installs Debian
packages, sets the system time zone to the one the machine already has (so the test does not
change it), builds the virtualenv from PyPI and installs the crontab. Then, as the app user:
the virtualenv imports the project, migrations are applied, `manage.py check` passes, the
billing job runs by hand and from the installed cron line, and `.env` is root's, readable by
the app's group (0640) and carries a secret full of `$`, `${`, `#`, quotes and spaces intact. A
second deploy
changes nothing, `--check --diff` reports nothing to do (and shows the crontab diff of a
changed schedule without applying it), a deploy from git gives the same result (also from an
http URL with a token, which shows up in no output and is stored nowhere), a deploy with
a healthchecks.io API key syncs the checks (to a fake API on 127.0.0.1), and a deploy of a
broken crontab.d fails at the install step, naming `file:line`, with the crontab of the
previous deploy still in place.

Needs root, Debian (apt, cron) and the dev extras (ansible-core): skipped on a developer
machine without them, required in CI (CRONOPS_REQUIRE_ALL=1).
"""

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, require, untracked_ignore
from tests.test_sync_healthchecks import API_KEY, FakeHealthchecks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ANSIBLE_DIR = REPO / "ansible"
BIN = Path(sys.executable).parent
PLAYBOOK = BIN / "ansible-playbook"
TARGET_PYTHON = "/usr/bin/python3"  # Debian's, not the pyenv shim `python3` may resolve to
SNAPSHOT_IGNORE = untracked_ignore()  # a git deploy of the snapshot must give the same tree
# Quotes, a hash, dollars, `${`, spaces and a backslash: .env must carry it to Django unchanged.
SECRET_KEY = (
    "deploy-s3cr3t-'quoted' \"double\" #not-a-comment $HOME ${HOME} ${UNSET:-x} ${ two  spaces "
    "\\back-" + uuid.uuid4().hex
)
SECRET_MARK = SECRET_KEY.rsplit("-", 1)[1]  # what must never appear in ansible's output
RECAP = re.compile(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


def machine_time_zone() -> str:
    try:
        zone = Path("/etc/timezone").read_text().strip()
    except OSError:
        zone = ""
    if not zone and Path("/etc/localtime").is_symlink():
        zone = os.readlink("/etc/localtime").split("zoneinfo/", 1)[-1]
    return zone or "Etc/UTC"


class Deployment:
    """One throwaway app user and directory, and the playbook runs made into them."""

    def __init__(self, scratch: Path, tree: Path | None = None):
        tag = uuid.uuid4().hex[:8]
        self.user = f"cronopst{tag}"
        self.dir = Path(f"/srv/cronops-test-{tag}")
        self.scratch = scratch
        self.tree = scratch / "tree"
        # A snapshot of this repository (others edit REPO), or the tree of another project.
        shutil.copytree(tree or REPO, self.tree, ignore=SNAPSHOT_IGNORE)
        for here, _, _ in sorted(os.walk(self.tree), reverse=True):  # as git would check it out
            if not os.listdir(here):
                os.rmdir(here)
        self.time_zone = machine_time_zone()
        self.durations: dict[str, float] = {}
        self.results: dict[str, subprocess.CompletedProcess] = {}

    def variables(self, **overrides) -> Path:
        values = {
            "cronops_user": self.user,
            "cronops_dir": str(self.dir),
            "cronops_source": str(self.tree),
            "cronops_time_zone": self.time_zone,
            "cronops_manage_services": False,  # no systemd here: start cron directly
            "cronops_env": {"SECRET_KEY": SECRET_KEY, "OPS_HOST": "deploy-test"},
            "ansible_python_interpreter": TARGET_PYTHON,
        }
        values.update(overrides)
        path = self.scratch / f"vars-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(values))
        return path

    def playbook(self, label: str, *args: str, **overrides) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            # The facts of this machine, gathered by the first run and cached for the next
            # (the role reads none of them; each gathering costs 1.5-3 s of CPU).
            "ANSIBLE_GATHERING": "smart",
            "ANSIBLE_CACHE_PLUGIN": "jsonfile",
            "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(self.scratch / "facts"),
        }
        # At a higher CPU priority than the rest of the suite: the deploys of a module run one
        # after another, the longest chain of a parallel run, while the other workers' tests
        # can use whatever CPU is left (`nice` runs it anyway when it may not raise it).
        command = [
            "nice", "-n", "-5",
            str(PLAYBOOK), "-i", "localhost,", "-c", "local", "-v",
            str(ANSIBLE_DIR / "deploy.yml"), "-e", f"@{self.variables(**overrides)}", *args,
        ]  # fmt: skip
        started = time.monotonic()
        lines, stamped = [], []
        with subprocess.Popen(
            command, cwd=ANSIBLE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, stdin=subprocess.DEVNULL,
        ) as process:  # fmt: skip
            for line in process.stdout:  # the log gets a time stamp per line: where time goes
                lines.append(line)
                stamped.append(f"{time.monotonic() - started:7.2f} {line}")
            returncode = process.wait(timeout=900)
        self.durations[label] = time.monotonic() - started
        result = subprocess.CompletedProcess(command, returncode, "".join(lines), "")
        self.results[label] = result
        log = self.scratch / f"{label}.log"
        log.write_text("".join(stamped))
        print(f"deploy {label}: {self.durations[label]:.1f} s, exit {returncode}, log {log}")
        return result

    def as_user(self, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """Run argv as the app user with cron's bare environment."""
        env = [
            "PATH=/usr/bin:/bin", f"HOME={self.dir}", f"LOGNAME={self.user}", "SHELL=/bin/sh",
            "LANG=C.UTF-8",
        ]  # fmt: skip
        return subprocess.run(
            ["runuser", "-u", self.user, "--", "env", "-i", *env, *argv],
            cwd=cwd or self.dir,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return self.as_user(str(self.dir / ".venv/bin/python"), "manage.py", *args)

    def crontab(self) -> str:
        result = subprocess.run(
            ["crontab", "-l", "-u", self.user], capture_output=True, text=True, timeout=30
        )
        return result.stdout if result.returncode == 0 else ""

    def query(self, sql: str):
        con = sqlite3.connect(self.dir / "var" / "db.sqlite3", timeout=30)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()

    def remove(self):
        subprocess.run(["crontab", "-r", "-u", self.user], capture_output=True)
        subprocess.run(["userdel", "-r", self.user], capture_output=True)
        subprocess.run(["groupdel", self.user], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(f"/var/cache/cronops/{self.user}", ignore_errors=True)
        try:
            os.rmdir("/var/cache/cronops")  # only when no other deploy's checkout is left
        except OSError:
            pass
        Path(f"/etc/logrotate.d/cronops-{self.user}").unlink(missing_ok=True)


def recap(result: subprocess.CompletedProcess) -> dict[str, int]:
    found = RECAP.findall(result.stdout)
    assert found, result.stdout[-3000:] + result.stderr[-3000:]
    ok, changed, unreachable, failed = map(int, found[-1])
    return {"ok": ok, "changed": changed, "unreachable": unreachable, "failed": failed}


def changed_tasks(result: subprocess.CompletedProcess) -> list[str]:
    """Names of the tasks that reported `changed`, for readable assertion messages."""
    names, task = [], None
    for line in result.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[6:].split("]")[0]
        elif line.startswith("changed:") and task:
            names.append(task)
    return names


PIP_INSTALL = "cronops : Build the virtualenv and pip install the packages"


def task_results(result: subprocess.CompletedProcess) -> dict[str, str]:
    """{task name: the line of its result (`ok: …`, `changed: …`, `skipping: …`)}."""
    found, task = {}, None
    for line in result.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[6:].split("]")[0]
        elif task and line.split(":", 1)[0] in ("ok", "changed", "skipping", "fatal"):
            found.setdefault(task, line)
    return found


def assert_no_secret(result: subprocess.CompletedProcess):
    assert SECRET_MARK not in result.stdout + result.stderr


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    require(os.geteuid() == 0, "the deploy test runs the playbook as root on this machine")
    require(PLAYBOOK.exists(), "ansible-core is not installed (pip install -e '.[dev]')")
    require(Path(TARGET_PYTHON).exists(), f"{TARGET_PYTHON} (Debian's python3) is missing")
    require(shutil.which("apt-get") is not None, "the deploy targets Debian (apt-get)")
    deployment = Deployment(tmp_path_factory.mktemp("deploy"))
    try:
        deployment.first = deployment.playbook("first")
        yield deployment
    finally:
        deployment.remove()
        print("deploy durations:", {k: round(v, 1) for k, v in deployment.durations.items()})


def test_a_first_deploy_succeeds_without_showing_a_secret(deployment):
    result = deployment.first
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert recap(result)["changed"] > 0
    assert_no_secret(result)
    assert re.search(r"installed \d+ jobs: \+\d+", result.stdout)


def test_the_virtualenv_imports_the_installed_project_as_the_app_user(deployment):
    python = str(deployment.dir / ".venv/bin/python")
    code = (
        "import django, ops, importlib.util as u; print(ops.__file__, django.get_version(), "
        "u.find_spec('commands') is None, u.find_spec('config') is None)"
    )
    result = deployment.as_user(python, "-c", code, cwd=Path("/"))
    assert result.returncode == 0, result.stderr
    where, version, *example_absent = result.stdout.split()
    assert where.startswith(f"{deployment.dir}/.venv/lib/")  # pip install ., not the tree
    assert version.startswith(("5.", "6."))
    # The example project is not installed: manage.py imports it from the project directory.
    assert example_absent == ["True", "True"]


def test_migrations_are_applied(deployment):
    result = deployment.manage("migrate", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert deployment.query("SELECT count(*) FROM django_migrations WHERE app = 'ops'")[0][0] > 0


def test_manage_py_check_passes_as_the_app_user(deployment):
    result = deployment.manage("check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ERROR" not in result.stdout + result.stderr
    assert "ops.W002" not in result.stdout + result.stderr  # root:<app group> 0640 is the layout


def test_env_holds_the_settings_and_the_app_can_read_but_not_rewrite_it(deployment):
    env_file = deployment.dir / ".env"
    stat = env_file.stat()
    assert oct(stat.st_mode & 0o777) == "0o640"
    assert (stat.st_uid, stat.st_gid) == (
        0,
        int(subprocess.check_output(["id", "-g", deployment.user])),
    )
    assert deployment.as_user("test", "-r", str(env_file)).returncode == 0
    assert deployment.as_user("test", "-w", str(env_file)).returncode == 1
    code = (
        "from django.conf import settings; import sys; "
        "from ops import conf; "
        "print(settings.SECRET_KEY == sys.argv[1], settings.TIME_ZONE, conf.host())"
    )
    result = deployment.manage(
        "shell", "-v", "0", "-c", code.replace("sys.argv[1]", repr(SECRET_KEY))
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", deployment.time_zone, "deploy-test"]


def test_locks_are_private_and_the_code_is_read_only_to_the_app_user(deployment):
    modes = {
        name: oct((deployment.dir / name).stat().st_mode & 0o777)
        for name in ("var", "var/lock", "var/log")
    }
    assert modes == {"var": "0o750", "var/lock": "0o700", "var/log": "0o750"}
    assert deployment.as_user("test", "-w", str(deployment.dir / "manage.py")).returncode == 1
    assert deployment.as_user("test", "-w", str(deployment.dir / "ops")).returncode == 1
    assert deployment.as_user("test", "-w", str(deployment.dir / "var/lock")).returncode == 0


def test_the_app_users_crontab_holds_the_managed_block(deployment):
    crontab = deployment.crontab()
    assert f"# BEGIN cronops {deployment.dir}" in crontab
    assert f"# END cronops {deployment.dir}" in crontab
    charge = [line for line in crontab.split("\n") if line.endswith(" charge_daily")]
    assert len(charge) == 1
    assert charge[0].startswith("0 3 * * * ")
    log = f"--log={deployment.dir}/var/log/charge_daily.log"
    assert (
        f"{deployment.dir}/.venv/bin/python {deployment.dir}/manage.py run_job {log} " in charge[0]
    )
    assert "SECRET" not in crontab and SECRET_MARK not in crontab


def test_run_job_runs_the_billing_job_by_hand_and_from_the_cron_line(deployment):
    assert deployment.manage("seed_demo").returncode == 0
    # The installed line, run the way cron runs it: /bin/sh -c, bare environment, cwd $HOME.
    line = next(x for x in deployment.crontab().splitlines() if "charge_daily.log" in x)
    from_cron = deployment.as_user("/bin/sh", "-c", line.split(None, 5)[5])
    assert from_cron.returncode == 0, from_cron.stderr
    log = (deployment.dir / "var/log/charge_daily.log").read_text()
    assert "charged 3" in log
    assert deployment.query("SELECT count(*) FROM commands_dailycharge") == [(3,)]
    # By hand, naming the slot the cron line ran (without it, a run made just after the job's
    # 03:00 fire would claim the next day's: the test would depend on the hour): the same
    # slot in the same database, a no-op, exit 0.
    [(day,)] = deployment.query("SELECT logical_date FROM ops_jobrun WHERE job = 'charge_daily'")
    by_hand = deployment.manage("run_job", f"--logical-date={day}", "charge_daily")
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    assert f"already done for {day}" in by_hand.stdout
    assert deployment.query("SELECT count(*) FROM commands_dailycharge") == [(3,)]
    outcomes = deployment.query(
        "SELECT outcome FROM ops_jobrun WHERE job = 'charge_daily' ORDER BY id"
    )
    assert outcomes == [("succeeded",), ("skipped",)]


def test_the_logrotate_rule_covers_the_job_logs(deployment):
    rule = Path(f"/etc/logrotate.d/cronops-{deployment.user}")
    assert rule.read_text().count(f"{deployment.dir}/var/log/*.log {{") == 1
    check = subprocess.run(["logrotate", "--debug", str(rule)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_a_second_deploy_changes_nothing(deployment):
    result = deployment.playbook("second")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert recap(result)["changed"] == 0, changed_tasks(result)
    assert "crontab up to date" in result.stdout
    assert_no_secret(result)
    # What makes a redeploy cheap: no pip install (the installed tree's fingerprint matched)
    # and no fact gathering (cached).
    pip = task_results(result)[PIP_INSTALL]
    assert pip.startswith("skipping:") and "cronops_install_fingerprint" in pip, pip
    assert "TASK [Gathering Facts]" not in result.stdout


def test_check_mode_with_diff_reports_nothing_to_do_and_hides_secrets(deployment):
    result = deployment.playbook("check", "--check", "--diff")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert recap(result)["changed"] == 0, changed_tasks(result)
    assert_no_secret(result)


def test_check_mode_shows_the_crontab_diff_a_changed_schedule_would_make(deployment):
    tree = deployment.scratch / "changed-schedule"
    shutil.copytree(deployment.tree, tree)
    cron = tree / "crontab.d/10-billing.cron"
    cron.write_text(re.sub(r"^0 3 \* \* \*", "0 4 * * *", cron.read_text(), flags=re.M))
    before = deployment.crontab()
    result = deployment.playbook("check-changed", "--check", "--diff", cronops_source=str(tree))
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "cronops : Install the crontab (dry run, validates crontab.d)" in changed_tasks(result)
    assert "+0 4 * * * " in result.stdout and "-0 3 * * * " in result.stdout
    assert deployment.crontab() == before  # check mode changed nothing
    deployed = (deployment.dir / "crontab.d/10-billing.cron").read_text()
    assert re.findall(r"^0 3 \* \* \*", deployed, flags=re.M) == ["0 3 * * *"]


def test_a_deploy_from_git_at_a_commit_installs_the_same_tree(deployment):
    repo = deployment.scratch / "repo"
    shutil.copytree(deployment.tree, repo)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "v1"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    sha = subprocess.check_output([*git, "rev-parse", "HEAD"], text=True).strip()
    result = deployment.playbook(
        "git", cronops_source=f"file://{repo}", cronops_version=sha
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    # Only the checkout is new: the same files, so no sync, no pip install, no crontab change.
    assert changed_tasks(result) == [
        "cronops : Create the checkout's parent directory",
        f"cronops : Check out {sha}",
    ]
    assert "crontab up to date" in result.stdout
    deployment.repo, deployment.sha = repo, sha


class GitOverHttp:
    """A git repository served over HTTP on 127.0.0.1 (git's "dumb" protocol: static files)
    behind Basic authentication, like a private repository reached with a token."""

    def __init__(self, repo: Path, scratch: Path, user: str, token: str):
        import base64
        import functools
        import http.server
        import threading

        self.bare = scratch / "served" / "repo.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(self.bare)], check=True)
        subprocess.run(["git", "--git-dir", str(self.bare), "update-server-info"], check=True)
        expected = "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()
        self.authorizations: list[str | None] = []
        seen = self.authorizations

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                super().do_GET()

            def log_message(self, *args):
                pass

        handler = functools.partial(Handler, directory=str(self.bare.parent))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/repo.git"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_token_in_the_git_url_is_in_no_output_and_stored_nowhere_on_the_server(deployment):
    """The git task had no `no_log`, and the token stayed in the checkout's .git/config
    (remote.origin.url), readable by every local user."""
    token = "glpat-" + uuid.uuid4().hex
    server = GitOverHttp(deployment.repo, deployment.scratch, "oauth2", token)
    try:
        source = server.url.replace("http://", f"http://oauth2:{token}@")
        result = deployment.playbook(
            "git-token", cronops_source=source, cronops_version=deployment.sha
        )
        wrong = deployment.playbook(
            "git-wrong-token",
            cronops_source=source.replace(token, "wrong-token"),
            cronops_version=deployment.sha,
        )
    finally:
        server.close()

    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert token not in result.stdout + result.stderr
    assert "crontab up to date" in result.stdout  # the same commit as from file://
    checkout = Path(f"/var/cache/cronops/{deployment.user}/checkout")
    config = subprocess.run(
        ["git", "-C", str(checkout), "config", "remote.origin.url"], capture_output=True, text=True
    )
    assert config.stdout.strip() == server.url
    for here, _, files in os.walk(checkout):
        for name in files:
            assert token.encode() not in (Path(here) / name).read_bytes(), Path(here) / name
    parent = checkout.parent.stat()
    assert (parent.st_uid, oct(parent.st_mode & 0o777)) == (0, "0o700")
    # The credential went as a header with every request, not as a URL in a file.
    assert server.authorizations and all(a is not None for a in server.authorizations)
    # A refused token fails the deploy with git's reason, still without showing a credential.
    assert wrong.returncode != 0
    assert f"getting {deployment.sha} from {server.url} failed" in wrong.stdout
    assert "wrong-token" not in wrong.stdout + wrong.stderr


def test_a_deploy_with_an_api_key_syncs_the_healthchecks_checks(deployment, httpserver):
    hc = FakeHealthchecks(httpserver)
    env = {
        "SECRET_KEY": SECRET_KEY,
        "OPS_HOST": "deploy-test",
        "HEALTHCHECKS_API_URL": hc.url,
        "HEALTHCHECKS_API_KEY": API_KEY,
    }
    result = deployment.playbook("healthchecks", cronops_env=env)
    assert result.returncode == 0, result.stdout[-6000:]
    assert changed_tasks(result) == [
        "cronops : Write .env (root-owned, readable by the app's group, never shown)",
        "cronops : Sync the healthchecks.io checks",
    ]
    assert {"charge_daily", "clear-sessions"} <= {c["slug"] for c in hc.checks.values()}
    assert API_KEY not in result.stdout
    assert_no_secret(result)


def test_a_broken_crontab_d_fails_at_the_install_step_and_keeps_the_crontab(deployment):
    before = deployment.crontab()
    assert "charge_daily" in before
    tree = deployment.scratch / "broken"
    shutil.copytree(deployment.tree, tree)
    cron = tree / "crontab.d/10-billing.cron"
    lines = cron.read_text().splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines, 1) if line.startswith("0 3 * * *"))
    lines[number - 1] = lines[number - 1].replace("0 3 * * *", "0 27 * * *", 1)
    cron.write_text("".join(lines))

    result = deployment.playbook("broken", cronops_source=str(tree))

    assert result.returncode != 0
    assert recap(result)["failed"] == 1
    failed_task = re.findall(r"^TASK \[(.+?)\]", result.stdout.split("fatal:")[0], re.M)[-1]
    # The dry run of install_crontab, before migrate: nothing else is touched.
    assert failed_task == "cronops : Install the crontab (dry run, validates crontab.d)"
    assert f"crontab.d/10-billing.cron:{number}:" in result.stdout
    assert deployment.crontab() == before
    assert_no_secret(result)


def test_the_first_deploy_builds_the_virtualenv_and_every_deploys_time_is_printed(deployment):
    """The wall-clock times are printed, not bounded (a loaded machine stretches a deploy
    several-fold). What a second one skips is asserted in test_a_second_deploy_changes_nothing."""
    print("deploy durations:", {k: round(v, 1) for k, v in deployment.durations.items()})
    first = deployment.results["first"]
    assert task_results(first)[PIP_INSTALL].startswith("changed:"), task_results(first)
    assert "TASK [Gathering Facts]" in first.stdout
