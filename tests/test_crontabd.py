"""The crontab.d parser and validator, in process: what it accepts, and every way it refuses."""

import re
from pathlib import Path

import pytest
from django.core.management import get_commands
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ops.schedule.crontabd import CrontabError, load_schedule, parse_text, validate_schedule

BAD = Path(__file__).parent / "data" / "bad_crontabs"
CORPUS = sorted(BAD.glob("*.cron"))
GOOD = "# Charge every active subscription.\n0 3 * * * charge_daily\n"


def expectation(path: Path) -> tuple[int, str]:
    """Each corpus file starts with `# expect <line>: <part of the message>`."""
    first = path.read_text(encoding="utf-8").split("\n", 1)[0]
    match = re.match(r"^# expect (\d+): (.+)$", first)
    assert match, f"{path.name} lacks its `# expect N: …` line"
    return int(match.group(1)), match.group(2)


def test_the_corpus_has_at_least_thirty_malformed_inputs():
    assert len(CORPUS) >= 30


@pytest.mark.parametrize("bad", CORPUS, ids=[p.stem for p in CORPUS])
def test_each_malformed_file_is_refused_with_its_file_line_and_a_reason(bad, tmp_path):
    directory = tmp_path / "crontab.d"
    directory.mkdir()
    (directory / "10-good.cron").write_text(GOOD)
    target = directory / f"50-{bad.name}"
    target.write_bytes(bad.read_bytes())
    lineno, reason = expectation(bad)

    with pytest.raises(CrontabError) as caught:
        load_schedule(directory, get_commands(), check_args=True)

    message = str(caught.value)
    assert message.startswith(f"{target}:{lineno}: "), message
    assert reason in message
    assert "\n" not in message and "\r" not in message


def test_a_valid_directory_gives_every_job_with_its_description_and_options(tmp_path):
    directory = tmp_path / "crontab.d"
    directory.mkdir()
    (directory / "10-billing.cron").write_text(
        "MAILTO=ops@example.com\n"
        "# Charge active subscriptions\n# once per logical day.\n"
        "0 3 * * *   --catch-up=3 --timeout=30m charge_daily\n"
    )
    (directory / "20-misc.cron").write_text(
        "\n@daily --name=clear-sessions clearsessions\n"
        "*/15 9-17 * jan-jun mon-fri --quiet --name=weekday-clear clearsessions\n"
    )

    schedule = load_schedule(directory, get_commands(), check_args=True)

    assert [j.name for j in schedule.jobs] == ["charge_daily", "clear-sessions", "weekday-clear"]
    charge = schedule.get("charge_daily")
    assert charge.description == "Charge active subscriptions once per logical day."
    assert charge.options.catch_up == 3 and charge.options.timeout == 1800
    assert charge.cron_expr == "0 3 * * *"
    assert schedule.get("clear-sessions").cron_expr == "0 0 * * *"
    assert schedule.get("weekday-clear").options.quiet is True
    assert schedule.mailto == "ops@example.com"


def test_the_projects_own_crontab_d_is_valid():
    schedule = load_schedule(Path(__file__).parent.parent / "crontab.d", check_args=True)
    assert {j.name for j in schedule.jobs} >= {"charge_daily", "clear-sessions"}


@pytest.mark.parametrize(
    "schedule",
    [
        "* * * * *",
        "0 0 29 2 *",  # leap days exist
        "0 0 31 4 1",  # day 31 OR Monday: fires on Mondays
        "*/59 */23 */30 */11 */7",
        "0 9 * * MON-FRI",
        "0,30 8-18/2 1,15 jan,jul sun",
        "0 3 * * sat-7",  # a name-number range: python-crontab 3.4 raises on it
        "@reboot",
        "@hourly",
    ],
)
def test_schedules_debian_cron_reads_as_written_are_accepted(schedule):
    assert validate_schedule(schedule) is None


def test_percent_signs_and_shell_syntax_in_arguments_are_kept_literally():
    text = "0 3 * * * charge_daily --logical-date='2026-01-01' \"; touch /tmp/x\" '100%'\n"
    # charge_daily's own arguments are checked only with check_args; here the raw argv matters
    job = parse_text(text, "x.cron", known_commands={"charge_daily"}).jobs[0]
    assert job.argv[-2:] == ["; touch /tmp/x", "100%"]


def test_a_comment_separated_by_a_blank_line_is_not_a_description():
    text = "# about something else\n\n0 3 * * * charge_daily\n"
    assert parse_text(text, "x.cron").jobs[0].description == ""


