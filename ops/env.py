"""Load `.env` for cron's bare environment: one call in the project's settings (or manage.py).

    from ops.env import load_env

    load_env(BASE_DIR / ".env")

Cron starts every job with almost no environment (no DATABASE_URL, no keys), so whatever the
project keeps in `.env` must be read by the process itself. Two rules make the file safe to
share between an operator's shell, a deploy and cron:

- the real environment wins: a variable already set (by the shell, a test, `make demo`, a
  Kubernetes pod) is never replaced by the file's value;
- of two assignments of one name in the file the last wins, as python-dotenv, docker compose
  and a shell's `source` have it (an override appended at the end takes effect);
- no interpolation: `${HOME}` or `$X` in a value stays as written, so a secret containing `$`
  is kept byte for byte.

A missing file is not an error (a developer machine may have none); a `.env` that is there but
cannot be read (a symbolic link to nothing, a directory, no permission) is: read as no file, it
would send every process to the settings' default database. Such a file, one that is not
UTF-8, or one with lines python-dotenv cannot parse is not an exception in the settings
module (every process would die with a traceback there): each problem is kept in `problems`,
one line naming the file and the line, and run_job, job_status and the system checks refuse to
go on with it (a garbled DATABASE_URL line would otherwise run jobs against another database).
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat

# What load_env could not load, one line each: "<path>:<line>: <why>" (or "<path>: <why>").
problems: list[str] = []


ENV_MAX = 1 << 20  # bytes: a .env is a few lines; more is a mistake (a link to /dev/zero)


class Unreadable(str):
    """A problem of `problems` with the whole file, not one of its lines: it is there (a name in
    its directory) but cannot be read."""


# compiled at its first use (re caches it): a line python-dotenv cannot parse is rare
_NAME = r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*="


def load_env(path: str | os.PathLike[str]) -> bool:
    """Put the variables of the dotenv file `path` into os.environ, without overriding any
    already set; True when the file holds at least one variable. Problems go to `problems`."""
    try:
        data = _read_regular_file(path)
    except FileNotFoundError:
        try:  # open() followed a link to nothing: not "no file"
            target = os.readlink(path)
        except OSError:
            return False  # no file, not a link either
        problems.append(
            Unreadable(
                f"{path}: a symbolic link to {target}, which does not exist; nothing was "
                "loaded from it"
            )
        )
        return False
    except OSError as exc:
        problems.append(
            Unreadable(f"{path}: cannot be read ({exc.strerror or exc}); nothing was loaded")
        )
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        problems.append(
            f"{path}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x}); nothing was loaded "
            "from the file"
        )
        return False
    from dotenv.parser import parse_stream  # here: a project without .env does not pay for it

    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            found = re.match(_NAME, binding.original.string)
            what = f"{found.group(1)} was not loaded" if found else "that line was not loaded"
            problems.append(
                f"{path}:{binding.original.line}: python-dotenv cannot parse it (an "
                f"unterminated quote?): {what}"
            )
            continue
        if binding.key is None or binding.value is None:
            continue  # a bare NAME line: python-dotenv sets nothing for it either
        values[binding.key] = binding.value  # a later assignment replaces an earlier one
    for key, value in values.items():  # then the real environment wins over the file
        os.environ.setdefault(key, value)
    return bool(values)


def _read_regular_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of `path`, a regular file of at most ENV_MAX bytes; OSError otherwise. Opened
    without blocking: a FIFO named .env (or a link to one) would hang every command."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_size > ENV_MAX:
            raise OSError(errno.EFBIG, f"larger than {ENV_MAX} bytes")
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(ENV_MAX + 1)[:ENV_MAX]
    finally:
        os.close(fd)
