"""cronops' settings without this repository's settings module (ops/conf.py, docs/settings.md):
a default for each, the Django setting first, else the environment (`.env`), one clear line
for a value that cannot be used, and `load_env` for cron's bare environment."""

from pathlib import Path

import pytest
from django.core.checks import run_checks

from ops import conf
from ops.env import load_env

from .conftest import DAILY, PING_KEY

PATHS = ("OPS_CRONTAB_DIR", "OPS_VAR_DIR", "OPS_LOCK_DIR", "OPS_LOG_DIR")


@pytest.fixture
def bare(settings, monkeypatch, tmp_path):
    """A project that sets no cronops setting: BASE_DIR only, and none in the environment."""
    settings.BASE_DIR = tmp_path
    for name in conf.GETTERS:
        if hasattr(settings, name):
            delattr(settings, name)
        monkeypatch.delenv(name, raising=False)
    return settings


def test_the_defaults_derive_from_base_dir(bare, tmp_path):
    assert conf.crontab_dir() == tmp_path / "crontab.d"
    assert conf.lock_dir() == tmp_path / "var" / "lock"
    assert conf.log_dir() == tmp_path / "var" / "log"
    assert conf.heartbeat_seconds() == 30.0
    assert conf.ping_budget_seconds() == 10.0
    assert conf.ping_url() == "https://hc-ping.com/"
    assert conf.api_url() == "https://healthchecks.io/api/v3/"
    assert (conf.ping_key(), conf.api_key(), conf.auto_create()) == ("", "", False)
    assert (conf.channels(), conf.redact_names(), conf.default_grace()) == ("*", [], None)
    assert conf.host()  # the machine's name
    assert conf.problems() == []


def test_the_environment_is_read_when_the_setting_is_absent_and_the_setting_wins(
    bare, monkeypatch, tmp_path
):
    monkeypatch.setenv("OPS_VAR_DIR", "state")  # relative: under BASE_DIR
    monkeypatch.setenv("OPS_HEARTBEAT_SECONDS", "5")
    monkeypatch.setenv("OPS_REDACT", "A_TOKEN, B_TOKEN")
    monkeypatch.setenv("HEALTHCHECKS_AUTO_CREATE", "yes")
    assert conf.lock_dir() == tmp_path / "state" / "lock"
    assert conf.heartbeat_seconds() == 5.0
    assert conf.redact_names() == ["A_TOKEN", "B_TOKEN"]
    assert conf.auto_create() is True

    bare.OPS_HEARTBEAT_SECONDS = 12
    bare.OPS_LOCK_DIR = Path("/run/locks")
    bare.HEALTHCHECKS_AUTO_CREATE = False
    assert conf.heartbeat_seconds() == 12.0
    assert conf.lock_dir() == Path("/run/locks")
    assert conf.auto_create() is False


def test_an_empty_value_counts_as_unset(bare, monkeypatch, tmp_path):
    monkeypatch.setenv("OPS_LOG_DIR", "")
    bare.OPS_HOST = ""
    monkeypatch.setenv("OPS_HOST", "from-env")
    assert conf.log_dir() == tmp_path / "var" / "log"
    assert conf.host() == "from-env"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "OPS_HEARTBEAT_SECONDS",
            "soon",
            "OPS_HEARTBEAT_SECONDS: 'soon' (from the environment) is not a number of seconds "
            "above 0",
        ),
        (
            "OPS_PING_BUDGET_SECONDS",
            "-1",
            "OPS_PING_BUDGET_SECONDS: '-1' (from the environment) is not a number of seconds "
            "above 0",
        ),
        (
            "HEALTHCHECKS_AUTO_CREATE",
            "sometimes",
            "HEALTHCHECKS_AUTO_CREATE: 'sometimes' (from the environment) is not on or off "
            "(1/0, true/false, yes/no, on/off)",
        ),
        (
            "HEALTHCHECKS_PING_URL",
            "hc-ping.com",
            "HEALTHCHECKS_PING_URL: 'hc-ping.com' (from the environment) is not an http:// or "
            "https:// URL with a host",
        ),
        (
            "OPS_DEFAULT_GRACE",
            "soon",
            "OPS_DEFAULT_GRACE: bad duration 'soon': use a positive number with s, m, h or d "
            "(90s, 30m, 2h) (from the environment)",
        ),
        (
            "OPS_HOST",
            "web 1",
            "OPS_HOST: 'web 1' (from the environment) is not a host name (1-255 characters, "
            "no spaces)",
        ),
    ],
)
def test_a_value_that_cannot_be_used_is_one_line_naming_the_setting(
    bare, monkeypatch, name, value, message
):
    monkeypatch.setenv(name, value)
    with pytest.raises(conf.SettingError) as error:
        conf.GETTERS[name]()
    assert str(error.value) == message
    [problem] = conf.problems()
    assert str(problem) == message
    # databases=[]: Django 6 asks every check about the project's databases by default (a
    # JSONField's support), which this test without a database may not
    errors = [m for m in run_checks(databases=[]) if m.id == "ops.E006"]
    assert [e.msg for e in errors] == [message]


