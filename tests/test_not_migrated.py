"""Issue 32: a project that forgot `manage.py migrate` after adding cronops (or after upgrading
it), on SQLite and PostgreSQL, as real processes.

Before: `manage.py check --database default` said "no issues", `install_crontab` installed lines
that would all fail, `run_job` said `database unavailable: no such table: ops_jobpause` (the
database was there; its tables were not), `job_history` ended in a traceback and `prune_runs`
said nothing of `migrate`. The check is a database check (Django's convention): an ordinary
`check` and `run_job` make no query for it.
"""

from pathlib import Path

import django

from .conftest import PING_KEY, ping_to

MIGRATE = "(run `manage.py migrate`)"
MISSING = f"cronops' tables are missing from database 'default' {MIGRATE}"
# Appended to the copy's settings: every SQL statement Django runs, one a line, into the file
# QUERY_LOG names (run_job's child and heartbeat included: each process appends).
QUERY_LOG = """
import os as _os

if _os.environ.get("QUERY_LOG"):
    from django.db.backends.signals import connection_created

    def _log_queries(sender, connection, **kwargs):
        def logged(execute, sql, params, many, context):
            with open(_os.environ["QUERY_LOG"], "a") as log:
                log.write(" ".join(str(sql).split()) + "\\n")
            return execute(sql, params, many, context)

        connection.execute_wrappers.append(logged)

    connection_created.connect(_log_queries, weak=False)
"""


# cronops' migrations, in the order migrate applies them: ops.0001_initial … the latest.
MIGRATIONS = sorted(p.stem for p in (Path(__file__).parents[1] / "ops/migrations").glob("0*.py"))
ALL = f"{len(MIGRATIONS)} of cronops' migrations are not applied to database 'default'"
SPELLED = f"ops.{MIGRATIONS[0]} … ops.{MIGRATIONS[-1]}"


def unmigrate(project, to: str = "zero") -> None:
    """Take cronops' migrations back (to `to`), as in a project that never ran them."""
    result = project.manage("migrate", "ops", to, "-v0")
    assert result.returncode == 0, result.stderr


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_check_with_the_database_names_the_unapplied_migrations_and_migrate_still_runs(project):
    unmigrate(project)

    plain = project.manage("check")
    with_database = project.manage("check", "--database", "default")

    assert plain.returncode == 0, plain.stderr
    assert "ops.E012" not in plain.stdout + plain.stderr
    assert with_database.returncode == 1, with_database.stdout + with_database.stderr
    assert f"(ops.E012) {ALL} ({SPELLED})" in with_database.stderr
    assert "HINT: run `manage.py migrate`" in with_database.stderr
    # The check never stops the command that fixes what it reports.
    migrated = project.manage("migrate", "-v0")
    assert migrated.returncode == 0, migrated.stderr
    after = project.manage("check", "--database", "default")
    assert after.returncode == 0, after.stderr
    assert "ops.E012" not in after.stderr


def test_a_database_one_migration_behind_is_reported_and_run_job_says_so(project):
    """An upgrade of cronops without `migrate`: the tables are there, one column is not."""
    unmigrate(project, MIGRATIONS[-2])
    project.add_command("t_ok", "print('fine')")

    checked = project.manage("check", "--database", "default")
    run = project.run_job("--no-ping", "t_ok")

    assert (
        "(ops.E012) 1 of cronops' migrations is not applied to database 'default' "
        f"(ops.{MIGRATIONS[-1]})" in checked.stderr
    )
    assert run.returncode == 1
    line = one_line(run)
    assert line.startswith(
        "cronops: error: cronops' tables in database 'default' are older than its code ("
    ), line
    assert line.endswith(MIGRATE) and "database unavailable" not in line
    # job_status reads the newest columns too: the same words, not made-up values
    project.write_cron("t.cron", "0 3 * * * --no-ping t_ok\n")
    status = project.manage("job_status", "--json")
    assert status.returncode == 2, status.stdout
    said = one_line(status)
    assert "are older than its code (" in said and said.endswith(MIGRATE), said


