"""The Management API v3 half of the healthchecks stand-in (tests/hcserver.py): a mixin of
HealthchecksServer, whose docstring lists the rules it follows."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import uuid as uuidlib
import zoneinfo
from typing import TYPE_CHECKING

from cronsim import CronSim, CronSimError
from werkzeug import Request, Response

if TYPE_CHECKING:
    from .hcserver import Check

API_KEY = "hcw_" + "k3y" * 9 + "a"  # 32 characters, like a real key
READ_KEY = "hcr_" + "r3d" * 9 + "a"  # the project's read-only key
CHANNELS = ["4f1e8c0a-0000-4000-8000-00000000000a", "4f1e8c0a-0000-4000-8000-00000000000b"]
CHANNEL_NAMES = {CHANNELS[0]: "ops-mail", CHANNELS[1]: "ops-chat"}
MAX_SECONDS = 31_536_000


# The server renames a check's `tz` by a table of its own (hc/lib/tz.py), not by tzdata's links:
# these are its renames as observed on the real server (../shared/FACTS.md, "healthchecks
# server, as observed"); every other name, linked in tzdata or not (`America/Montreal`,
# `Asia/Istanbul`), is stored as written.
SERVER_TZ_RENAMES = {
    "US/Eastern": "America/New_York",
    "Europe/Kiev": "Europe/Kyiv",
    "CET": "Europe/Brussels",
    "EST": "America/Panama",
}


class ManagementAPI:
    """`/api/v3/`: needs `checks`, `api_log`, `api_key`, `read_key`, `api_fail_with`, `server`
    and `add()` of the server it is mixed into."""

    STR_FIELDS = ("name", "slug", "tags", "desc", "schedule", "tz", "channels", "methods")
    SECONDS_FIELDS = ("grace", "timeout")
    BOOL_FIELDS = ("manual_resume", "filter_subject", "filter_body")

    def api(self, request: Request) -> Response:
        body = None
        if request.method == "POST":
            try:
                body = json.loads(request.get_data() or b"null")
            except ValueError:
                return self.json({"error": "could not parse request body"}, 400)
        self.api_log.append((request.method, request.path, body))
        key = request.headers.get("X-Api-Key", "")
        if len(key) != 32:
            return self.json({"error": "missing api key"}, 401)
        if key not in (self.api_key, self.read_key):
            return self.json({"error": "wrong api key"}, 401)
        readonly = key == self.read_key
        code = request.path.removeprefix("/api/v3/checks/").strip("/")
        # The read-only key may only read checks (the server's `authorize_read`).
        if readonly and not (
            request.method == "GET" and request.path.startswith("/api/v3/checks/")
        ):
            return self.json({"error": "wrong api key"}, 401)
        if self.api_fail_with is not None:
            status, document = self.api_fail_with
            return self.json(document, status)
        if request.path.rstrip("/") == "/api/v3/channels":
            found = [{"id": c, "name": CHANNEL_NAMES[c], "kind": "email"} for c in CHANNELS]
            return self.json({"channels": found}, 200)
        if request.method == "GET" and not code:
            tags = set(request.args.getlist("tag"))
            slug = request.args.get("slug")
            found = [
                self.to_dict(c, readonly=readonly)
                for c in self.checks.values()
                if tags.issubset(c.tags.split()) and (slug is None or c.slug == slug)
            ]
            return self.json({"checks": found}, 200)
        if request.method == "POST" and not code:
            return self.upsert(body)
        code, _, verb = code.partition("/")
        check = self.checks.get(code)
        if check is None:
            return Response("not found", status=404)
        if request.method == "DELETE":
            del self.checks[code]
            return self.json(self.to_dict(check), 200)
        if verb == "pause" and request.method == "POST":
            check.status, check.last_start = "paused", None
        elif verb == "resume" and request.method == "POST":
            if check.status != "paused":
                return Response("check is not paused", status=409)
            check.status, check.last_start, check.last_ping = "new", None, None
        elif request.method == "POST":
            error = self.validate(body) or self.channel_error(body)
            if error:
                return self.json({"error": error}, 400)
            self.update(check, body)
        return self.json(self.to_dict(check, readonly=readonly), 200)

    def to_dict(self, check: Check, readonly: bool = False) -> dict:
        """The check as the API shows it (`Check.to_dict`, v3)."""
        grace_start = check.grace_start()
        result = {
            "name": check.name,
            "slug": check.slug,
            "tags": check.tags,
            "desc": check.desc,
            "grace": check.grace,
            "n_pings": check.n_pings,
            "status": check.status_at(),
            "started": check.started,
            "last_ping": check.last_ping.isoformat() if check.last_ping else None,
            "next_ping": grace_start.isoformat() if grace_start else None,
            "manual_resume": check.manual_resume,
            "methods": check.methods,
            "start_kw": check.start_kw,
            "success_kw": check.success_kw,
            "failure_kw": check.failure_kw,
            "filter_subject": check.filter_subject,
            "filter_body": check.filter_body,
            "filter_http_body": check.filter_http_body,
            "filter_default_fail": check.filter_default_fail,
        }
        if readonly:
            # sha1 of the first half of the UUID's hex, as the server derives it
            half = uuidlib.UUID(check.uuid).hex[:16]
            result["unique_key"] = hashlib.sha1(half.encode()).hexdigest()
        else:
            update_url = self.server.url_for(f"/api/v3/checks/{check.uuid}")
            result |= {
                "uuid": check.uuid,
                "ping_url": self.server.url_for(f"/{check.uuid}"),
                "update_url": update_url,
                "pause_url": update_url + "/pause",
                "resume_url": update_url + "/resume",
                "channels": ",".join(sorted(check.channels)),
            }
        if check.kind == "simple":
            result["timeout"] = check.timeout
        else:
            result["schedule"], result["tz"] = check.schedule, check.tz
        return result

    @staticmethod
    def channel_error(body: dict) -> str | None:
        """The server's `_update` reading `channels`: `*`, `""`, or known ids or names."""
        value = body.get("channels")
        if value in (None, "*", ""):
            return None
        for item in value.split(","):
            if item == "":
                return "empty channel identifier"
            if item not in CHANNELS and item not in CHANNEL_NAMES.values():
                return f"invalid channel identifier: {item}"
        return None

    def validate(self, body) -> str | None:
        if not isinstance(body, dict):
            return "json validation error: request body is not an object"
        for key, value in body.items():
            if value is None:
                kind = "a number" if key in self.SECONDS_FIELDS else "a string"
                return f"json validation error: {key} is not {kind}"
        for key in self.STR_FIELDS:
            if key in body and not isinstance(body[key], str):
                return f"json validation error: {key} is not a string"
        for key in self.SECONDS_FIELDS:
            if key in body:
                value = body[key]
                if not isinstance(value, int) or isinstance(value, bool):
                    return f"json validation error: {key} is not a number"
                if value < 60:
                    return f"json validation error: {key} is too small"
                if value > MAX_SECONDS:
                    return f"json validation error: {key} is too large"
        for key in self.BOOL_FIELDS:
            if key in body and not isinstance(body[key], bool):
                return f"json validation error: {key} is not a boolean"
        if "name" in body and len(body["name"]) > 100:
            return "json validation error: name is too long"
        if "slug" in body and not re.fullmatch(r"[a-z0-9-_]*", body["slug"]):
            return "json validation error: slug does not match pattern"
        if "methods" in body and body["methods"] not in ("", "POST"):
            return "json validation error: methods has unexpected value"
        if "schedule" in body:
            try:
                if len(body["schedule"].split()) != 5:
                    raise CronSimError("not five fields")
                next(CronSim(body["schedule"], dt.datetime(2000, 1, 1)))
            except (CronSimError, StopIteration):
                return (
                    "json validation error: schedule is not a valid cron or OnCalendar expression"
                )
        if "tz" in body and body["tz"] not in zoneinfo.available_timezones():
            return "json validation error: tz is not a valid timezone"
        if "unique" in body and (
            not isinstance(body["unique"], list)
            or any(u not in ("name", "slug", "tags", "timeout", "grace") for u in body["unique"])
        ):
            return "json validation error: an item in 'unique' has unexpected value"
        return None

    def upsert(self, body):
        error = self.validate(body) or self.channel_error(body)
        if error:
            return self.json({"error": error}, 400)
        existing = None
        if "slug" in body.get("unique", []) and "slug" in body:
            # The first match, as the server's own query does: a duplicate stays untouched.
            existing = next((c for c in self.checks.values() if c.slug == body["slug"]), None)
        if existing is None:
            check = self.add()
            self.update(check, body)
            return self.json(self.to_dict(check), 201)
        self.update(existing, body)
        return self.json(self.to_dict(existing), 200)

    @staticmethod
    def update(check: Check, body: dict) -> None:
        if "channels" in body:
            value = body["channels"]
            names = {name: code for code, name in CHANNEL_NAMES.items()}
            chosen = [names.get(c, c) for c in value.split(",") if c]
            check.channels = list(CHANNELS) if value == "*" else chosen
        if "schedule" in body:
            check.kind, check.schedule = "cron", body["schedule"]
        elif "timeout" in body:
            check.kind, check.timeout = "simple", body["timeout"]
        if "tz" in body:
            check.tz = SERVER_TZ_RENAMES.get(body["tz"], body["tz"])
        for key in (
            "name",
            "slug",
            "tags",
            "desc",
            "grace",
            "methods",
            "manual_resume",
            "filter_http_body",
            "filter_default_fail",
            "start_kw",
            "success_kw",
            "failure_kw",
        ):
            if key in body:
                setattr(check, key, body[key])

    @staticmethod
    def json(document, status):
        return Response(json.dumps(document), status=status, content_type="application/json")