def test_mailto_may_be_empty_to_send_no_mail():
    assert parse_text('MAILTO=""\n', "x.cron").mailto == ""


def test_an_error_message_never_echoes_a_ping_url_or_uuid():
    from ops.schedule.crontabd import CrontabError, parse_text

    line = "0 0 * * * --ping=https://hc-ping.com/SECRETPINGKEY123/x --timeout=zz check\n"
    with pytest.raises(CrontabError) as error:
        parse_text(line, "a.cron", known_commands=["check"])
    assert "SECRETPINGKEY123" not in str(error.value)
    assert "--ping=<hidden>" in str(error.value)


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85", "\u3000", "\xa0"])
def test_a_unicode_space_or_line_separator_stays_inside_its_argument_like_the_shell_keeps_it(
    char,
):
    """cron hands the line to /bin/sh, which splits words at spaces and tabs only;
    `str.split()` also splits at these characters (and the quoted path, shlex, does not)."""
    for text in (f"0 3 * * * echo_args a{char}b c\n", f"0 3 * * * echo_args a{char}b 'c'\n"):
        job = parse_text(text, "x.cron", known_commands={"echo_args"}).jobs[0]
        assert job.argv == ["echo_args", f"a{char}b", "c"]


def test_a_byte_order_mark_before_a_job_line_is_named_not_left_invisible(tmp_path):
    directory = tmp_path / "crontab.d"
    directory.mkdir()
    target = directory / "10-bom.cron"
    target.write_bytes("\ufeff0 5 * * * charge_daily\n".encode())

    with pytest.raises(CrontabError) as caught:
        load_schedule(directory, get_commands(), check_args=True)

    assert str(caught.value) == (
        f"{target}:1: starts with a byte-order mark (U+FEFF): save the file as UTF-8 without BOM "
        "(in: 0 5 * * * charge_daily)"
    )


@pytest.mark.parametrize("option", ["--name", "--catch-up", "--bogus"])
def test_an_error_quoting_a_long_secret_shows_no_part_of_it(settings, option):
    """Values quoted in an error are cut at 60 characters; cut before redaction, a 65-character
    SECRET_KEY showed its first 60 (the redactor knows only whole values)."""
    from ops.schedule.crontabd import CrontabError, parse_text

    settings.SECRET_KEY = "django-insecure-k3ylx9vq2z@w7v$e5r%t8y^u1i&o4p*a6s(d0f)g-h_j=l+m2"
    with pytest.raises(CrontabError) as error:
        parse_text(f"0 4 * * * {option}={settings.SECRET_KEY} sleep_demo\n", "x.cron")
    message = str(error.value)
    assert settings.SECRET_KEY[:20] not in message, message
    assert "<redacted SECRET_KEY>" in message


@hsettings(max_examples=500, deadline=None)
@given(st.text(alphabet="*/-,0123456789aLW#?~ \t٣", max_size=8))
def test_a_schedules_words_read_without_their_patterns_read_as_the_patterns_would(word):
    """Issue 33: the common items (`*`, `N`, `*/S`) and words that cannot be a field are read
    without compiling the patterns; the answer is the patterns' own."""
    from ops.schedule import crontabd

    match = re.match(crontabd._ITEM, word)
    assert crontabd._item(word) == (match.groups() if match else None)
    assert crontabd._looks_like_a_field(word) == bool(re.match(r"^[\d*?][\d*/,\-?LW#~]*$", word))


def test_a_command_is_refused_what_its_parser_refuses_with_or_without_arguments_of_its_own(
    tmp_path,
):
    """clearsessions declares no argument (no parser is built for its bare line: ops/run/
    commandargs.py's takes_no_arguments); sqlmigrate requires two."""
    directory = tmp_path / "crontab.d"
    directory.mkdir()
    line = directory / "10-jobs.cron"
    line.write_text("@daily clearsessions\n@daily --name=loud clearsessions --verbosity=2\n")
    assert len(load_schedule(directory, get_commands(), check_args=True).jobs) == 2
    for text, refusal in [
        ("@daily clearsessions now\n", "unrecognized arguments: now"),
        ("@daily sqlmigrate\n", "the following arguments are required: app_label"),
    ]:
        line.write_text(text)
        with pytest.raises(CrontabError) as caught:
            load_schedule(directory, get_commands(), check_args=True)
        assert str(caught.value).startswith(f"{line}:1: ")
        assert refusal in str(caught.value)