def test_run_job_says_the_tables_are_missing_not_that_the_database_is_unavailable(
    project, ping_server
):
    unmigrate(project)
    ping_to(project, ping_server)
    project.add_command("t_ok", "print('fine')")

    result = project.run_job("t_ok")

    assert result.returncode == 1  # a run that could not start: monitoring hears of it
    assert one_line(result) == f"cronops: error: {MISSING}"
    assert "fine" not in result.stdout
    assert [req.path for req, _ in ping_server.log] == [f"/{PING_KEY}/t_ok/fail"]
    [(request, _)] = ping_server.log
    assert MISSING in request.get_data(as_text=True)


def test_history_status_and_prune_say_the_tables_are_missing_in_one_line(project):
    unmigrate(project)
    project.write_cron("t.cron", "0 3 * * * --no-ping sleep_demo --seconds=0\n")

    for argv, what, code in (
        (("job_history",), "cannot read the run history", 2),
        (("job_status",), "cannot read the run history", 2),
        (("prune_runs", "--older-than=90d"), "cannot prune the run history", 2),
    ):
        result = project.manage(*argv)
        assert result.returncode == code, (argv, result.stderr)
        assert one_line(result) == f"CommandError: {what}: {MISSING}", argv


def test_install_crontab_refuses_until_cronops_is_migrated_and_leaves_the_crontab_alone(
    project, tmp_path
):
    unmigrate(project)
    project.write_cron("t.cron", "0 3 * * * --no-ping sleep_demo --seconds=0\n")
    tab = tmp_path / "crontab.txt"
    tab.write_bytes(b"# the user's own\n0 1 * * * /bin/true\n")
    before = tab.read_bytes()

    refused = project.manage("install_crontab", f"--tabfile={tab}")
    dry_run = project.manage("install_crontab", f"--tabfile={tab}", "--dry-run")

    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert one_line(refused) == (
        f"CommandError: {ALL}: every installed line would fail; run `manage.py migrate` first"
    )
    assert refused.stdout == ""
    assert tab.read_bytes() == before
    # The deploy's dry run comes before its migrate: it shows the diff and says it once.
    assert dry_run.returncode == 0, dry_run.stderr
    assert "+0 3 * * * " in dry_run.stdout and tab.read_bytes() == before
    assert one_line(dry_run) == (
        f"note: {ALL}: install_crontab refuses to install until `manage.py migrate`"
    )
    assert project.manage("migrate", "-v0").returncode == 0
    installed = project.manage("install_crontab", f"--tabfile={tab}")
    assert installed.returncode == 0, installed.stderr
    assert b"run_job" in tab.read_bytes() and tab.read_bytes().startswith(before)


def queries_of(project, tmp_path: Path, *argv: str, env=None) -> list[str]:
    log = tmp_path / f"queries-{len(list(tmp_path.glob('queries-*')))}.log"
    log.touch()
    result = project.manage(*argv, env={"QUERY_LOG": str(log), **(env or {})})
    assert result.returncode in (0, 1), result.stderr
    return log.read_text().splitlines()


def test_an_ordinary_check_and_run_job_make_no_query_for_the_migration_check(project, tmp_path):
    settings = project.dir / "config" / "settings.py"
    settings.write_text(settings.read_text() + QUERY_LOG)
    project.add_command("t_ok", "print('fine')")

    plain = queries_of(project, tmp_path, "check")
    run = queries_of(project, tmp_path, "run_job", "--no-ping", "t_ok")
    with_database = queries_of(project, tmp_path, "check", "--database", "default")

    print(
        f"queries on {project.db.backend}: check {len(plain)}, run_job {len(run)}, "
        f"check --database {len(with_database)}"
    )
    # Django 6 gives a plain check the databases: a JSONField's check (django-tasks-db's model)
    # asks SQLite whether it has JSON; cronops' own checks ask nothing
    assert [q for q in plain if "JSON(" not in q and "BEGIN" not in q] == []
    if django.VERSION < (6,):
        assert plain == []
    assert run and not [q for q in run if "django_migrations" in q]
    assert [q for q in with_database if "django_migrations" in q]
    # And an ordinary check does not even connect: a database that is down is no error to it.
    down = "postgres://nobody:pw@127.0.0.1:9/nothing"
    assert project.manage("check", env={"DATABASE_URL": down}).returncode == 0
