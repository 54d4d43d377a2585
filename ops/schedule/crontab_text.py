"""The managed block as text: crontab.d rendered as cron lines, and spliced into a crontab.

The crontab is handled as raw text: only the lines between this project's
`# BEGIN cronops <id>` and `# END cronops <id>` markers are ours, every other byte is kept as
it was. python-crontab rewrites lines it did not create (`0 0 * * *` → `@daily`, unparseable
lines → `# DISABLED LINE`, `NAME = value` lines dropped, comments re-attached), so it never
reads or writes the table here: its `CronSlices.is_valid` is a second opinion on each
schedule (ops/schedule/crontabd.py). Reading, checking and installing the text is
ops/schedule/installer.py.
"""

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..monitors.redact import Redactor
from .crontabd import Job, Schedule

# install_crontab's exit codes (docs/schedule.md, "install_crontab").
EXIT_OK = 0
EXIT_WOULD_CHANGE = 1  # --check only
EXIT_CRONTABD = 2  # crontab.d has an error, or bad usage
EXIT_TZ = 3  # system time zone differs from TIME_ZONE
EXIT_CRONTAB = 4  # reading or writing the crontab failed, or its text cannot be kept intact

MAX_COMMAND = 998  # Debian's cron: a longer command is "command too long"
BEGIN, END = "# BEGIN cronops ", "# END cronops "
BANNER = " (managed by `manage.py install_crontab`: edit crontab.d/, not these lines)"
_JOB_COMMENT = re.compile(r"^# job ([a-z0-9_-]+)(?::|$)")


class InstallError(Exception):
    """The installer refuses; nothing was changed. `returncode` is the command's exit code."""

    def __init__(self, message: str, returncode: int = EXIT_CRONTAB):
        super().__init__(message)
        self.returncode = returncode


# --- rendering -------------------------------------------------------------------------------


def cron_quote(word: str) -> str:
    """`word` quoted for /bin/sh, with every `%` escaped for cron (`\\%`).

    Cron turns an unescaped `%` into a newline and removes the backslash of `\\%`, but a
    backslash right before it would escape the escape; so the word is quoted in pieces around
    each `%`, and no backslash can precede an escaped `%`.
    """
    if word == "":
        return "''"
    return "\\%".join(shlex.quote(piece) if piece else "" for piece in word.split("%"))


_TAKES_VALUE = {"--name", "--timeout", "--catch-up", "--wait", "--ping", "--logical-date"}


