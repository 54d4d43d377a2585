"""`manage.py check` on a deployed copy: the cronops system checks an operator sees."""

from .conftest import PING_KEY

GOOD = "# Charge every active subscription.\n0 3 * * * charge_daily\n"


def check(project):
    result = project.manage("check")
    return result.returncode, result.stdout + result.stderr


def test_a_healthy_project_passes_the_checks(sqlite_project):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    sqlite_project.write_env(HEALTHCHECKS_PING_KEY=PING_KEY)

    code, output = check(sqlite_project)

    assert code == 0, output
    assert "ops." not in output
    assert PING_KEY not in output


def test_a_crontab_d_error_is_reported_with_its_file_line_and_a_hint(sqlite_project):
    path = sqlite_project.write_cron("10-billing.cron", "0 3 * * * * charge_daily\n")

    code, output = check(sqlite_project)

    assert code == 1
    assert f"(ops.E001) crontab.d: {path}:1: 6 schedule fields" in output
    assert "HINT: fix that line" in output


def test_a_time_zone_mismatch_is_a_warning_whose_hint_is_the_fix(sqlite_project):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    sqlite_project.write_env(TIME_ZONE="Asia/Tokyo", HEALTHCHECKS_PING_KEY=PING_KEY)

    code, output = check(sqlite_project)

    assert code == 0  # migrate and runserver still work; install_crontab refuses (exit 3)
    assert "(ops.W003) the system time zone is Etc/UTC but TIME_ZONE is Asia/Tokyo" in output
    assert "timedatectl set-timezone Asia/Tokyo" in output


def test_an_alias_of_the_system_time_zone_is_not_a_mismatch(sqlite_project):
    sqlite_project.write_cron("10-billing.cron", GOOD)
    sqlite_project.write_env(TIME_ZONE="Etc/Universal", HEALTHCHECKS_PING_KEY=PING_KEY)
    assert check(sqlite_project)[0] == 0


def test_lock_and_log_directories_that_cannot_be_created_are_errors(sqlite_project):
    env_file = sqlite_project.dir / ".env"
    sqlite_project.write_env(OPS_LOCK_DIR=f"{env_file}/lock", OPS_LOG_DIR=f"{env_file}/log")

    code, output = check(sqlite_project)

    assert code == 1
    assert f"(ops.E003) OPS_LOCK_DIR: {env_file}/lock cannot be created" in output
    assert f"(ops.E004) OPS_LOG_DIR: {env_file}/log cannot be created" in output


def test_scheduled_jobs_without_pings_are_a_deployment_warning_only(sqlite_project):
    """Issue 32: healthchecks.io is optional, so ops.W001 is for `check --deploy` (where Django
    users look for production warnings), not every `check` and `runserver` start."""
    sqlite_project.write_cron("10-billing.cron", GOOD)

    code, output = check(sqlite_project)
    deploy = sqlite_project.manage("check", "--deploy")

    assert code == 0
    assert "ops.W001" not in output
    assert deploy.returncode == 0, deploy.stderr
    assert "(ops.W001) healthchecks.io pings are not configured" in deploy.stderr
    assert "HEALTHCHECKS_PING_KEY" in deploy.stderr
    sqlite_project.write_env(HEALTHCHECKS_PING_KEY=PING_KEY)
    assert "ops.W001" not in sqlite_project.manage("check", "--deploy").stderr
