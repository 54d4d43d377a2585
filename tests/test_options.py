"""run_job's argument parsing in process: the spellings argparse accepts, the value limits, and
the split between Django's common options, the runner's and the job's.
(tests/test_run_job_arguments.py runs the same rules through `manage.py run_job`.)"""

import pytest
from django.core.management.base import BaseCommand

from ops.run.commandargs import (
    ArgsRefused,
    LogicalDateGiven,
    ParserRefused,
    check_args,
    command_parser,
)
from ops.schedule.durations import parse_duration
from ops.schedule.options import (
    MAX_CATCH_UP,
    MAX_DURATION,
    OptionsError,
    merge,
    parse_run_args,
    split_common_options,
)


@pytest.mark.parametrize(
    "args",
    [
        ["--logical-date=2026-01-06"],
        ["--logical-date", "2026-01-06"],
        ["--logical-d=2026-01-06"],
        ["--logical", "2026-01-06"],
        ["--logical-date=2026-01-01", "--logical-date=2026-01-06"],
    ],
)
def test_every_spelling_argparse_accepts_of_the_commands_logical_date_is_found(args):
    with pytest.raises(LogicalDateGiven) as found:
        check_args("charge_daily", args)
    assert found.value.value == "2026-01-06"


def test_after_a_double_dash_a_logical_date_is_a_positional_its_parser_refuses_not_a_date():
    with pytest.raises(ParserRefused) as refused:
        check_args("charge_daily", ["--", "--logical-date=2026-01-06"])
    assert "unrecognized arguments" in refused.value.why


@pytest.mark.parametrize(
    "args", [["--bogus"], ["extra"], ["--seconds=soon"]], ids=["option", "positional", "value"]
)
def test_arguments_the_commands_own_parser_refuses_are_refused_before_the_run(args):
    command = "sleep_demo" if args[0].startswith("--seconds") else "charge_daily"
    with pytest.raises(ParserRefused):
        check_args(command, args)


def test_arguments_the_commands_parser_accepts_pass():
    check_args("sleep_demo", ["--seconds=0"])
    check_args("charge_daily", [])


def test_a_logical_date_without_a_value_is_still_refused():
    with pytest.raises(LogicalDateGiven) as found:
        check_args("charge_daily", ["--logical-date"])  # the parser errors; the word counts
    assert found.value.value == ""


@pytest.mark.parametrize(
    "args",
    [["--logical-date=2026-01-06"], ["--logical-date", "2026-01-06"], ["--", "--logical-date=x"]],
)
def test_a_command_without_the_option_gets_every_word_spelled_logical_date_refused(args):
    with pytest.raises(LogicalDateGiven):
        check_args("clearsessions", args)


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--version"], ["--he"]])
def test_arguments_that_end_the_command_before_it_runs_are_refused_without_printing(args, capsys):
    with pytest.raises(ArgsRefused) as refused:
        check_args("charge_daily", args)
    assert not isinstance(refused.value, LogicalDateGiven)
    assert capsys.readouterr() == ("", "")


def test_arguments_without_any_option_never_import_the_command(monkeypatch):
    def explode(command):
        raise AssertionError("imported")

    monkeypatch.setattr("ops.run.commandargs.command_parser", explode)
    check_args("charge_daily", ["2026-01-06", "x"])  # nothing to look at


def test_the_command_parser_is_built_once_per_command():
    first = command_parser("charge_daily")
    assert command_parser("charge_daily") is first


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("1.5h", 5400), ("365d", MAX_DURATION), ("45", 45)],
)
def test_durations_in_ascii_digits_up_to_a_year_are_read(text, seconds):
    assert parse_run_args([f"--timeout={text}", "x"]).timeout == seconds


@pytest.mark.parametrize(
    "text",
    [
        "\uff13\uff10m",  # full-width
        "\u0663\u0660s",  # Arabic-Indic
        "\u00b2s",  # superscript
        "30m\n",
        "0",
        "-5s",
        "1e3s",
        "366d",
        "31536001",
        "99999999999999999999d",
        "9" * 400,
    ],
)
def test_other_durations_are_refused(text):
    with pytest.raises(OptionsError, match="bad duration"):
        parse_run_args([f"--timeout={text}", "x"])
    with pytest.raises(OptionsError, match="bad duration"):
        parse_run_args([f"--wait={text}", "x"])


