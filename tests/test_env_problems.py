"""A `.env` that cannot be loaded whole: one line naming the file and the line, exit 2, nothing
run or recorded (issue 20, item 4). Real processes: the settings module loads it at start-up."""

import contextlib
import sqlite3
import subprocess

import pytest

from .conftest import app_of_its_own, base_env


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            b"TIME_ZONE=UTC\nSECRET_KEY=\xff\xfe\n",
            ".env:{}: not UTF-8 (byte 0xff); nothing was loaded",
        ),
        (
            b'TIME_ZONE=UTC\nSECRET_KEY="unterminated\nOPS_HOST=host-a\n',
            ".env:{}: python-dotenv cannot parse it (an unterminated quote?): SECRET_KEY was not "
            "loaded",
        ),
    ],
    ids=["not UTF-8", "an unterminated quote"],
)
def test_a_env_file_that_cannot_be_loaded_is_one_line_and_exit_2_for_run_job_and_job_status(
    sqlite_project, content, said
):
    project = sqlite_project
    env = project.dir / ".env"
    good = env.read_bytes()
    env.write_bytes(good + content)
    said = said.format(len(good.splitlines()) + 2)  # the second line of what was added
    project.write_cron("t.cron", "0 3 * * * --no-ping sleep_demo --seconds=0\n")
    for argv in (("run_job", "sleep_demo"), ("job_status",)):
        result = project.manage(*argv)
        assert result.returncode == 2, (argv, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], (argv, result.stderr)
        assert str(env) in lines[0]
    assert project.db.runs() == []
    check = project.manage("check")
    assert "ops.E010" in check.stderr and said in check.stderr


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda env, elsewhere: env.symlink_to(elsewhere / "releases" / "3" / ".env"),
            "a symbolic link to {elsewhere}/releases/3/.env, which does not exist; nothing was "
            "loaded from it",
        ),
        (lambda env, elsewhere: env.mkdir(), "cannot be read (Is a directory); nothing was loaded"),
    ],
    ids=["a dangling symbolic link", "a directory"],
)
def test_a_env_file_that_is_there_but_cannot_be_read_is_exit_2_and_no_other_database_is_made(
    sqlite_project, tmp_path, make, said
):
    """Issue 29, item 7. Before: a dangling `.env` link was read as no file at all, so the
    settings fell back to their default SQLite: run_job made a fresh var/db.sqlite3 and said
    `no such table … (run manage.py migrate)`, and `manage.py check` said nothing. (A directory
    named `.env` is what cannot be read even by root, which these tests run as; the
    chmod 000 case, as a user: the test below.)"""
    project = sqlite_project
    env = project.dir / ".env"
    env.unlink()
    make(env, tmp_path)
    said = f"{env}: {said.format(elsewhere=tmp_path)}"
    project.write_cron("t.cron", "0 3 * * * --no-ping sleep_demo --seconds=0\n")
    for argv, prefix in (
        (("run_job", "sleep_demo"), "cronops: error: "),
        (("job_status",), "CommandError: "),
    ):
        result = project.manage(*argv)
        assert result.returncode == 2, (argv, result.stdout, result.stderr)
        assert result.stderr.splitlines() == [prefix + said], argv
    check = project.manage("check")
    assert check.returncode == 1
    assert f"?: (ops.E011) {said}" in check.stderr and "HINT:" in check.stderr
    migrate = project.manage("migrate")  # what the old message said to do: refused by the check
    assert migrate.returncode == 1 and "(ops.E011)" in migrate.stderr
    # Nothing is migrated into the fallback database. (Django's check of a JSONField, such as
    # django-tasks-db's, opens a connection, and SQLite makes the file then: an empty one.)
    fallback = project.dir / "var" / "db.sqlite3"
    assert not fallback.exists() or sqlite_tables(fallback) == []
    assert project.db.runs() == []


def sqlite_tables(path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [name for (name,) in db.execute("SELECT name FROM sqlite_master")]


def test_a_env_file_its_user_may_not_read_is_exit_2_and_no_other_database_is_made(
    cron_user, migrated_templates
):
    """Issue 29, item 7, with a `.env` mode 000: run as a user of its own (root reads any file).
    Before, this was already one line and exit 2, but `manage.py check` called it a line to fix
    (ops.E010)."""
    cron = "0 3 * * * --no-ping sleep_demo --seconds=0\n"
    python, app = app_of_its_own(cron_user, migrated_templates, cron)
    env = app / ".env"
    env.chmod(0o000)
    said = f"{env}: cannot be read (Permission denied); nothing was loaded"

    def as_user(*argv):
        return subprocess.run(
            ["runuser", "-u", cron_user.name, "--", python, "manage.py", *argv],
            cwd=app,
            env=base_env(HOME=str(cron_user.home)),
            capture_output=True,
            text=True,
            timeout=120,
        )

    result = as_user("run_job", "sleep_demo")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"cronops: error: {said}"]
    check = as_user("check")
    assert check.returncode == 1 and f"?: (ops.E011) {said}" in check.stderr, check.stderr
    assert not (app / "var" / "db.sqlite3").exists()
    with sqlite3.connect(app / "db.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM ops_jobrun").fetchone() == (0,)


def test_a_process_limit_that_leaves_run_job_no_thread_still_records_the_run(
    cron_user, migrated_templates
):
    """Issue 29, a hostile operator's find: with the user's task limit (`ulimit -u`, a
    container's pids limit) used up, run_job could not start the threads that read the job's
    output and keep its claim alive: a traceback, no record, the claim left running. Now the
    attempt is recorded failed, saying why, and the claim is released. Run as a user of its own
    (root's limit is not enforced) with 2 tasks: run_job and its job."""
    cron = "0 3 * * * --no-ping sleep_demo --seconds=0\n"
    python, app = app_of_its_own(cron_user, migrated_templates, cron)
    as_user = ["prlimit", "--nproc=2:2", "runuser", "-u", cron_user.name, "--"]
    result = subprocess.run(
        [*as_user, python, "manage.py", "run_job", "sleep_demo"],
        cwd=app,
        env=base_env(HOME=str(cron_user.home)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    with sqlite3.connect(app / "db.sqlite3") as db:
        runs = db.execute("SELECT outcome, exit_code, note FROM ops_jobrun").fetchall()
        claims = db.execute("SELECT state FROM ops_slotclaim").fetchall()
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    note = "could not read the job's output (can't start new thread): the job was stopped"
    assert (runs, claims) == ([("failed", 1, note)], [("failed",)])
