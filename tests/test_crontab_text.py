"""install_crontab's text handling, in process, against Debian's real `crontab -n`: lines are
cut where cron cuts them, and a line `crontab -n` refuses is traced to where it came from."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from ops.schedule.crontab_text import InstallError, block_jobs, cron_lines, split_block
from ops.schedule.crontabd import Job, Schedule
from ops.schedule.installer import install_crontab
from ops.schedule.options import RunOptions

from .conftest import require
from .test_install import FOREIGN, ODD_BREAKS


def settings_for(base: Path) -> SimpleNamespace:
    return SimpleNamespace(
        BASE_DIR=base,
        OPS_CRONTAB_ID="",
        OPS_LOG_DIR=base / "var" / "log",
        TIME_ZONE="UTC",
        SECRET_KEY="k" * 50,
        HEALTHCHECKS_PING_KEY="",
        HEALTHCHECKS_API_KEY="",
        DATABASES={"default": {}},
    )


def job(name: str, schedule: str, path: str, lineno: int) -> Job:
    return Job(
        name, schedule, RunOptions(command="check"), ["--name", name, "check"], "", path, lineno
    )


def test_crontab_text_is_cut_at_newlines_only():
    text = f"a{ODD_BREAKS}b\nc\r\nd"
    assert cron_lines(text) == [f"a{ODD_BREAKS}b\n", "c\r\n", "d"]
    assert "".join(cron_lines(text)) == text
    assert cron_lines("") == [] and cron_lines("\n") == ["\n"]
    block = (
        f"# BEGIN cronops x\n# job a: {ODD_BREAKS}\n0 3 * * * run {ODD_BREAKS}\n# END cronops x\n"
    )
    assert split_block(f"1\n{block}2\n", "x").block == block
    assert block_jobs(block) == {"a": f"0 3 * * * run {ODD_BREAKS}"}


@pytest.fixture
def debian_crontab():  # a `process` fixture (tests/conftest.py): Debian's crontab -n
    require(shutil.which("crontab") is not None, "needs Debian's crontab (apt install cron)")


@pytest.mark.parametrize("position", [1, 2, 3])
@pytest.mark.parametrize("mailto", [None, "ops@example.com"])
@pytest.mark.parametrize("foreign", [b"", FOREIGN, FOREIGN + b"not a cron line at all\n"])
def test_a_block_line_crontab_refuses_is_reported_at_the_crontab_d_line_that_made_it(
    debian_crontab, tmp_path, position, mailto, foreign
):
    """Debian's crontab reports line N or N-1 of the text; whichever it says, the message names
    the crontab.d file:line of the job (exit 2), and the tab file is left as it was."""
    jobs = [job(f"j{i}", "0 3 * * *", "crontab.d/10-a.cron", 10 + i) for i in (1, 2, 3)]
    jobs[position - 1] = job("bad", "61 3 * * *", "crontab.d/20-b.cron", 7)
    schedule = Schedule(jobs=jobs, mailto=mailto, mailto_at="crontab.d/00-mail.cron:1")
    tab = tmp_path / "tab"
    tab.write_bytes(foreign)

    with pytest.raises(InstallError) as refused:
        install_crontab(tabfile=tab, settings=settings_for(tmp_path), schedule=schedule)

    message = str(refused.value)
    assert message.startswith("crontab.d/20-b.cron:7: Debian's crontab refuses the line "), message
    assert "(bad minute): 61 3 * * * cd " in message
    assert refused.value.returncode == 2
    assert tab.read_bytes() == foreign


def test_an_empty_mailto_renders_quoted_and_passes_crontab_n(debian_crontab, tmp_path):
    schedule = Schedule(
        jobs=[job("a", "0 3 * * *", "crontab.d/10-a.cron", 2)],
        mailto="",
        mailto_at="crontab.d/10-a.cron:1",
    )
    tab = tmp_path / "tab"
    install_crontab(tabfile=tab, settings=settings_for(tmp_path), schedule=schedule)
    assert cron_lines(tab.read_text())[1] == 'MAILTO=""\n'
