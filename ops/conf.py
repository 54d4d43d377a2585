"""cronops' settings, each with a default: a project needs none of them to start.

Each setting is read, in this order, from the Django setting of that name, else the environment
variable of the same name (so a line in `.env` is enough: cron's runs load it through
`ops.env.load_env`), else its default. An empty value (`""`, `None`) counts as unset, except for
HEALTHCHECKS_CHANNELS, where `""` means no integrations. Relative paths are taken from
`settings.BASE_DIR`, the directory of `manage.py` in a project made by `startproject`. Values are
read at each use, never cached: `override_settings` works, and a value from `.env` is seen whatever
imported this module first.

A value that cannot be used raises `SettingError`, one line naming the setting, where its value
came from and what is accepted; `manage.py check` reports every one as ops.E006. Values of the
secret settings (the healthchecks.io keys) are never shown.

Importing this module costs nothing on run_job's path: it reads `os.environ` and Django's
already-loaded settings, and imports nothing heavier than `pathlib`.

| setting | default |
|---|---|
| OPS_CRONTAB_DIR | `<BASE_DIR>/crontab.d` |
| OPS_VAR_DIR | `<BASE_DIR>/var` (only the base of the two below) |
| OPS_LOCK_DIR | `<OPS_VAR_DIR>/lock` |
| OPS_LOG_DIR | `<OPS_VAR_DIR>/log` |
| OPS_HOST | the machine's host name |
| OPS_CRONTAB_ID | "" (install_crontab derives one from BASE_DIR) |
| OPS_HEARTBEAT_SECONDS | 30 |
| OPS_PING_BUDGET_SECONDS | 10 |
| OPS_DEFAULT_GRACE | 1h |
| OPS_STANDBY | off |
| OPS_HC_TAG | "" (sync_healthchecks derives `cronops-<BASE_DIR's name>`) |
| OPS_REDACT | [] |
| HEALTHCHECKS_PING_URL | https://hc-ping.com/ |
| HEALTHCHECKS_PING_KEY | "" (no pings) |
| HEALTHCHECKS_AUTO_CREATE | False |
| HEALTHCHECKS_API_URL | https://healthchecks.io/api/v3/ |
| HEALTHCHECKS_API_KEY | "" |
| HEALTHCHECKS_CHANNELS | * |
| OPS_SENTRY_DSN | SENTRY_DSN (the project's own), else "" (no check-ins) |
| SENTRY_ENVIRONMENT | "" (Sentry's default, production) |

The full meaning of each is in docs/settings.md.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEFAULT_PING_URL = "https://hc-ping.com/"
DEFAULT_API_URL = "https://healthchecks.io/api/v3/"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingError(ImproperlyConfigured):
    """A cronops setting whose value cannot be used; str() is one line for an operator."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name = name


def _raw(name: str, source=None) -> tuple[object, str]:
    """(value, where it came from) or (None, "") when unset everywhere. `source` is the
    settings object (default: Django's); tests and callers that take one pass it."""
    value = getattr(settings if source is None else source, name, None)
    if value is not None and value != "":
        return value, "the setting"
    value = os.environ.get(name, "")
    if value != "":
        return value, "the environment"
    return None, ""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:50] + "…"


def _bad(name: str, value: object, where: str, expected: str) -> SettingError:
    return SettingError(name, f"{_shown(value)} (from {where}) is not {expected}")


def _string(name: str, default: str, source=None, secret: bool = False) -> str:
    value, where = _raw(name, source)
    if value is None:
        return default
    if not isinstance(value, str):
        shown = "a value" if secret else _shown(value)
        raise SettingError(name, f"{shown} (from {where}) is not a string")
    return value


def _seconds(name: str, default: float, source=None, minimum: float = 0.0) -> float:
    value, where = _raw(name, source)
    if value is None:
        return default
    try:
        # float() raises TypeError for what it cannot take (caught below)
        seconds = math.nan if isinstance(value, bool) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not (minimum < seconds < math.inf):
        raise _bad(name, value, where, f"a number of seconds above {minimum:g}")
    return seconds