# Every limit, as tests/test_run_job_arguments.py once sent each through `manage.py run_job`
# (it still sends one of each kind): the option, and a part of the one-line refusal.
BAD_VALUES = [
    (["--catch-up=101"], "at most 100"),
    (["--catch-up=100000"], "at most 100"),
    (["--catch-up=" + "9" * 5000], "at most 100"),
    (["--catch-up=\uff15"], "bad count"),  # full-width 5
    (["--catch-up=\u00b2"], "bad count"),  # superscript two: isdigit() says yes
    (["--timeout=99999999999999999999d"], "at most 365d"),
    (["--timeout=366d"], "at most 365d"),
    (["--timeout=31536001"], "at most 365d"),
    (["--timeout=\uff13\uff10m"], "bad duration"),  # full-width 30
    (["--timeout=\u0663\u0660s"], "bad duration"),  # Arabic-Indic 30
    (["--timeout=0s"], "bad duration"),
    (["--wait=\uff11s"], "bad duration"),
    (["--wait=400d"], "at most 365d"),
    (["--logical-date=20260105"], "use YYYY-MM-DD"),
    (["--logical-date=2026-W02-1"], "use YYYY-MM-DD"),
    (["--logical-date=\uff12\uff10\uff12\uff16-01-05"], "use YYYY-MM-DD"),
    (["--logical-date=0001-01-01"], "1970-01-01"),
    (["--logical-date=1969-12-31"], "1970-01-01"),
]


@pytest.mark.parametrize(("option", "message"), BAD_VALUES, ids=lambda v: str(v)[:30])
def test_every_out_of_range_or_non_ascii_value_is_one_line_naming_its_limit(option, message):
    with pytest.raises(OptionsError) as refused:
        parse_run_args([*option, "t_ok"])
    text = str(refused.value)
    assert message in text and "\n" not in text and len(text) < 300, text


def test_a_duration_outside_the_runner_has_no_upper_bound_but_must_be_finite():
    assert parse_duration("400d") == 400 * 86400  # prune_runs --older-than=400d
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration("9" * 400)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("\uff15", "bad count"),
        ("\u00b2", "bad count"),
        ("-1", "bad count"),
        ("101", "at most 100"),
        ("9" * 5000, "at most 100"),
    ],
)
def test_catch_up_is_ascii_digits_and_at_most_the_maximum(text, problem):
    assert parse_run_args([f"--catch-up={MAX_CATCH_UP}", "x"]).catch_up == 100
    with pytest.raises(OptionsError, match=problem):
        parse_run_args([f"--catch-up={text}", "x"])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("20260105", "use YYYY-MM-DD"),
        ("2026-W02-1", "use YYYY-MM-DD"),
        ("2026-1-5", "use YYYY-MM-DD"),
        ("\uff12\uff10\uff12\uff16-01-05", "use YYYY-MM-DD"),
        ("2026-02-30", "use YYYY-MM-DD"),
        ("0001-01-01", "start at 1970-01-01"),
        ("1969-12-31", "start at 1970-01-01"),
    ],
)
def test_a_logical_date_is_exactly_yyyy_mm_dd_from_1970(text, problem):
    assert str(parse_run_args(["--logical-date=1970-01-01", "x"]).logical_date) == "1970-01-01"
    with pytest.raises(OptionsError, match=problem):
        parse_run_args([f"--logical-date={text}", "x"])


@pytest.mark.parametrize("length", [101, 150, 10_000])
def test_a_refused_long_name_is_cut_once_and_names_its_length_once(length):
    # The name is shown cut, with its length; the parser's own cut of long words used to cut
    # that again: "'aaa…… (63 characters) (150 characters)".
    with pytest.raises(OptionsError) as refused:
        parse_run_args([f"--name={'a' * length}", "x"])
    message = str(refused.value)
    assert message.count("characters)") == 1, message
    assert f"'{'a' * 60}'… ({length} characters): use 1-100 of a-z" in message


COMMON = {
    option: action.nargs != 0
    for action in BaseCommand().create_parser("manage.py", "run_job")._actions
    for option in action.option_strings
}


@pytest.mark.parametrize(
    ("argv", "runner", "django"),
    [
        (["job"], ["job"], []),
        (
            ["--settings=s", "--timeout=1h", "job", "--settings=x"],
            ["--timeout=1h", "job", "--settings=x"],
            ["--settings=s"],
        ),
        (
            ["--settings", "s", "--name", "n", "--pythonpath", "p", "job", "a"],
            ["--name", "n", "job", "a"],
            ["--settings", "s", "--pythonpath", "p"],
        ),
        (
            ["-v", "2", "-v2", "-v=3", "--verbosity", "0", "--force", "job", "-v", "1"],
            ["--force", "job", "-v", "1"],
            ["-v", "2", "-v2", "-v=3", "--verbosity", "0"],
        ),
        (
            ["--traceback", "--no-color", "--force-color", "--skip-checks", "job"],
            ["job"],
            ["--traceback", "--no-color", "--force-color", "--skip-checks"],
        ),
        (["--bogus", "--settings=s", "job"], ["--bogus", "--settings=s", "job"], []),
        (["--", "--settings=s"], ["--", "--settings=s"], []),
    ],
)
def test_djangos_common_options_come_out_of_the_words_before_the_command_name(argv, runner, django):
    assert split_common_options(argv, lambda: COMMON) == (runner, django)


