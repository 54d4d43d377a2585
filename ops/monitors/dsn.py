"""A Sentry DSN, read as sentry-sdk reads one: where check-ins go, and with what key.

Light to import: the settings' checks read the DSN on every command (ops/conf.py), and the
check-ins' machinery (ops/monitors/sentry.py) is run_job's only.
"""

import urllib.parse

from ..values import Value

ENVIRONMENT_MAX = 64  # Relay drops a check-in whose environment is longer
SLUG_MAX = 50  # Sentry cuts a monitor slug to 50 characters


class DsnError(ValueError):
    """A DSN that cannot be used; the message never holds its key."""


class Dsn(Value, frozen=True):
    endpoint: str  # https://host[:port]/[path/]api/<project>/envelope/
    public_key: str
    host: str  # for messages: where check-ins go (no key)
    secret: str = ""  # an old DSN's secret part (key:secret@): sent nowhere, redacted


def parse_dsn(dsn: str) -> Dsn:
    """`scheme://public_key[:secret]@host[:port]/[path/]project_id` → where to send, with what
    key, as sentry-sdk reads a DSN (sentry_sdk.utils.Dsn: a query or fragment is ignored)."""
    parts = urllib.parse.urlsplit(dsn.strip())
    if parts.scheme.lower() not in ("http", "https"):
        raise DsnError("is not an http:// or https:// Sentry DSN")
    try:
        port = parts.port
    except ValueError:
        raise DsnError("has a bad port") from None
    if not parts.hostname or not parts.username:
        raise DsnError("has no public key and host (https://<key>@<host>/<project id>)")
    path, _, project = parts.path.rstrip("/").rpartition("/")
    if not project.isdigit():
        raise DsnError("does not end with a project id (https://<key>@<host>/<project id>)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6
    netloc = host + (f":{port}" if port else "")
    endpoint = f"{parts.scheme.lower()}://{netloc}{path}/api/{project}/envelope/"
    return Dsn(endpoint, parts.username, netloc, secret=parts.password or "")
