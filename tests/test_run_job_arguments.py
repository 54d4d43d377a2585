"""run_job's arguments as an operator types them (real processes): who owns the logical date,
declared commands and job names, the limits of every value, and Django's common options. Every
refusal is exit 2, one line, nothing recorded, no ping.

A refusal happens before the database is touched: those tests run on SQLite only; what a run
records (a claimed date, a catch-up, a name's history) runs on SQLite and PostgreSQL. Every
value and spelling is also checked in process by tests/test_options.py."""

import datetime as dt
import json

import pytest
from cronsim import CronSim

from .conftest import DAILY, DAILY_DATE, add_echo_args, ping_to
from .test_options import BAD_VALUES

SEEDED_CHARGES = "SELECT charge_date, count(*) FROM commands_dailycharge GROUP BY charge_date"


def refused(result, *parts: str) -> str:
    """Assert `result` is a usage error: exit 2 and one `cronops: error:` line holding `parts`."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("cronops: error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def charges(project) -> list[tuple[str, int]]:
    return [(str(d), n) for d, n in project.db.query(SEEDED_CHARGES)]


def nothing_recorded(project) -> None:
    assert project.db.runs() == []
    assert project.db.query("SELECT count(*) FROM ops_slotclaim") == [(0,)]


# --- 1. The runner owns the logical date ----------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        ["--logical-date=2026-01-06"],
        ["--logical-date", "2026-01-06"],
        ["--logical-d=2026-01-06"],  # argparse's abbreviation of the command's option
        ["--logical", "2026-01-06"],
    ],
    ids=["equals", "two-words", "abbreviated", "abbreviated-two-words"],
)
def test_a_logical_date_among_the_commands_arguments_is_refused_and_today_stays_to_be_charged(
    sqlite_project, ping_server, spelling
):
    project = sqlite_project
    ping_to(project, ping_server)
    project.write_cron("10-billing.cron", f"{DAILY} charge_daily\n")
    assert project.manage("seed_demo").returncode == 0

    result = project.run_job("charge_daily", *spelling)

    refused(result, "run_job --logical-date=2026-01-06 charge_daily")
    nothing_recorded(project)
    assert project.db.query(SEEDED_CHARGES) == []
    assert ping_server.log == []
    # The real run of today's slot still charges today.
    today = project.run_job("charge_daily")
    assert today.returncode == 0, today.stderr
    assert charges(project) == [(DAILY_DATE.isoformat(), 3)]


def test_the_runners_logical_date_option_charges_that_day_and_claims_that_days_slot(project):
    project.write_cron("10-billing.cron", f"{DAILY} charge_daily\n")
    assert project.manage("seed_demo").returncode == 0

    result = project.run_job("--logical-date=2026-01-06", "charge_daily")

    assert result.returncode == 0, result.stderr
    assert [(r[1], r[2], r[3]) for r in project.db.runs()] == [
        ("2026-01-06", "2026-01-06", "succeeded")  # a once-a-day job's slot is its date
    ]
    assert charges(project) == [("2026-01-06", 3)]


def test_a_logical_date_token_is_refused_for_a_command_without_that_option_even_after_a_dash_dash(
    sqlite_project,
):
    project = sqlite_project
    add_echo_args(project.dir)
    project.write_cron("10-echo.cron", f"{DAILY} echo_args\n")

    result = project.run_job("echo_args", "--", "--logical-date=2026-01-06")

    # echo_args takes no --logical-date, so how it reads its words cannot be known: a token
    # spelled so is refused wherever it stands.
    refused(result, "--logical-date")
    nothing_recorded(project)


def test_a_logical_date_written_into_a_crontab_d_lines_arguments_is_refused_with_its_file_line(
    sqlite_project,
):
    project = sqlite_project
    path = project.write_cron(
        "10-billing.cron", "0 3 * * * charge_daily --logical-date=2026-01-01\n"
    )

    run = project.run_job("charge_daily")
    install = project.manage("install_crontab", "--tabfile", str(project.dir / "tab"))
    check = project.manage("check")

    refused(run, f"{path}:1", "--logical-date")
    nothing_recorded(project)
    assert install.returncode == 2, install.stdout + install.stderr
    assert f"{path}:1: " in install.stderr and "--logical-date" in install.stderr
    assert not (project.dir / "tab").exists()
    assert check.returncode == 1
    assert f"(ops.E001) crontab.d: {path}:1: " in check.stderr


def test_a_commands_help_through_run_job_is_refused_and_does_not_mark_the_slot_done(
    sqlite_project,
):
    project = sqlite_project
    project.write_cron("10-billing.cron", f"{DAILY} charge_daily\n")
    assert project.manage("seed_demo").returncode == 0

    result = project.run_job("charge_daily", "--help")

    refused(result, "end it before it runs", "manage.py charge_daily --help")
    assert "usage:" not in result.stdout
    nothing_recorded(project)
    assert project.run_job("charge_daily").returncode == 0
    assert charges(project) == [(DAILY_DATE.isoformat(), 3)]


# --- 2. A declared command runs only as its declared job(s) ---------------------------------


def test_a_declared_command_run_under_another_name_is_refused_naming_its_declaration(
    sqlite_project, ping_server
):
    project = sqlite_project
    ping_to(project, ping_server)
    path = project.write_cron("10-billing.cron", "0 3 * * * charge_daily\n")
    assert project.manage("seed_demo").returncode == 0

    result = project.run_job("--name=naive", "charge_daily")

    refused(result, f"{path}:1", "run_job charge_daily")
    nothing_recorded(project)
    assert project.db.query(SEEDED_CHARGES) == []
    assert ping_server.log == []


def test_a_command_declared_only_under_job_names_is_refused_naming_them(sqlite_project):
    project = sqlite_project
    path = project.write_cron(
        "10-sessions.cron",
        "@daily --name=clear-sessions clearsessions\n"
        "0 12 * * * --name=noon-sessions clearsessions\n",
    )

    result = project.run_job("clearsessions")

    refused(result, f"{path}:1", f"{path}:2", "clear-sessions", "noon-sessions")
    nothing_recorded(project)
    by_name = project.run_job("clear-sessions")
    assert by_name.returncode == 0, by_name.stderr
    assert [(r[0], r[3]) for r in project.db.runs()] == [("clear-sessions", "succeeded")]


def test_an_undeclared_command_can_still_be_wrapped_under_any_name(sqlite_project):
    project = sqlite_project
    project.write_cron("10-billing.cron", "0 3 * * * charge_daily\n")
    result = project.run_job("--name=tidy", "clearsessions")
    assert result.returncode == 0, result.stderr
    assert [(r[0], r[1], r[3]) for r in project.db.runs()] == [("tidy", "", "succeeded")]


# --- 3. A job name never names another management command -----------------------------------


def test_a_job_named_like_another_command_is_a_crontab_d_error_and_that_command_stays_itself(
    sqlite_project,
):
    project = sqlite_project
    assert project.manage("seed_demo").returncode == 0
    bad = project.write_cron("20-bad.cron", "@daily --name=clearsessions charge_daily\n")
    project.write_cron("10-good.cron", "@daily --name=tidy clearsessions\n")

    hijacked = project.run_job("clearsessions")
    install = project.manage("install_crontab", "--tabfile", str(project.dir / "tab"))
    check = project.manage("check")
    good = project.run_job("tidy")

    assert hijacked.returncode == 2
    assert f"{bad}:1: job name 'clearsessions' is the name of another management command" in (
        hijacked.stderr
    )
    assert project.db.query(SEEDED_CHARGES) == []
    assert install.returncode == 2 and f"{bad}:1: job name 'clearsessions'" in install.stderr
    assert check.returncode == 1 and f"(ops.E001) crontab.d: {bad}:1: " in check.stderr
    # One bad line stops only its own job.
    assert good.returncode == 0, good.stderr
    assert [(r[0], r[3]) for r in project.db.runs()] == [("tidy", "succeeded")]


def test_a_job_name_on_the_command_line_that_names_another_command_is_refused(sqlite_project):
    result = sqlite_project.run_job("--name=clearsessions", "sleep_demo", "--seconds=0")
    refused(result, "'clearsessions' is the name of another management command")
    nothing_recorded(sqlite_project)


# --- 7 and 10. The limits of every value ----------------------------------------------------


# One value of each kind through a real process (non-ASCII ones: they cross argv and stderr),
# and the future date, which only the runner can tell; tests/test_options.py has every value.
THROUGH_A_PROCESS = [
    (["--catch-up=\uff15"], "bad count"),  # full-width 5
    (["--timeout=366d"], "at most 365d"),
    (["--wait=\uff11s"], "bad duration"),  # full-width 1
    (["--logical-date=\uff12\uff10\uff12\uff16-01-05"], "use YYYY-MM-DD"),
    (["--logical-date=1969-12-31"], "1970-01-01"),
    (["--logical-date=9999-12-31"], "is in the future"),
]
assert all(value in BAD_VALUES for value in THROUGH_A_PROCESS[:-1])


@pytest.mark.newest  # Django's command line and argparse: on the newest pair too
def test_out_of_range_and_non_ascii_values_exit_2_with_one_line_and_record_nothing(
    sqlite_project, ping_server
):
    project = sqlite_project
    ping_to(project, ping_server)
    project.add_command("t_ok", "print('fine')")
    project.write_cron("10-t.cron", "@yearly t_ok\n")
    for option, message in THROUGH_A_PROCESS:
        refused(project.run_job(*option, "t_ok"), message)
    nothing_recorded(project)
    assert ping_server.log == []


def test_the_largest_accepted_values_run(sqlite_project):
    project = sqlite_project
    project.add_command("t_ok", "print('fine')")
    result = project.run_job(
        "--timeout=365d", "--wait=31536000", "--catch-up=100", "--logical-date=1970-01-01", "t_ok"
    )
    assert result.returncode == 0, result.stderr
    assert [r[2:4] for r in project.db.runs()] == [("1970-01-01", "succeeded")]


def test_a_yearly_job_catching_up_the_maximum_runs_without_crashing(project):
    # Once a year, on a day half a year from today: its fire time cannot fall inside the test.
    now = dt.datetime.now(dt.UTC)
    yearly = f"0 0 1 {(now.month + 5) % 12 + 1} *"
    current = next(CronSim(yearly, now, reverse=True)).date()
    project.add_command("t_ok", "print('fine')")
    project.write_cron("10-t.cron", f"{yearly} --catch-up=100 t_ok\n")
    assert project.run_job(f"--logical-date={current}", "t_ok").returncode == 0

    result = project.run_job("t_ok")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "already done" in result.stdout
    assert [r[3] for r in project.db.runs()] == ["succeeded", "skipped"]


def test_a_huge_timeout_in_crontab_d_is_refused_by_install_and_check_and_job_status_says_so(
    sqlite_project,
):
    project = sqlite_project
    project.add_command("t_ok", "print('fine')")
    path = project.write_cron("10-t.cron", f"{DAILY} --timeout=99999999999999999999d t_ok\n")

    install = project.manage("install_crontab", "--tabfile", str(project.dir / "tab"))
    check = project.manage("check")
    status = project.manage("job_status")
    run = project.run_job("t_ok")

    assert install.returncode == 2, install.stdout + install.stderr
    assert f"{path}:1: runner options: argument --timeout: bad duration" in install.stderr
    assert "at most 365d" in install.stderr
    assert check.returncode == 1 and f"(ops.E001) crontab.d: {path}:1: " in check.stderr
    assert status.returncode == 2, status.stdout + status.stderr
    assert "Traceback" not in status.stderr and f"{path}:1: " in status.stderr
    refused(run, f"{path}:1")
    nothing_recorded(project)


# --- 14. Django's common options before the command name -------------------------------------


def echoed_args(result) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = [x for x in result.stdout.splitlines() if x.startswith("ARGS ")]
    return json.loads(line.removeprefix("ARGS "))


@pytest.mark.newest  # Django's command line and argparse: on the newest pair too
def test_djangos_common_options_before_the_command_name_work_and_never_reach_the_job(
    sqlite_project,
):
    project = sqlite_project
    add_echo_args(project.dir)
    project.write_cron("10-echo.cron", f"{DAILY} echo_args declared\n")

    equals = project.run_job(
        "--settings=config.settings",
        "--pythonpath=.",
        "--verbosity=2",
        "--traceback",
        "--no-color",
        "--skip-checks",
        "echo_args",
        "a",
    )
    words = project.run_job(
        "--settings",
        "config.settings",
        "--timeout=1h",
        "--pythonpath",
        ".",
        "-v",
        "0",
        "--force-color",
        "--force",
        "echo_args",
    )
    short = project.run_job("-v2", "--force", "echo_args", "b", "--no-color")

    assert echoed_args(equals) == ["a"]
    assert echoed_args(words) == ["declared"]
    assert echoed_args(short) == ["b"]  # after the command name, everything is the job's
    commands = [c for (c,) in project.db.query("SELECT command FROM ops_jobrun ORDER BY id")]
    assert commands == ["echo_args a", "echo_args declared", "echo_args b --no-color"]


@pytest.mark.newest  # Django's command line and argparse: on the newest pair too
def test_run_job_help_still_works_and_documents_the_limits(sqlite_project):
    for args in (["--help"], ["--settings=config.settings", "-h"]):
        result = sqlite_project.run_job(*args)
        assert result.returncode == 0, result.stderr
        text = " ".join(result.stdout.split())
        assert "--catch-up N" in text and "at most 100" in text
        assert "--standby [DURATION]" in text and "takes '=': --standby=30m" in text
        assert "--no-standby never stand by" in text
        assert "--settings SETTINGS" in text
    nothing_recorded(sqlite_project)


@pytest.mark.newest  # Django's command line and argparse: on the newest pair too
def test_a_bad_common_option_is_one_line_and_exit_2(sqlite_project):
    result = sqlite_project.run_job("-v", "7", "clearsessions")
    refused(result, "verbosity")
    nothing_recorded(sqlite_project)


def test_a_default_grace_over_a_year_is_one_line_from_job_status_not_a_traceback(sqlite_project):
    project = sqlite_project
    project.write_cron("10-billing.cron", "0 3 * * * charge_daily\n")
    result = project.manage("job_status", env={"OPS_DEFAULT_GRACE": "99999999999999d"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "OPS_DEFAULT_GRACE: bad duration '99999999999999d': at most 365d" in result.stderr


# --- An ad hoc --name belongs to the command that made its history -------------------------


def test_an_ad_hoc_name_whose_history_another_command_made_is_refused_and_never_said_done(
    project,
):
    assert project.manage("seed_demo").returncode == 0
    first = project.run_job(
        "--no-ping", "--name=foo", "--logical-date=2026-11-18", "sleep_demo", "--seconds=0"
    )
    assert first.returncode == 0, first.stderr

    result = project.run_job("--no-ping", "--name=foo", "--logical-date=2026-11-18", "charge_daily")

    refused(result, "'foo'", "sleep_demo", "charge_daily")
    assert "already done" not in result.stdout + result.stderr
    assert project.db.query(SEEDED_CHARGES) == []
    assert [(r[0], r[3]) for r in project.db.runs()] == [("foo", "succeeded")]
    # The name still works for the command that made its history.
    again = project.run_job(
        "--no-ping",
        "--name=foo",
        "--force",
        "--logical-date=2026-11-18",
        "sleep_demo",
        "--seconds=0",
    )
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("name", ["-x", "--x", "-"])
def test_a_job_name_starting_with_a_dash_is_refused_by_hand(sqlite_project, name):
    result = sqlite_project.run_job(f"--name={name}", "sleep_demo", "--seconds=0")
    refused(result, f"bad job name {name!r}", "starting with a letter or digit")
    nothing_recorded(sqlite_project)


def test_a_ten_thousand_character_name_or_command_is_refused_without_echoing_all_of_it(
    sqlite_project,
):
    for argv in (["--name=" + "a" * 10_000, "sleep_demo"], ["b" * 10_000]):
        line = refused(sqlite_project.run_job(*argv), "10000 characters")
        assert len(line) < 300, line
    nothing_recorded(sqlite_project)


def test_run_job_as_the_command_of_run_job_is_refused(sqlite_project, ping_server):
    ping_to(sqlite_project, ping_server)
    result = sqlite_project.run_job("run_job", "sleep_demo", "--seconds=0")
    refused(result, "run_job cannot run run_job", "`run_job sleep_demo --seconds=0`")
    nothing_recorded(sqlite_project)
    assert ping_server.log == []


@pytest.mark.newest  # Django's command line and argparse: on the newest pair too
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "ad-hoc"])
def test_arguments_the_commands_own_parser_refuses_are_a_usage_error_not_a_failed_run(
    sqlite_project, ping_server, declared
):
    project = sqlite_project
    ping_to(project, ping_server)
    if declared:
        project.write_cron("10-billing.cron", f"{DAILY} charge_daily\n")
    assert project.manage("seed_demo").returncode == 0

    result = project.run_job("--logical-date=2026-01-08", "charge_daily", "--bogus")
    plain = project.manage("charge_daily", "--bogus")

    assert plain.returncode == 2  # as manage.py itself says it
    refused(result, "charge_daily's arguments", "unrecognized arguments: --bogus")
    nothing_recorded(project)
    assert ping_server.log == []
    assert project.db.query(SEEDED_CHARGES) == []


def test_standby_and_no_standby_together_exit_2(sqlite_project):
    result = sqlite_project.run_job("--standby", "--no-standby", "sleep_demo", "--seconds=0")
    refused(result, "--standby and --no-standby contradict each other")
    nothing_recorded(sqlite_project)


def test_a_misspelled_runner_option_or_command_gets_did_you_mean(sqlite_project):
    """Issue 32. Before: `unrecognized arguments: --timout=10m`, and `unknown command
    'reorder_part': …` without Django's own `Did you mean reorder_parts?`."""
    project = sqlite_project
    project.add_command("reorder_parts", "print('reordered')")

    option = project.run_job("--timout=10m", "reorder_parts")
    command = project.run_job("reorder_part")

    assert refused(option).endswith("unknown runner option '--timout=10m': did you mean --timeout?")
    assert refused(command, "unknown command 'reorder_part'").endswith(
        " Did you mean reorder_parts?"
    )
    # A job declared in crontab.d is a name run_job takes, so it is a suggestion too.
    project.write_cron("h.cron", "@daily --no-ping --name=clear-sessions clearsessions\n")
    declared = project.run_job("clear-sesions")
    assert refused(declared).endswith(" Did you mean clear-sessions?")
    nothing_recorded(project)


def test_a_misspelling_in_a_crontab_d_line_gets_did_you_mean(sqlite_project):
    project = sqlite_project
    project.write_cron("t.cron", "0 3 * * * --timout=10m charge_daily\n")
    option = project.manage("check")
    project.write_cron("t.cron", "0 3 * * * charge_dayly\n")
    command = project.manage("install_crontab", "--dry-run")

    assert option.returncode == 1
    assert "unknown runner option '--timout=10m': did you mean --timeout?" in option.stderr
    assert command.returncode == 2
    [line] = command.stderr.strip().splitlines()
    assert (
        "t.cron:1: unknown management command 'charge_dayly'. Did you mean charge_daily? (in: "
        in (line)
    )
