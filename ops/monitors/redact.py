"""Secrets cronops knows, and their removal from what leaves the run (ping bodies, history).

The values: SECRET_KEY, HEALTHCHECKS_PING_KEY, HEALTHCHECKS_API_KEY, DATABASE_URL and its
password, the Sentry DSN (OPS_SENTRY_DSN, else SENTRY_DSN) and its key, and every setting (else
environment variable) named in OPS_REDACT. A value shorter than MIN_LENGTH is skipped:
replacing every "admin" or "1234" in a job's output would make it unreadable and protects
nothing. Each value is also matched as a program would print it:
repr()- and JSON-escaped, and URL-quoted (a password inside a URL).

Only copies are redacted: the job's own output to cron's log stays the job's.
"""

import functools
import json
import os
import re
import urllib.parse
from collections.abc import Iterable
from types import MappingProxyType

from .. import conf

MIN_LENGTH = 8


def known_secrets(settings) -> dict[str, str]:
    """{name: value} of the secrets to keep out of ping bodies and the stored tail. A setting
    of the wrong type is skipped (its own error is reported where it is read): an error
    message quoting a secret must still be redacted while the settings are broken."""
    secrets = {
        "SECRET_KEY": getattr(settings, "SECRET_KEY", ""),
        "HEALTHCHECKS_PING_KEY": _or_default(conf.ping_key, settings, ""),
        "HEALTHCHECKS_API_KEY": _or_default(conf.api_key, settings, ""),
        "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
        "the Sentry DSN": _or_default(conf.sentry_dsn, settings, ""),
        "the Sentry DSN's key": _dsn_part(_or_default(conf.sentry_dsn, settings, ""), 0),
        "the Sentry DSN's secret": _dsn_part(_or_default(conf.sentry_dsn, settings, ""), 1),
    }
    for alias, database in getattr(settings, "DATABASES", {}).items():
        name = "the database password" if alias == "default" else f"the {alias} database password"
        secrets[name] = (database or {}).get("PASSWORD") or ""
    for name in _or_default(conf.redact_names, settings, []):
        value = getattr(settings, name, None)
        if value is None:
            value = os.environ.get(name, "")
        for i, item in enumerate(_strings(value)):
            secrets[name if i == 0 else f"{name}[{i}]"] = item
    return {k: v for k, v in secrets.items() if isinstance(v, str) and len(v) >= MIN_LENGTH}


def _dsn_part(dsn: str, index: int) -> str:
    """A DSN's public key (0) or its old secret part (1: `key:secret@`), "" when none."""
    if "@" not in dsn:
        return ""
    key, _, secret = dsn.partition("://")[2].partition("@")[0].partition(":")
    return (key, secret)[index]


def _or_default(read, settings, default):
    try:
        return read(settings)
    except conf.SettingError:
        return default


def redacted(text: str) -> str:
    """`text` with the known secrets of Django's settings replaced by `<redacted NAME>`: for
    messages that quote configuration (a crontab.d line), whichever command, log, mail or page
    shows them."""
    from django.conf import settings

    if not settings.configured:
        return text
    return Redactor(known_secrets(settings)).text(text)


def _strings(value, depth: int = 0) -> list[str]:
    """The strings inside a setting's value: a string, or lists / dicts of them, nested (a
    DATABASES-like setting holds its passwords two levels down)."""
    if isinstance(value, str):
        return [value]
    if depth >= 5:
        return []
    if isinstance(value, dict):
        value = value.values()
    if isinstance(value, Iterable) and not isinstance(value, bytes):
        return [s for v in value for s in _strings(v, depth + 1)]
    return []


def _forms(value: str) -> set[bytes]:
    forms = {
        value,
        repr(value)[1:-1],
        json.dumps(value)[1:-1],
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote(value),
    }
    return {f.encode() for f in forms if len(f) >= MIN_LENGTH}


def _pattern(form: bytes) -> bytes:
    """A secret with spaces in it (a passphrase) matched also when the program that printed it
    wrapped its lines there (textwrap, a log formatter): any run of white space stands for one."""
    words = form.split(b" ")
    return rb"\s+".join(re.escape(w) for w in words) if len(words) > 1 else re.escape(form)


@functools.lru_cache(maxsize=8)
def _forms_named(secrets: tuple[tuple[str, str], ...]):
    """(form -> its `<redacted NAME>`, longest first; the longest a match can be)."""
    names: dict[bytes, bytes] = {}
    for name, value in secrets:
        for form in _forms(value):
            names.setdefault(form, f"<redacted {name}>".encode())
    # Longest first: the whole DATABASE_URL goes before the password inside it.
    forms = sorted(names, key=len, reverse=True)
    # A wrapped secret is longer by its line breaks and indentation: room for those too.
    return MappingProxyType({f: names[f] for f in forms}), 2 * len(forms[0]) if forms else 0


@functools.lru_cache(maxsize=8)
def _compiled(forms: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """The pattern of every form. Kept: compiling the pattern of a SECRET_KEY's forms costs
    ~2 M instructions, and the warm dispatcher compiles it once for every job it forks."""
    return re.compile(b"|".join(_pattern(f) for f in forms))


class Redactor:
    """Replaces secret values in bytes by `<redacted NAME>`."""

    def __init__(self, secrets: dict[str, str]):
        self.names, self.longest = _forms_named(tuple(secrets.items()))
        # Every match of a form begins with the form's first word, verbatim: where none of
        # these occurs there is nothing to replace, and the pattern (compiled at its first
        # use) is not needed. Most runs print no secret, so most never compile it.
        self._firsts = tuple({form.split(b" ", 1)[0] for form in self.names})

    def pattern(self) -> re.Pattern[bytes] | None:
        """Every form's pattern (None: no secret), compiled at its first use by any Redactor."""
        return _compiled(tuple(self.names)) if self.names else None

    @classmethod
    def from_settings(cls, settings=None) -> "Redactor":
        if settings is None:
            from django.conf import settings
        return cls(known_secrets(settings))

    def _name(self, found: bytes) -> bytes:
        if found in self.names:
            return self.names[found]
        for form, name in self.names.items():  # a wrapped one: rare, so a plain search
            if re.fullmatch(_pattern(form), found):
                return name
        return b"<redacted>"

    def __bool__(self) -> bool:
        return bool(self.names)

    def bytes(self, data: bytes, drop: int = 0) -> bytes:
        """`data` redacted, without its first `drop` bytes.

        `drop` is where a window cut out of a longer stream really starts: the window begins
        `drop` (>= the longest secret) bytes earlier, so a secret straddling the real start is
        seen whole here and replaced, never kept in part."""
        if not any(first in data for first in self._firsts):
            return data[drop:]
        pattern = self.pattern()
        assert pattern is not None  # a first word was found: there are forms
        out = []
        pos = 0
        for match in pattern.finditer(data):
            start, end = match.span()
            if start > pos and start > drop:
                out.append(data[max(pos, drop) : start])
            if end > drop:
                out.append(self._name(match.group()))
            pos = end
        if len(data) > max(pos, drop):
            out.append(data[max(pos, drop) :])
        return b"".join(out)

    def text(self, text: str) -> str:
        """`text` redacted, and encodable as UTF-8 (a file name or argument that came through
        os.fsdecode carries surrogates, which the database and a ping body cannot hold)."""
        data = text.encode("utf-8", "backslashreplace")
        return (self.bytes(data) if self else data).decode("utf-8", "replace")
