"""What the adoption tests share: the built distribution, a fresh virtualenv with the wheel in
it, an existing Django project (made by `django-admin startproject`, with an app and a command
of its own: the README's `mysite`, `shop` and `send_reminders`, or other names), and the README
section that adds cronops to it, read as its numbered steps."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Names:
    """A user's project: its directory and settings package, its app, the app's command."""

    project: str
    app: str
    command: str


# The names the README's example uses, and a project of other names: a step that only works
# for the README's own names (or a block the walk fills in itself) fails under the other.
README_NAMES = Names("mysite", "shop", "send_reminders")
OTHER_NAMES = Names("bakery", "ovens", "preheat_ovens")
NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()


def as_user(text: str, names: Names) -> str:
    """`text` of the README with the user's names for the README's (whole words only)."""
    for readme, own in zip(
        (README_NAMES.command, README_NAMES.app, README_NAMES.project),
        (names.command, names.app, names.project),
        strict=True,
    ):
        text = re.sub(rf"\b{readme}\b", own, text)
    return text


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


@dataclass(frozen=True)
class Step:
    """One numbered step of the section: its number, its bold title, its text (the block
    included), and its one block."""

    number: int
    title: str
    text: str
    lang: str
    code: str

    @property
    def action(self) -> str:
        """The step's one action: the command line typed, or "write the <lang> block"."""
        if self.lang == "sh":
            [line] = command_lines(self.code)
            return line
        return f"write the {self.lang} block"


def adoption_steps() -> list[Step]:
    """The numbered steps before "Watch it", each with its one code block (asserted)."""
    text = readme_section().split(WATCH_TITLE)[0]
    parts = re.split(r"^(\d+)\. \*\*(.+?)\*\*", text, flags=re.M)
    steps = []
    for number, title, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        blocks = readme_blocks(body)
        assert len(blocks) == 1, f"step {number} ({title}) has {len(blocks)} code blocks"
        [(lang, code)] = blocks
        steps.append(Step(int(number), title, body, lang, code))
    return steps


def stated_step_count() -> int:
    """The number of steps the section's introduction says it takes ("Nine steps, …")."""
    intro = readme_section().split("\n1. ", 1)[0]
    [said] = re.findall(r"\b(\w+) (?:steps|actions)\b", intro)
    return int(said) if said.isdigit() else NUMBER_WORDS.index(said.lower())


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


def start_project(parent: Path, env: dict, time_zone: str, names: Names = README_NAMES) -> Path:
    """The user's existing project: `django-admin startproject mysite`, an app `shop` with a
    management command `send_reminders` (or `names`), TIME_ZONE the machine's. Returns
    manage.py's directory."""
    for line, cwd in (
        (f"django-admin startproject {names.project}", parent),
        (f"python manage.py startapp {names.app}", parent / names.project),
    ):
        result = shell(line, cwd, env)
        assert result.returncode == 0, result.stderr
    project = parent / names.project
    commands = project / names.app / "management" / "commands"
    commands.mkdir(parents=True)
    (commands.parent / "__init__.py").write_text("")
    (commands / "__init__.py").write_text("")
    (commands / f"{names.command}.py").write_text(SEND_REMINDERS)
    settings = project / names.project / "settings.py"
    text = settings.read_text()
    assert "TIME_ZONE = 'UTC'" in text or 'TIME_ZONE = "UTC"' in text, "startproject changed"
    text = re.sub(r"TIME_ZONE = .UTC.", f"TIME_ZONE = {time_zone!r}", text)
    settings.write_text(text + f'\nINSTALLED_APPS += ["{names.app}"]\n')
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


def typed(line: str, names: Names, tabfile: Path) -> str:
    """A command line of the README as the test types it in a project of `names`:
    install_crontab works on a file instead of this machine's real crontab."""
    line = as_user(" ".join(line.split()), names)
    return line.replace("install_crontab", f"install_crontab --tabfile={tabfile}")