def rendered_argv(job: Job) -> list[str]:
    """The job's run_job arguments without `--ping` (a ping URL may hold the project's key;
    run_job finds the job by name in crontab.d and takes its options from there)."""
    argv, out, i = job.argv, [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            out.extend(argv[i:])  # the command and its own arguments, untouched
            break
        width = 2 if arg in _TAKES_VALUE else 1
        if arg.split("=", 1)[0] != "--ping":
            out.extend(argv[i : i + width])
        i += width
    return out


@dataclass
class Paths:
    project_dir: Path
    python: str
    manage_py: Path
    log_dir: Path


def run_job_argv(job: Job, log_dir: Path) -> list[str]:
    """`run_job`'s arguments on the job's installed line (the dispatcher gives it the same)."""
    # run_job opens its log itself (--log, first so that even a usage error lands there): a
    # shell `>> log` fails before run_job starts when OPS_LOG_DIR is gone, and then nothing
    # is recorded, pinged or written anywhere.
    return [f"--log={log_dir / (job.name + '.log')}", *rendered_argv(job)]


def _command(paths: Paths, words: list[str], where: str) -> str:
    command = f"cd {cron_quote(str(paths.project_dir))} && " + " ".join(
        cron_quote(w) for w in [paths.python, str(paths.manage_py), *words]
    )
    if len(command.encode()) > MAX_COMMAND:
        raise InstallError(
            f"{where}: the rendered command is {len(command.encode())} bytes; "
            f"Debian's cron refuses commands over {MAX_COMMAND} (shorten its arguments or the "
            "project path)",
            EXIT_CRONTABD,
        )
    return command


def render_line(job: Job, paths: Paths) -> str:
    words = ["run_job", *run_job_argv(job, paths.log_dir)]
    return f"{job.schedule} {_command(paths, words, f'{job.path}:{job.lineno}')}"


DISPATCHER = "run_due_jobs"  # the dispatcher's command, and its name in the block


def dispatcher_line(paths: Paths) -> str:
    """The one line a minute of `install_crontab --dispatcher` (ops/run/dispatch.py)."""
    log = f"--log={paths.log_dir / (DISPATCHER + '.log')}"
    return f"* * * * * {_command(paths, [DISPATCHER, log], 'the dispatcher line')}"


def block_lines(
    schedule: Schedule, crontab_id: str, paths: Paths, dispatcher: bool = False
) -> list[tuple[str, str]]:
    """The managed block's lines (without their newline), each with the crontab.d `file:line`
    it comes from ("" for the markers): a line `crontab -n` refuses is reported there.

    With `dispatcher`, one `* * * * *` line runs `run_due_jobs`, which starts the jobs due
    each minute; only `@reboot` jobs keep lines of their own (cron alone knows a boot)."""
    lines = [(BEGIN + crontab_id + BANNER, "")]
    if schedule.mailto is not None:
        # Debian's cron reads a bare `MAILTO=` as a job line ("bad minute"); `MAILTO=""` is
        # its documented "no mail".
        lines.append(("MAILTO=" + (schedule.mailto or '""'), schedule.mailto_at))
    if dispatcher:
        timed = [job.name for job in schedule.jobs if job.cron_expr is not None]
        what = f"starts the jobs of crontab.d due each minute ({len(timed)}: {', '.join(timed)})"
        lines.append((f"# job {DISPATCHER}: the dispatcher: {what}"[:300], ""))
        lines.append((dispatcher_line(paths), ""))
    for job in schedule.jobs:
        if dispatcher and job.cron_expr is not None:
            continue
        where = f"{job.path}:{job.lineno}"
        description = " ".join(job.description.split())
        lines.append((f"# job {job.name}" + (f": {description}" if description else ""), where))
        lines.append((render_line(job, paths), where))
    lines.append((END + crontab_id, ""))
    return lines


def render_block(
    schedule: Schedule, crontab_id: str, paths: Paths, dispatcher: bool = False
) -> str:
    """The managed block, markers included, every line ending in a newline."""
    lines = block_lines(schedule, crontab_id, paths, dispatcher)
    return "".join(line + "\n" for line, _ in lines)


def redact(text: str, secrets: dict[str, str]) -> str:
    """`text` with every secret's value (in any form a program prints it) replaced by its name."""
    return Redactor(secrets).text(text)


def check_no_secrets(block: str, secrets: dict[str, str]) -> None:
    for name, value in secrets.items():
        if Redactor({name: value}).text(block) != block:  # URL-quoted and escaped forms too
            raise InstallError(
                f"refusing to install: a crontab.d line contains the value of {name} "
                "(secrets belong in .env, which run_job reads)",
                EXIT_CRONTABD,
            )


# --- the managed block inside a crontab -------------------------------------------------------


@dataclass
class Split:
    before: str
    block: str
    after: str

    @property
    def found(self) -> bool:
        return bool(self.block)


def _marker_id(line: str, prefix: str) -> str | None:
    if not line.startswith(prefix):
        return None
    rest = line[len(prefix) :].rstrip("\n")
    return rest.split(" ", 1)[0] if rest else None


def cron_lines(text: str) -> list[str]:
    """`text` cut after each newline, as cron reads it. Never `str.splitlines()`: it also cuts
    at U+2028, U+2029, U+0085, \\v, \\f and \\x1c-\\x1e, which cron keeps inside a line."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    return [*lines, parts[-1]] if parts[-1] else lines


def split_block(text: str, crontab_id: str) -> Split:
    """Cut `text` around this project's block; InstallError if its markers are damaged."""
    lines = cron_lines(text)
    begins = [i for i, line in enumerate(lines) if _marker_id(line, BEGIN) == crontab_id]
    ends = [i for i, line in enumerate(lines) if _marker_id(line, END) == crontab_id]
    if not begins and not ends:
        return Split(text, "", "")
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        where = ", ".join(str(i + 1) for i in sorted(begins + ends))
        raise InstallError(
            f"the crontab has damaged markers for block {crontab_id!r} (lines {where}): fix or "
            "remove them by hand with `crontab -e`; nothing was changed"
        )
    b, e = begins[0], ends[0]
    inner = lines[b + 1 : e]
    for line in inner:  # another project's marker inside ours: someone edited by hand
        if _marker_id(line, BEGIN) or _marker_id(line, END):
            raise InstallError(
                f"the crontab has another block's marker inside block {crontab_id!r}: "
                "fix it by hand with `crontab -e`; nothing was changed"
            )
    return Split("".join(lines[:b]), "".join(lines[b : e + 1]), "".join(lines[e + 1 :]))


_ENV = re.compile(r"^\s*MAILTO\s*=")


def splice(text: str, block: str, crontab_id: str) -> str:
    """`text` with this project's block replaced by `block` (removed when empty), kept last.

    Lines outside the block keep their bytes and their order; the only change ever made to
    them is a final newline added when the text lacks one and a block follows.
    """
    part = split_block(text, crontab_id)
    if part.found and block and _only_blocks(part.after) and not _sets_mailto(block):
        # Only other cronops blocks follow: stay in place, so that two projects sharing a
        # crontab do not swap places on every install. Not with a MAILTO of ours, which
        # would reach the blocks below.
        return part.before + block + part.after
    foreign = part.before + part.after
    if not block:
        return foreign
    if foreign and not foreign.endswith("\n"):
        foreign += "\n"
    return foreign + block


def _sets_mailto(block: str) -> bool:
    return any(_ENV.match(line) for line in cron_lines(block))


def _only_blocks(text: str) -> bool:
    """True if `text` is nothing but complete cronops blocks (any ids)."""
    inside = None
    for line in cron_lines(text):
        if inside is None:
            inside = _marker_id(line, BEGIN)
            if inside is None or not line.endswith("\n"):
                return False
        elif _marker_id(line, END) == inside and line.endswith("\n"):
            inside = None
        elif _marker_id(line, BEGIN) or _marker_id(line, END):
            return False
    return inside is None


def block_jobs(block: str) -> dict[str, str]:
    """{job name: its cron line} in a rendered block."""
    jobs, name = {}, None
    for line in cron_lines(block):
        line = line.rstrip("\n")
        match = _JOB_COMMENT.match(line)
        if match:
            name = match.group(1)
        elif name and line and not line.startswith("#"):
            jobs[name], name = line, None
    return jobs


@dataclass
class Summary:
    total: int
    added: int
    removed: int
    changed: int

    def __str__(self):
        return f"+{self.added} \u2212{self.removed} ~{self.changed}"


def summarize(old_block: str, new_block: str) -> Summary:
    old, new = block_jobs(old_block), block_jobs(new_block)
    return Summary(
        total=len(new),
        added=len(new.keys() - old.keys()),
        removed=len(old.keys() - new.keys()),
        changed=sum(1 for k in new.keys() & old.keys() if new[k] != old[k]),
    )