def test_the_runners_options_and_djangos_common_options_never_meet():
    """split_common_options asks for Django's options only for a word that is no runner option:
    right only while the two sets are apart and no runner option is a short one (`-v2`)."""
    from ops.schedule.options import _parser

    runner = {option for action in _parser()._actions for option in action.option_strings}
    assert runner and not runner & set(COMMON)
    assert all(option.startswith("--") for option in runner)


def test_djangos_parser_is_not_built_for_a_cron_lines_runner_options():
    def common() -> dict[str, bool]:
        raise AssertionError("Django's common options were asked for")

    argv = ["--timeout=1h", "--no-ping", "--name", "n", "job", "-v", "2"]
    assert split_common_options(argv, common) == (argv, [])


def test_standby_alone_never_takes_the_command_for_its_bound():
    options = parse_run_args(["--standby", "charge_daily", "--x"])
    assert (options.standby, options.command, options.args) == (True, "charge_daily", ["--x"])
    assert "standby" in options.given
    assert parse_run_args(["--standby=30m", "--timeout=1h", "x"]).standby == 1800
    assert parse_run_args(["--standby", "--timeout=1h", "x"]).standby is True
    assert parse_run_args(["--no-standby", "x"]).standby is False
    assert parse_run_args(["x"]).standby is None
    # after the command name every word is the job's, --standby too
    assert parse_run_args(["x", "--standby"]).args == ["--standby"]


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--standby", "30m", "x"], "write --standby=30m"),
        (["--standby=0", "x"], "bad duration '0'"),
        (["--standby=", "x"], "bad duration ''"),
        (["--standby=366d", "x"], "at most 365d"),
    ],
)
def test_a_standby_bound_is_a_duration_written_with_an_equals_sign(argv, problem):
    with pytest.raises(OptionsError, match=problem):
        parse_run_args(argv)


def test_the_command_line_overrides_the_declared_standby_either_way():
    declared = parse_run_args(["--standby=10m", "x"])
    assert merge(declared, parse_run_args(["--no-standby", "x"])).standby is False
    assert merge(declared, parse_run_args(["x"])).standby == 600
    opted_out = parse_run_args(["--no-standby", "x"])
    assert merge(opted_out, parse_run_args(["--standby", "x"])).standby is True


def test_a_bare_standby_takes_no_word_from_djangos_common_options():
    assert split_common_options(["--standby", "-v", "2", "job"], lambda: COMMON) == (
        ["--standby", "job"],
        ["-v", "2"],
    )


@pytest.mark.parametrize("name", ["-x", "--x", "-", "_x", "-charge"])
def test_a_job_name_not_starting_with_a_letter_or_digit_is_refused(name):
    with pytest.raises(OptionsError, match="starting with a letter or digit"):
        parse_run_args([f"--name={name}", "clearsessions"])


def test_a_job_name_may_end_with_a_dash_or_underscore_and_start_with_a_digit():
    assert parse_run_args(["--name=9-tidy_", "clearsessions"]).name == "9-tidy_"


@pytest.mark.parametrize(
    "argv",
    [["--name=" + "a" * 10_000, "clearsessions"], ["-" * 10_000, "clearsessions"]],
    ids=["name", "unknown-option"],
)
def test_a_huge_refused_value_is_echoed_cut_to_a_few_dozen_characters(argv):
    with pytest.raises(OptionsError) as refused:
        parse_run_args(argv)
    assert len(str(refused.value)) < 300 and "10000 characters" in str(refused.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--standby", "--no-standby", "clearsessions"],
        ["--no-standby", "--standby=30m", "clearsessions"],
        ["--no-standby", "--name", "x", "--standby", "clearsessions"],
    ],
)
def test_standby_and_no_standby_together_are_refused(argv):
    with pytest.raises(OptionsError, match="--standby and --no-standby contradict"):
        parse_run_args(argv)


def test_no_standby_among_the_commands_own_words_is_the_commands():
    opts = parse_run_args(["--standby", "clearsessions", "--no-standby"])
    assert opts.standby is True and opts.args == ["--no-standby"]


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["--timout=10m", "x"], "--timeout"),
        (["--timout", "10m", "x"], "--timeout"),
        (["--no-pings", "x"], "--no-ping"),
        (["--catchup=3", "x"], "--catch-up"),
        (["--quiet", "--retires=3", "x"], "--retries"),
    ],
)
def test_a_misspelled_runner_option_is_one_line_with_did_you_mean(argv, meant):
    wrong = next(word for word in argv if word not in ("--quiet",))
    with pytest.raises(OptionsError) as refused:
        parse_run_args(argv)
    assert str(refused.value) == f"unknown runner option '{wrong}': did you mean {meant}?"


def test_an_option_like_no_runner_option_keeps_argparses_message():
    with pytest.raises(OptionsError) as refused:
        parse_run_args(["--bogus", "x"])
    assert str(refused.value) == "unrecognized arguments: --bogus"
