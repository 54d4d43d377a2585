"""A `.env` that cannot be loaded whole: one line naming the file and the line, exit 2, nothing
run or recorded (issue 20, item 4). Real processes: the settings module loads it at start-up."""

import pytest


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
