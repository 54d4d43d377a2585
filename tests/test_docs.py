"""The README and the reference pages of docs/ document every management command, option,
setting and system check the project ships; the README stays a front door."""

from pathlib import Path

import pytest
from django.core.management import get_commands

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
# What the user can read: the README and every page of docs/.
DOCUMENTED = "\n".join([README, *(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))])
OURS = sorted(name for name, app in get_commands().items() if app in ("ops", "commands"))


def test_the_project_ships_the_commands_of_the_design():
    assert {"run_job", "install_crontab", "job_status", "sync_healthchecks"} <= set(OURS)


@pytest.mark.parametrize("command", OURS)
def test_every_command_is_in_the_command_table(command):
    table = (REPO / "docs" / "commands.md").read_text()
    assert f"| `manage.py {command}" in table, f"{command} is missing from docs/commands.md"


def test_every_run_job_option_is_documented():
    from ops.schedule.options import _build_parser

    options = {o for a in _build_parser()._actions for o in a.option_strings}
    assert options
    for option in options:
        assert f"`{option}" in DOCUMENTED, option


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


def test_the_readme_is_a_front_door():
    """Read in five minutes: at most 300 lines, none over 100 characters, and a link to
    every reference page of docs/."""
    lines = README.splitlines()
    assert len(lines) <= 300, len(lines)
    assert [n for n, line in enumerate(lines, 1) if len(line) > 100] == []
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in README, f"the README links no docs/{page.name}"