def _flag(name: str, source=None) -> bool:
    value, where = _raw(name, source)
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _bad(name, value, where, "on or off (1/0, true/false, yes/no, on/off)")


def _url(name: str, default: str, source=None) -> str:
    value = _string(name, default, source)
    # The base of every ping or API call: no userinfo is expected here, and none is shown.
    shown = _shown(value) if "@" not in value else "the value"
    where = _raw(name, source)[1]
    scheme, _, rest = value.partition("://")
    host = rest.split("/", 1)[0]
    if scheme.lower() not in ("http", "https") or not host or "@" in host:
        raise SettingError(
            name, f"{shown} (from {where}) is not an http:// or https:// URL with a host"
        )
    # Paths are appended to it (<base><key>/<slug>/start): a query or fragment would swallow
    # them, and a space or a bad port would only fail at the first ping.
    why = None
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        why = "has a space or control character"
    elif "?" in value or "#" in value:
        why = "has a query or fragment ('?', '#'): pings append their path to it"
    else:
        try:
            port = urllib.parse.urlsplit(value).port
        except ValueError:
            why = "has a bad port (1-65535)"
        else:
            if port == 0:
                why = "has a bad port (1-65535)"
    if why:
        raise SettingError(name, f"{shown} (from {where}) {why}")
    return value


def base_dir(source=None) -> Path:
    """settings.BASE_DIR: the directory of manage.py, which relative paths are taken from."""
    value = getattr(settings if source is None else source, "BASE_DIR", None)
    if value is None or value == "":
        raise SettingError(
            "BASE_DIR",
            "not defined: cronops takes OPS_CRONTAB_DIR, OPS_VAR_DIR and the path of manage.py "
            "in the installed crontab from it; define it in your settings (startproject does: "
            "BASE_DIR = Path(__file__).resolve().parent.parent)",
        )
    return Path(value)


def _path(name: str, default, source=None) -> Path:
    value, where = _raw(name, source)
    if value is None:
        return default()
    if not isinstance(value, str | os.PathLike) or "\0" in str(value):
        raise _bad(name, value, where, "a path")
    path = Path(value)
    return path if path.is_absolute() else base_dir(source) / path


def var_dir(source=None) -> Path:
    """OPS_VAR_DIR: the base of the lock and log directories' defaults."""
    return _path("OPS_VAR_DIR", lambda: base_dir(source) / "var", source)


def crontab_dir(source=None) -> Path:
    """OPS_CRONTAB_DIR: the schedule files, `*.cron`."""
    return _path("OPS_CRONTAB_DIR", lambda: base_dir(source) / "crontab.d", source)


def lock_dir(source=None) -> Path:
    """OPS_LOCK_DIR: one lock file per job."""
    return _path("OPS_LOCK_DIR", lambda: var_dir(source) / "lock", source)


def log_dir(source=None) -> Path:
    """OPS_LOG_DIR: where each installed cron line's `run_job --log` appends."""
    return _path("OPS_LOG_DIR", lambda: var_dir(source) / "log", source)


def host(source=None) -> str:
    """OPS_HOST: this host's name in claims and the history."""
    value = _string("OPS_HOST", "", source)
    if not value:
        import socket

        return socket.gethostname()
    if len(value) > 255 or any(c.isspace() or not c.isprintable() for c in value):
        where = _raw("OPS_HOST", source)[1]
        raise _bad("OPS_HOST", value, where, "a host name (1-255 characters, no spaces)")
    return value


def crontab_id(source=None) -> str:
    """OPS_CRONTAB_ID: marks this project's block in a shared crontab ("": derived)."""
    return _string("OPS_CRONTAB_ID", "", source)


def heartbeat_seconds(source=None) -> float:
    """OPS_HEARTBEAT_SECONDS: how often a running job refreshes its claim."""
    return _seconds("OPS_HEARTBEAT_SECONDS", 30.0, source)


def ping_budget_seconds(source=None) -> float:
    """OPS_PING_BUDGET_SECONDS: the most pings may add to the end of a run."""
    return _seconds("OPS_PING_BUDGET_SECONDS", 10.0, source)


