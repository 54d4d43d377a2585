"""What the adoption tests share: the built distribution, a fresh virtualenv with the wheel in
it, an existing Django project (`mysite`, made by `django-admin startproject`, with an app
`shop` and its command `send_reminders`), and the README section that adds cronops to it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import REPO, untracked_ignore

SECTION_TITLE = "## Add cronops to your project"
# Where the section's actions end: what follows watches the job that now runs under cron.
WATCH_TITLE = "### Watch it"
# The README's stand-in for where the user cloned cronops.
CHECKOUT_PLACEHOLDER = "/path/to/cronops"
WHEEL_NAME = "cronops-0.1.0-py3-none-any.whl"
# Never part of the copy the distribution is built from: local state and build litter (a
# stale *.egg-info would otherwise feed the sdist its old file list).
BUILD_IGNORE = untracked_ignore()

SEND_REMINDERS = """\
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Remind customers of their unpaid orders."

    def handle(self, *args, **options):
        self.stdout.write("reminded 3 customers")
"""


def readme_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(SECTION_TITLE)
    end = text.index("\n## ", start + len(SECTION_TITLE))
    return text[start:end]


def readme_blocks(text: str | None = None) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the section (or of `text`), in order,
    dedented."""
    section = readme_section() if text is None else text
    blocks = re.findall(r"^( *)```(\w*)\n(.*?)^\1```$", section, re.M | re.S)
    return [(lang, textwrap.dedent(code)) for _, lang, code in blocks]


def command_lines(code: str) -> list[str]:
    return [
        line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def adoption_actions() -> list[str]:
    """What the user does, in order, from "I have a Django project" to "my command runs under
    cron": each command line typed, and each block written into a file (settings, crontab.d)."""
    steps = readme_section().split(WATCH_TITLE)[0]
    actions = []
    for lang, code in readme_blocks(steps):
        if lang == "sh":
            actions += command_lines(code)
        else:
            actions.append(f"write the {lang} block")
    return actions


def pip_install_line(checkout: Path) -> str:
    """The section's `pip install` line, as typed by a user whose clone is `checkout`."""
    [line] = [line for line in adoption_actions() if line.startswith("pip install")]
    assert CHECKOUT_PLACEHOLDER in line, line
    return line.replace(CHECKOUT_PLACEHOLDER, str(checkout))


def clean_checkout(directory: Path) -> Path:
    """A copy of the repository as a fresh clone has it: no virtualenv, no var/, no litter."""
    shutil.copytree(REPO, directory, ignore=BUILD_IGNORE)
    return directory


def build_dist(scratch: Path) -> Path:
    """`python -m build` (sdist, then the wheel from it) of a clean copy of the repository."""
    tree = clean_checkout(scratch / "source")
    out = scratch / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def user_env(venv: Path, **extra: str) -> dict:
    """The environment of a user whose virtualenv is active: its bin/ first on PATH, nothing of
    this repository (no PYTHONPATH, no DJANGO_SETTINGS_MODULE). pip keeps this machine's own
    configuration (its config files, and PIP_* variables when there are any)."""
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    env.update(extra)
    return env


def make_venv(directory: Path, *packages: str) -> Path:
    """A fresh virtualenv with `packages` pip-installed (the built wheel, not the source tree)."""
    subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True, timeout=300)
    if not packages:
        return directory
    result = subprocess.run(
        [str(directory / "bin" / "python"), "-m", "pip", "install", "-q", *packages],
        cwd=directory,
        env=user_env(directory),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return directory


def shell(line: str, cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    """A line typed into the user's shell."""
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def start_project(parent: Path, env: dict, time_zone: str) -> Path:
    """The user's existing project: `django-admin startproject mysite`, an app `shop` with a
    management command `send_reminders`, TIME_ZONE the machine's. Returns manage.py's directory."""
    for line, cwd in (
        ("django-admin startproject mysite", parent),
        ("python manage.py startapp shop", parent / "mysite"),
    ):
        result = shell(line, cwd, env)
        assert result.returncode == 0, result.stderr
    project = parent / "mysite"
    commands = project / "shop" / "management" / "commands"
    commands.mkdir(parents=True)
    (commands.parent / "__init__.py").write_text("")
    (commands / "__init__.py").write_text("")
    (commands / "send_reminders.py").write_text(SEND_REMINDERS)
    settings = project / "mysite" / "settings.py"
    text = settings.read_text()
    assert "TIME_ZONE = 'UTC'" in text or 'TIME_ZONE = "UTC"' in text, "startproject changed"
    text = re.sub(r"TIME_ZONE = .UTC.", f"TIME_ZONE = {time_zone!r}", text)
    settings.write_text(text + '\nINSTALLED_APPS += ["shop"]\n')
    return project


def add_cronops(project: Path) -> None:
    """Step 2 of the README section: its Python block, appended to the settings as written."""
    [python] = [code for lang, code in readme_blocks() if lang == "python"]
    settings = project / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + python)


def write_schedule(project: Path) -> Path:
    """Step 4: the README's crontab.d file, under the name the README gives it."""
    [cron] = [code for lang, code in readme_blocks() if lang == "crontab"]
    [name] = re.findall(r"`(crontab\.d/[\w.-]+\.cron)`", readme_section())
    path = project / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(cron)
    return path


def typed_lines(tabfile: Path) -> list[str]:
    """Every command line of the section's shell blocks, in order, as the test types them:
    install_crontab works on a file instead of this machine's real crontab."""
    lines = []
    for lang, code in readme_blocks():
        if lang != "sh":
            continue
        for line in command_lines(code):
            if "install_crontab" in line:
                line = line.replace("install_crontab", f"install_crontab --tabfile={tabfile}")
            lines.append(line)
    return lines