def test_a_key_of_the_wrong_type_is_refused_without_showing_it(bare):
    bare.HEALTHCHECKS_PING_KEY = 12345678901234
    with pytest.raises(conf.SettingError) as error:
        conf.ping_key()
    assert str(error.value) == "HEALTHCHECKS_PING_KEY: a value (from the setting) is not a string"


def test_a_url_with_a_password_is_refused_without_showing_it(bare, monkeypatch):
    monkeypatch.setenv("HEALTHCHECKS_API_URL", "ftp://user:pa55word@hc.example.com/")
    with pytest.raises(conf.SettingError) as error:
        conf.api_url()
    assert "pa55word" not in str(error.value)


def test_without_base_dir_the_check_says_which_setting_to_define(settings, monkeypatch):
    del settings.BASE_DIR
    for name in PATHS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(conf.SettingError) as error:
        conf.crontab_dir()
    assert str(error.value).startswith("BASE_DIR: not defined: cronops takes OPS_CRONTAB_DIR")
    [e007] = [m for m in run_checks(databases=[]) if m.id == "ops.E007"]
    assert e007.msg == "settings.BASE_DIR is not defined"
    assert "BASE_DIR = Path(__file__).resolve().parent.parent" in e007.hint
    assert not [m for m in run_checks(databases=[]) if m.id == "ops.E006"]  # said once, as E007


def test_use_tz_off_and_an_unknown_time_zone_are_errors(bare):
    bare.USE_TZ = False
    bare.TIME_ZONE = "Mars/Olympus_Mons"
    ids = {m.id for m in run_checks(databases=[])}
    assert {"ops.E008", "ops.E009"} <= ids


def test_load_env_never_overrides_the_environment_nor_interpolates(tmp_path, monkeypatch):
    env_file = tmp_path / ".env"
    env_file.write_text("CRONOPS_T_A=from-file\nCRONOPS_T_B=${HOME}$HOME\nCRONOPS_T_C=x\n")
    monkeypatch.setenv("CRONOPS_T_A", "from-shell")
    monkeypatch.delenv("CRONOPS_T_B", raising=False)
    monkeypatch.setenv("CRONOPS_T_C", "")  # set, although empty: the environment still wins

    assert load_env(env_file) is True

    import os

    assert os.environ["CRONOPS_T_A"] == "from-shell"
    assert os.environ["CRONOPS_T_B"] == "${HOME}$HOME"
    assert os.environ["CRONOPS_T_C"] == ""
    assert load_env(tmp_path / "missing.env") is False  # no file, no error
    monkeypatch.delenv("CRONOPS_T_B")


def test_load_env_lets_the_last_of_two_assignments_win_and_the_environment_over_both(tmp_path):
    """Issue 29, item 8 (as python-dotenv, docker compose and `source` do); the real processes:
    tests/test_env_file.py."""
    import os

    env_file = tmp_path / ".env"
    env_file.write_text(
        "CRONOPS_T_D=first\nCRONOPS_T_E=first\nCRONOPS_T_D=last\nCRONOPS_T_E=last\n"
    )
    os.environ.pop("CRONOPS_T_D", None)
    os.environ["CRONOPS_T_E"] = "from-shell"
    try:
        assert load_env(env_file) is True
        assert (os.environ["CRONOPS_T_D"], os.environ["CRONOPS_T_E"]) == ("last", "from-shell")
    finally:
        os.environ.pop("CRONOPS_T_D", None)
        os.environ.pop("CRONOPS_T_E", None)