def default_grace(source=None) -> float | None:
    """OPS_DEFAULT_GRACE in seconds, None when unset (the caller's default applies)."""
    value, where = _raw("OPS_DEFAULT_GRACE", source)
    if value is None:
        return None
    from .schedule.durations import parse_duration
    from .schedule.options import MAX_DURATION

    try:
        return parse_duration(str(value), maximum=MAX_DURATION)
    except ValueError as exc:
        raise SettingError("OPS_DEFAULT_GRACE", f"{exc} (from {where})") from None


def standby(source=None) -> bool:
    """OPS_STANDBY: every run that finds its slot held by a live run stands by (--standby)."""
    return _flag("OPS_STANDBY", source)


def hc_tag(source=None) -> str:
    """OPS_HC_TAG: the healthchecks.io tag of this project's checks ("": derived)."""
    return _string("OPS_HC_TAG", "", source)


def redact_names(source=None) -> list[str]:
    """OPS_REDACT: names of more settings (else environment variables) holding secrets."""
    value, where = _raw("OPS_REDACT", source)
    if value is None:
        return []
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    if isinstance(value, list | tuple | set | frozenset) and all(isinstance(n, str) for n in value):
        return [n for n in value if n]
    raise _bad("OPS_REDACT", value, where, "a list of setting names (or a comma-separated string)")


def ping_url(source=None) -> str:
    """HEALTHCHECKS_PING_URL: the ping base URL."""
    return _url("HEALTHCHECKS_PING_URL", DEFAULT_PING_URL, source)


def ping_key(source=None) -> str:
    """HEALTHCHECKS_PING_KEY: the project's ping key ("": no pings by slug)."""
    return _string("HEALTHCHECKS_PING_KEY", "", source, secret=True)


def auto_create(source=None) -> bool:
    """HEALTHCHECKS_AUTO_CREATE: add `?create=1` to slug pings."""
    return _flag("HEALTHCHECKS_AUTO_CREATE", source)


def api_url(source=None) -> str:
    """HEALTHCHECKS_API_URL: the Management API base."""
    return _url("HEALTHCHECKS_API_URL", DEFAULT_API_URL, source)


def api_key(source=None) -> str:
    """HEALTHCHECKS_API_KEY: the project's API key, for sync_healthchecks."""
    return _string("HEALTHCHECKS_API_KEY", "", source, secret=True)


def channels(source=None) -> str:
    """HEALTHCHECKS_CHANNELS: channels for the checks sync_healthchecks creates.

    The one setting where `""` is a value, not "unset": it means no integrations, as the API
    reads it (an empty setting or an empty `HEALTHCHECKS_CHANNELS=` line in .env)."""
    name = "HEALTHCHECKS_CHANNELS"
    value = getattr(settings if source is None else source, name, None)
    if value == "" or (value is None and os.environ.get(name) == ""):
        return ""
    return _string(name, "*", source)


def _sentry_value(name: str, source=None) -> str | None:
    """A Sentry setting as written (settings, else environment), None when unset; "" counts."""
    value = getattr(settings if source is None else source, name, None)
    if value is None:
        value = os.environ.get(name)
    if value is not None and not isinstance(value, str):
        raise SettingError(name, "a value (from the setting) is not a string")
    return value


def sentry_dsn(source=None) -> str:
    """The DSN Sentry Crons check-ins go to: OPS_SENTRY_DSN (cronops' own: for the monitors
    alone; set empty, none; a malformed one is an error), else SENTRY_DSN (the project's, as
    Sentry's own docs set it: one sentry-sdk takes but cronops cannot use turns the check-ins
    off, ops.W012, and never stops a job), else "". Never shown: it holds the project's key."""
    ours = _sentry_value("OPS_SENTRY_DSN", source)
    if ours is not None:
        if ours.strip():
            from .monitors.dsn import DsnError, parse_dsn  # only then: other commands stay lean

            try:
                parse_dsn(ours)
            except DsnError as exc:
                raise SettingError("OPS_SENTRY_DSN", f"the value {exc}") from None
        return ours.strip()
    theirs = (_sentry_value("SENTRY_DSN", source) or "").strip()
    if not theirs:
        return ""
    from .monitors.dsn import DsnError, parse_dsn

    try:
        parse_dsn(theirs)
    except DsnError:
        return ""  # sentry_problem says why (ops.W012)
    return theirs


