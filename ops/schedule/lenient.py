"""crontab.d read leniently: every job whose own line is valid, when another line is not.

Read only on that error's path (run_job, the dispatcher, a pause): the normal read is
ops/schedule/crontabd.py's `load_schedule`.
"""

import re
from pathlib import Path

from .crontabd import ENV_LINE, CrontabError, Job, parse_text


def load_jobs_leniently(directory: Path | str | None = None, known_commands=None) -> dict:
    """{name: Job} for every job whose own line is valid, even when other lines are not.

    run_job falls back on this when crontab.d has an error, so that one bad line (say, from a
    deploy that went wrong half-way) stops only its own job, not every job on the host. A name
    declared twice is left out: which of the two is meant cannot be known.
    """
    if directory is None:
        from .. import conf

        directory = conf.crontab_dir()
    if known_commands is None:
        from django.core.management import get_commands

        known_commands = get_commands()
    found: dict[str, Job | None] = {}
    for path in sorted(Path(directory).glob("*.cron")):
        try:
            lines = path.read_bytes().decode("utf-8").split("\n")
        except (OSError, UnicodeDecodeError):
            return {}  # a file that cannot be read could declare any name
        for lineno, raw in enumerate(lines, start=1):
            line = raw.strip(" \t")
            if not line or line.startswith("#") or re.match(ENV_LINE, line):
                continue
            try:
                job = parse_text(line, str(path), known_commands).jobs[0]
            except (CrontabError, IndexError):
                # The job a broken line declares must not run from another line by mistake.
                for name in _names_of_broken_line(line):
                    found[name] = None
                continue
            job.lineno = lineno
            found[job.name] = None if job.name in found else job
    return {name: job for name, job in found.items() if job is not None}


def _names_of_broken_line(line: str) -> set[str]:
    """The job name(s) a line that does not parse would declare: its --name, else its command;
    every word of it when even that cannot be told."""
    words = line.split()
    rest = words[1:] if line.startswith("@") else words[5:]
    for i, word in enumerate(rest):
        if word.startswith("--name="):
            return {word.split("=", 1)[1]}
        if word == "--name" and i + 1 < len(rest):
            return {rest[i + 1]}
    command = next((w for w in rest if not w.startswith("-")), None)
    return {command} if command else set(re.findall(r"[a-z0-9_-]+", line))
