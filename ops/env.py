"""Load `.env` for cron's bare environment: one call in the project's settings (or manage.py).

    from ops.env import load_env

    load_env(BASE_DIR / ".env")

Cron starts every job with almost no environment (no DATABASE_URL, no keys), so whatever the
project keeps in `.env` must be read by the process itself. Two rules make the file safe to
share between an operator's shell, a deploy and cron:

- the real environment wins: a variable already set (by the shell, a test, `make demo`, a
  Kubernetes pod) is never replaced by the file's value;
- no interpolation: `${HOME}` or `$X` in a value stays as written, so a secret containing `$`
  is kept byte for byte.

A missing file is not an error (a developer machine may have none).
"""

from __future__ import annotations

import os


def load_env(path: str | os.PathLike[str]) -> bool:
    """Put the variables of the dotenv file `path` into os.environ, without overriding any
    already set; True when the file holds at least one variable."""
    from dotenv import load_dotenv

    return load_dotenv(path, override=False, interpolate=False)
