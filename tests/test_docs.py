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
    from ops.schedule.options import _build_parser

    options = {o for a in _build_parser()._actions for o in a.option_strings}
    assert options
    for option in options:
        assert f"`{option}" in README, option


DOCS_SETTINGS = (Path(__file__).resolve().parent.parent / "docs" / "settings.md").read_text()


def test_every_cronops_setting_is_in_the_settings_reference_with_its_default():
    from ops import conf

    for name in conf.GETTERS:
        assert f"| `{name}` | " in DOCS_SETTINGS, f"{name} is missing from docs/settings.md"


def test_every_system_check_id_is_in_the_settings_reference():
    import re

    from ops import checks

    ids = set(re.findall(r"ops\.[EW]\d{3}", Path(checks.__file__).read_text()))
    assert ids
    for check_id in ids:
        assert check_id in DOCS_SETTINGS, f"{check_id} is missing from docs/settings.md"


def test_every_deploy_variable_is_in_the_deploy_guides_variables_table():
    import yaml

    repo = Path(__file__).resolve().parent.parent
    guide = (repo / "docs" / "deploy.md").read_text()
    defaults = repo / "ansible/roles/cronops/defaults/main.yml"
    for name in yaml.safe_load(defaults.read_text()):
        assert f"| `{name}` | " in guide, f"{name} is missing from docs/deploy.md 'Variables'"


def test_every_relative_link_of_the_readme_and_docs_points_at_a_file_and_heading_that_exist():
    import re

    repo = Path(__file__).resolve().parent.parent
    pages = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]

    def anchors(page: Path) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
        return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in headings}

    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name}: {target}"
            if anchor and linked.suffix == ".md":
                assert anchor in anchors(linked), f"{page.name}: {target}"