def test_load_env_calls_a_missing_file_nothing_and_a_link_to_nothing_a_problem(
    tmp_path, monkeypatch
):
    """Issue 29, item 7: `open()` says "no such file" for both; only the first is no file."""
    from ops import env

    monkeypatch.setattr(env, "problems", [])
    assert load_env(tmp_path / ".env") is False
    assert env.problems == []
    (tmp_path / ".env").symlink_to("releases/3/.env")
    assert load_env(tmp_path / ".env") is False
    assert env.problems == [
        f"{tmp_path}/.env: a symbolic link to releases/3/.env, which does not exist; nothing "
        "was loaded from it"
    ]
    assert isinstance(env.problems[0], env.Unreadable)


def test_run_job_with_a_bad_setting_exits_2_records_nothing_and_pings_nothing(
    sqlite_project, ping_server
):
    project = sqlite_project
    project.write_env(
        HEALTHCHECKS_PING_URL=ping_server.url_for("/"),
        HEALTHCHECKS_PING_KEY=PING_KEY,
        OPS_HEARTBEAT_SECONDS="half a minute",
    )
    project.write_cron("t.cron", f"{DAILY} --name=t sleep_demo --seconds=0\n")

    result = project.run_job("t")

    assert result.returncode == 2
    assert result.stderr.strip() == (
        "cronops: error: OPS_HEARTBEAT_SECONDS: 'half a minute' (from the environment) is not "
        "a number of seconds above 0"
    )
    assert project.db.runs() == []
    assert project.db.query("SELECT count(*) FROM ops_slotclaim") == [(0,)]
    assert ping_server.log == []


@pytest.mark.parametrize(
    "value, why",
    [
        ("http://127.0.0.1:18801/p/?x=1", "has a query or fragment"),
        ("https://hc.example.com/ping/#top", "has a query or fragment"),
        ("http://127.0.0.1:18801/p ing/", "has a space or control character"),
        ("http://127.0.0.1:99999/", "has a bad port (1-65535)"),
        ("http://127.0.0.1:0/", "has a bad port (1-65535)"),
        ("http://127.0.0.1:http/", "has a bad port (1-65535)"),
    ],
)
@pytest.mark.parametrize("name", ["HEALTHCHECKS_PING_URL", "HEALTHCHECKS_API_URL"])
def test_a_url_setting_that_would_mangle_or_fail_every_call_is_one_line(
    bare, monkeypatch, name, value, why
):
    monkeypatch.setenv(name, value)
    with pytest.raises(conf.SettingError) as error:
        conf.GETTERS[name]()
    assert str(error.value).startswith(f"{name}: {value!r} (from the environment) {why}")
    assert [m.msg for m in run_checks(databases=[]) if m.id == "ops.E006"] == [str(error.value)]


@pytest.mark.parametrize(
    "value", ["https://hc-ping.com/", "http://127.0.0.1:18801/ping/", "http://[::1]:8000/p"]
)
def test_good_ping_urls_pass(bare, monkeypatch, value):
    monkeypatch.setenv("HEALTHCHECKS_PING_URL", value)
    assert conf.ping_url() == value


def test_run_job_with_a_ping_url_with_a_query_exits_2_and_pings_nothing(
    sqlite_project, ping_server
):
    project = sqlite_project
    project.write_env(
        HEALTHCHECKS_PING_URL=ping_server.url_for("/p/") + "?x=1", HEALTHCHECKS_PING_KEY=PING_KEY
    )
    result = project.run_job("--name=t", "sleep_demo", "--seconds=0")
    assert result.returncode == 2
    assert result.stderr.startswith("cronops: error: HEALTHCHECKS_PING_URL: ")
    assert "has a query or fragment" in result.stderr and len(result.stderr.splitlines()) == 1
    assert project.db.runs() == []
    assert ping_server.log == []


@pytest.mark.timeout(20)
def test_load_env_refuses_a_fifo_or_a_device_at_once_instead_of_hanging(tmp_path, monkeypatch):
    """A FIFO named .env (nobody writes it) hung every command of the project, cron's runs
    too; a link to /dev/zero filled memory. Neither is a file of settings: a problem, at once."""
    import os

    from ops import env

    monkeypatch.setattr(env, "problems", [])
    fifo = tmp_path / "fifo.env"
    os.mkfifo(fifo)
    (tmp_path / "zero.env").symlink_to("/dev/zero")
    assert load_env(fifo) is False
    assert load_env(tmp_path / "zero.env") is False
    assert env.problems == [
        f"{fifo}: cannot be read (not a regular file); nothing was loaded",
        f"{tmp_path / 'zero.env'}: cannot be read (not a regular file); nothing was loaded",
    ]
    assert all(isinstance(problem, env.Unreadable) for problem in env.problems)
