"""Issue 33: a fire pays for what it uses. run_job runs no system check (Django's, the
project's or cronops'), and `manage.py check` still runs every one of them; what a check would
have caught that matters for a run is one error line of run_job's own."""

from pathlib import Path

# Appended to the copy's settings: a check of the project's own that writes the command it ran
# under into the file CHECK_LOG names, one line each time Django runs the checks.
COUNTING_CHECK = """
import os as _os

if _os.environ.get("CHECK_LOG"):
    from django.core.checks import register as _register

    @_register()
    def _counted(app_configs=None, **kwargs):
        import sys

        with open(_os.environ["CHECK_LOG"], "a") as log:
            log.write(" ".join(sys.argv[1:2]) + "\\n")
        return []
"""


def test_run_job_runs_no_system_check_and_check_runs_them_all(project, tmp_path):
    settings = project.dir / "config" / "settings.py"
    settings.write_text(settings.read_text() + COUNTING_CHECK)
    project.add_command("t_ok", "print('fine')")
    log = tmp_path / "checks.log"
    # A warning of cronops' own (ops.W006) shows whether ops' checks ran.
    env = {"CHECK_LOG": str(log), "OPS_REDACT": "NO_SUCH_NAME_33"}

    fired = project.run_job("--no-ping", "t_ok", env=env)
    assert fired.returncode == 0, fired.stderr
    assert not log.exists() or log.read_text() == ""
    assert "ops.W006" not in fired.stderr

    checked = project.manage("check", env=env)
    assert checked.returncode == 0, checked.stderr
    assert log.read_text().splitlines() == ["check"]
    assert "(ops.W006) OPS_REDACT names NO_SUCH_NAME_33" in checked.stderr


def test_what_a_check_would_say_is_one_error_line_of_run_job(project):
    project.add_command("t_ok", "print('fine')")
    # ops.E006: a cronops setting it cannot use
    broken = project.run_job("--no-ping", "t_ok", env={"OPS_HEARTBEAT_SECONDS": "soon"})
    assert broken.returncode == 2
    assert broken.stderr.strip().splitlines() == [
        "cronops: error: OPS_HEARTBEAT_SECONDS: 'soon' (from the environment) is not a number "
        "of seconds above 0"
    ], broken.stderr
    # ops.E001: a crontab.d line it cannot parse
    path: Path = project.write_cron("t.cron", "0 3 * * * * t_ok\n")
    bad = project.run_job("--no-ping", "t_ok")
    assert bad.returncode == 2
    [line] = bad.stderr.strip().splitlines()
    assert line.startswith(f"cronops: error: {path}:1: 6 schedule fields"), line
    # ops.E008: USE_TZ off (it was a traceback from the run's first local time)
    project.write_cron("t.cron", "")
    settings = project.dir / "config" / "settings.py"
    settings.write_text(settings.read_text() + "\nUSE_TZ = False\n")
    naive = project.run_job("--no-ping", "t_ok")
    assert naive.returncode == 2
    assert naive.stderr.strip().splitlines() == [
        "cronops: error: USE_TZ is off: cronops stores every slot and run as an aware "
        "datetime (set USE_TZ = True)"
    ], naive.stderr