def sentry_environment(source=None) -> str:
    """SENTRY_ENVIRONMENT: the environment of the check-ins ("": Sentry's default). One that
    Sentry would refuse is left out of the check-ins (ops.W012), never a reason to stop."""
    value = _string("SENTRY_ENVIRONMENT", "", source)
    return "" if _bad_environment(value) else value


def _bad_environment(value: str) -> bool:
    if not value:
        return False
    from .monitors.dsn import ENVIRONMENT_MAX

    # Sentry's own rule for environment names (no '/', no line break); Relay's length limit.
    return len(value) > ENVIRONMENT_MAX or any(c in "/\n\r\f" for c in value)


def sentry_problem(source=None) -> str | None:
    """Why the project's SENTRY_DSN or SENTRY_ENVIRONMENT cannot be used by cronops's check-ins
    (they are then off, or sent without the environment), or None."""
    if _sentry_value("OPS_SENTRY_DSN", source) is None:
        dsn = (_sentry_value("SENTRY_DSN", source) or "").strip()
        if dsn:
            from .monitors.dsn import DsnError, parse_dsn

            try:
                parse_dsn(dsn)
            except DsnError as exc:
                return f"SENTRY_DSN {exc}: no Sentry check-ins are sent"
    environment = _string("SENTRY_ENVIRONMENT", "", source)
    if environment and _bad_environment(environment):
        return (
            "SENTRY_ENVIRONMENT is not a name Sentry takes (at most 64 characters, no '/' or "
            "line break): check-ins are sent without it (Sentry's default, production)"
        )
    return None


# Every getter, by setting name, for `manage.py check` and docs/settings.md's test.
GETTERS = {
    "OPS_CRONTAB_DIR": crontab_dir,
    "OPS_VAR_DIR": var_dir,
    "OPS_LOCK_DIR": lock_dir,
    "OPS_LOG_DIR": log_dir,
    "OPS_HOST": host,
    "OPS_CRONTAB_ID": crontab_id,
    "OPS_HEARTBEAT_SECONDS": heartbeat_seconds,
    "OPS_PING_BUDGET_SECONDS": ping_budget_seconds,
    "OPS_DEFAULT_GRACE": default_grace,
    "OPS_STANDBY": standby,
    "OPS_HC_TAG": hc_tag,
    "OPS_REDACT": redact_names,
    "HEALTHCHECKS_PING_URL": ping_url,
    "HEALTHCHECKS_PING_KEY": ping_key,
    "HEALTHCHECKS_AUTO_CREATE": auto_create,
    "HEALTHCHECKS_API_URL": api_url,
    "HEALTHCHECKS_API_KEY": api_key,
    "HEALTHCHECKS_CHANNELS": channels,
    "OPS_SENTRY_DSN": sentry_dsn,
    "SENTRY_ENVIRONMENT": sentry_environment,
}


class EnvFileError(SettingError):
    """A `.env` line load_env could not load, or the whole file (ops/env.py); str() is that one
    line."""

    def __init__(self, line: str):
        from . import env

        ImproperlyConfigured.__init__(self, line)
        self.name = ".env"
        self.whole_file = isinstance(line, env.Unreadable)  # there, but it cannot be read


def problems(source=None) -> list[SettingError]:
    """Every setting whose value cannot be used (a missing BASE_DIR counts once), after what
    `.env` could not give (its values may be what the others miss)."""
    from . import env

    found: list[SettingError] = [EnvFileError(line) for line in env.problems]
    for getter in GETTERS.values():
        try:
            getter(source)
        except SettingError as exc:
            if not any(str(exc) == str(seen) for seen in found):
                found.append(exc)
    return found


def validate(source=None) -> None:
    """Raise the first problem of problems(): commands refuse to start on a bad setting."""
    found = problems(source)
    if found:
        raise found[0]
