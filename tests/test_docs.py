"""The README documents every management command the project ships."""

from pathlib import Path

import pytest
from django.core.management import get_commands

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
OURS = sorted(name for name, app in get_commands().items() if app in ("ops", "commands"))


def test_the_project_ships_the_commands_of_the_design():
    assert {"run_job", "install_crontab", "job_status", "sync_healthchecks"} <= set(OURS)


@pytest.mark.parametrize("command", OURS)
def test_every_command_is_in_the_readme_command_table(command):
    assert f"| `manage.py {command}" in README, f"{command} is missing from README 'Commands'"


def test_every_run_job_option_is_documented():
    from ops.options import _build_parser

    options = {o for a in _build_parser()._actions for o in a.option_strings}
    assert options
    for option in options:
        assert f"`{option}" in README, option
