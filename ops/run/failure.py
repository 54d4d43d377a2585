"""Why a run failed, in one line: the last line its command wrote to stderr.

A failed run (a non-zero exit, a crash's signal, `--timeout`) gets one `cronops:` line on
run_job's stderr, `job send_reminders: failed (exit 3): ValueError: no SMTP host`, and its
history note keeps the same words (job_status's reason, the jobs page and the final ping show
the note). The line is the last non-blank line the job's processes wrote to their stderr (fd 2,
children included; `\\r`-rewritten progress keeps its last state), with the secrets cronops
knows redacted (ops/monitors/redact.py) and cut to LINE_CHARS. A job that wrote nothing there
is said to have, briefly: `failed (exit 3); nothing on stderr`.
"""

import re
import threading
from typing import TYPE_CHECKING

from ..models import Outcome

if TYPE_CHECKING:
    from .supervisor import Ended

LINE_CHARS = 200  # what is shown of the line (after redaction)
KEEP_BYTES = 4096  # what is kept of the line being written: its start, the informative part
NOTHING = "nothing on stderr"


# A terminal's escape sequences (colours, cursor moves; OSC titles), which a log line or a
# ping would show as `[31m`. Compiled at its first use (by re's cache): most output has none.
_ANSI = rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"


def _plain(data: bytes | bytearray) -> bytes | bytearray:
    """`data` without its escape sequences (each begins with ESC)."""
    return re.sub(_ANSI, b"", data) if b"\x1b" in data else data


class LastLine:
    """The last non-blank line written to a stream, fed chunk by chunk from one reader thread;
    bounded whatever the job writes (a line's first KEEP_BYTES + `margin` bytes, so a secret
    at the cut is still seen whole by the redactor)."""

    def __init__(self, margin: int = 0):
        self.keep = KEEP_BYTES + margin
        self._line = bytearray()  # the line being written
        self._last = b""  # the last finished non-blank line
        self._lock = threading.Lock()

    def write(self, chunk: bytes) -> None:
        with self._lock:
            *finished, rest = chunk.split(b"\n")
            for part in finished:
                self._add(part)
                if _plain(self._line).strip():  # a colour reset alone is no line
                    self._last = bytes(self._line)
                self._line.clear()
            self._add(rest)

    def _add(self, part: bytes) -> None:
        room = self.keep - len(self._line)
        if room > 0:
            self._line += part[:room]

    def text(self, redactor=None) -> str:
        """The line (an unfinished last line counts), redacted, one line, at most LINE_CHARS."""
        with self._lock:
            data = bytes(self._line) if _plain(self._line).strip() else self._last
        data = bytes(_plain(data))  # `\x1b[31mERROR\x1b[0m` reads ERROR
        # A progress bar rewrites its line with \r: what a terminal would show is the last part.
        parts = [p for p in data.decode("utf-8", "replace").split("\r") if p.strip()]
        text = parts[-1].strip() if parts else ""
        if redactor is not None:
            text = redactor.text(text)
        text = text.replace("\x00", "\ufffd")  # as the child's error line (PostgreSQL: no NUL)
        text = "".join(c if c.isprintable() else " " for c in text)  # ESC, tabs
        return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1] + "…"


def explain(ended: "Ended", last: str) -> tuple[str, str]:
    """(the words of the `cronops: job NAME: …` line, the note to record) of a run that ended
    so (ops/run/supervisor.py) after its job wrote `last` as its last stderr line; for a run
    that neither failed nor timed out, its note twice.

    The note is the runner's own: the child's error line (`CommandError: …`, `exit 256`), `the
    job was killed by SIGKILL`, `timed out after 30m`, `could not start the job: …`."""
    outcome, exit_code, note = ended.outcome, ended.exit_code, ended.note
    if outcome == Outcome.TIMED_OUT:
        said = f"{note} (exit {exit_code})"
        return _with(said, last), f"{note}: {last}" if last else note
    if outcome != Outcome.FAILED:
        return note, note
    killed = note.startswith("the job was killed by ")
    if killed:
        said = f"failed ({note.removeprefix('the job was ')})"
        return _with(said, last), f"{note}: {last}" if last else note
    # The child's line is what the job wrote last when it was an exception; a bare `exit N`
    # would say the exit code twice.
    cause = last or (note if note and note != f"exit {exit_code}" else "")
    return _with(f"failed (exit {exit_code})", cause), cause or NOTHING


def _with(said: str, cause: str) -> str:
    return f"{said}: {cause}" if cause else f"{said}; {NOTHING}"
