"""The forked child that runs the job's management command (ops/run/supervisor.py forks it).

It starts as a copy of run_job after its claim: Django set up, no thread, no database
connection open. It takes what a job expects of a process of its own: the default signal
dispositions (SIGINT raises KeyboardInterrupt, SIGTERM ends it; handlers an in-process caller
had installed are gone), a process group of its own (run_job signals the group: the job's own
children too), the claim's OPS_* variables in its environment, stdout and stderr on pipes that
run_job reads, stdin as run_job had it (but /dev/null instead of a terminal: the job's group is
not the terminal's, and a read would stop it). It runs the command, says how it ended on a
third pipe (the error line the history keeps), and exits with the command's status without the
interpreter's slow shutdown.
"""

import contextlib
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import NoReturn

from django.core.management.base import CommandError

from . import claims, descendants

REPORT_MAX = 16 * 1024  # what the parent keeps of the report pipe, at most
LINE_MAX = 300  # the history's note
COMMAND_MAX = 500  # the history's command line


def main(
    command: str,
    args: Callable[[], list[str]],
    environ: dict[str, str | None],
    claim: object,
    *,
    stdout: int,
    stderr: int,
    report: int,
    close: Iterable[int],
    unblock: Iterable[int],
    parent: int,
) -> NoReturn:
    code = 1
    try:
        # A run_job killed with SIGKILL takes its job along, as when the job ran inside it: an
        # orphaned job would run on while its claim's holder is provably gone.
        descendants.die_with_parent()
        if os.getppid() != parent:  # it died before that took effect
            os._exit(1)
        os.setpgid(0, 0)
        _default_signals()
        signal.pthread_sigmask(signal.SIG_SETMASK, unblock)
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        for fd in {stdout, stderr} - {1, 2}:
            os.close(fd)
        _no_terminal_stdin()
        _standard_streams()
        _own_error_reporting()
        reporter = Reporter(report)
        for name, value in environ.items():  # one thread here: a safe time to write environ
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        claims.enter(claim)  # type: ignore[arg-type]
        try:
            argv = args()
        except Exception:  # the command cannot load: call_command meets it and says why
            argv = []
        reporter.say({"command": _cut(" ".join([command, *argv]), COMMAND_MAX)})
        code, line = execute(command, argv)
        reporter.say({"code": code, "line": _cut(line, LINE_MAX)})
    except BaseException:  # KeyboardInterrupt too: the job ends here either way
        with contextlib.suppress(Exception):
            os.write(2, traceback.format_exc().encode("utf-8", "backslashreplace"))
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        _flush_error_reporting()
        os._exit(code)


def _own_error_reporting() -> None:
    """The project's sentry_sdk client (its settings' `sentry_sdk.init`) came with the fork:
    its queue holds what run_job's process had not sent yet, and its pool run_job's open
    connections. The job gets a transport of its own, so that it sends only what it reports,
    once, on connections of its own."""
    sentry_sdk = sys.modules.get("sentry_sdk")
    if sentry_sdk is None:
        return
    with contextlib.suppress(Exception):
        from sentry_sdk.transport import make_transport

        client = sentry_sdk.get_client()
        if client.is_active() and client.transport is not None:
            client.transport = make_transport(client.options)


def _flush_error_reporting() -> None:
    """os._exit skips the interpreter's exit hooks: what the project's sentry_sdk queued (the
    job's reported exceptions, its logged errors) is sent first, for at most 2 seconds."""
    sentry_sdk = sys.modules.get("sentry_sdk")
    if sentry_sdk is not None:
        with contextlib.suppress(Exception):
            sentry_sdk.flush(timeout=2.0)


def _default_signals() -> None:
    """What a new Python process has: SIGINT raises KeyboardInterrupt, every other signal an
    in-process caller (or run_job) handled in Python gets its default action back."""
    signal.set_wakeup_fd(-1)  # run_job's wake-up pipe is not the job's
    # The C module's own functions: the signal module's wrap every number and handler in an
    # enum, a third of a no-op job's child (~1.5 M instructions for the 64 signals).
    raw = getattr(signal, "_signal", signal)
    for sig in raw.valid_signals():
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(raw.getsignal(sig)):
                raw.signal(sig, int(signal.SIG_DFL))  # _signal refuses the enum: an int
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _no_terminal_stdin() -> None:
    if os.isatty(0):
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)


def _standard_streams() -> None:
    """sys.stdout and sys.stderr on fds 1 and 2 (the pipes): the caller of an in-process
    call_command may have replaced them (pytest's capture, a StringIO)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        try:
            same = old is not None and old.fileno() == fd
        except Exception:
            same = False
        if same:
            continue
        stream = open(  # never closed: the process ends with os._exit
            fd,
            "w",
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors="backslashreplace",
            closefd=False,
        )
        setattr(sys, name, stream)


def _status(code: int) -> int:
    """An exit status a shell (and a healthchecks /<code> ping) can carry: 0-255, else 1."""
    return code if 0 <= code <= 255 else 1


def execute(command: str, args: list[str]) -> tuple[int, str]:
    """Run a management command, or a task's function (a dotted path: ops/run/tasks.py): (exit
    code as a shell sees it, the error line to record)."""
    from django.core.management import call_command

    from ..schedule.options import is_task_path

    try:
        if is_task_path(command):
            from . import tasks

            tasks.run(command, args)
        else:
            call_command(command, *args)
    except CommandError as exc:
        line = f"CommandError: {exc}"
        _write(2, line + "\n")  # after the job's own output
        return _status(exc.returncode or 1), line
    except SystemExit as exc:
        if exc.code is None:
            return 0, ""
        if isinstance(exc.code, int):
            code = _status(exc.code)
            return code, f"exit {exc.code}" if code else ""
        _write(2, f"{exc.code}\n")
        return 1, str(exc.code)
    except Exception as exc:
        _uncaught(exc)
        return 1, f"{type(exc).__name__}: {_one_line(exc)}"
    return 0, ""


def _uncaught(exc: Exception) -> None:
    """The traceback of an exception the command let out, through sys.excepthook, as for a
    command run alone: the default hook prints it; a project's error reporting (sentry_sdk's
    hook) reports it as it did before run_job ran the command."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except BaseException:  # a hook of the project's that raises (even SystemExit)
        _write(2, traceback.format_exc())


def _write(fd: int, text: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    data = memoryview(text.encode("utf-8", "backslashreplace"))
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data) :]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _cut(text: str, limit: int) -> str:
    """At most `limit` characters, encodable as UTF-8 (a file name from os.listdir may carry
    surrogates, which the database and the redactor refuse), without NUL (PostgreSQL's text
    cannot hold one: the outcome would be unrecordable, and the slot run again and again)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\ufffd")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Reporter:
    """Writes the report to its pipe, and only to it: a job that closed the descriptor and
    opened a file of its own in its place must not get our report in that file."""

    def __init__(self, fd: int):
        self.fd = fd
        info = os.fstat(fd)
        self.identity = (info.st_dev, info.st_ino)

    def say(self, message: dict) -> None:
        try:
            info = os.fstat(self.fd)
        except OSError:
            return
        if (info.st_dev, info.st_ino) != self.identity:
            return  # the parent then judges by the exit status alone
        data = memoryview((json.dumps(message, ensure_ascii=False) + "\n").encode())
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(self.fd, data) :]


def parse_report(data: bytes) -> dict:
    """The child's report, as the parent read it (a line it cannot read is skipped)."""
    report: dict = {}
    for line in data.splitlines():
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict):
                report.update(message)
    return report
