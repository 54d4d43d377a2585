"""A Sentry ingest endpoint on 127.0.0.1 (pytest-httpserver) that records check-in envelopes.

Each envelope is read by Sentry's own SDK (`sentry_sdk.envelope.Envelope.deserialize`: the
framing, the item's type) and each check-in held to the rules Sentry applies to it. Neither
`sentry-relay` (Relay's Python bindings: no check-in function) nor `sentry-kafka-schemas` (its
`ingest-monitors` schema wraps the check-in as opaque bytes) can validate one, so the rules are
those of Relay's check-in struct (relay-monitors: `CheckIn`, `MonitorConfig`, a payload that
does not fit is dropped after a 200) and of Sentry's validator (src/sentry/monitors/
validators.py, constants.py: slug at most 50, margin at least 1 minute, runtime 1-40320 minutes,
a zone name it knows, a crontab cronsim reads, thresholds 1-720), transcribed here with their
sources in docs/sentry.md. A check-in that breaks one fails the test that sent it.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
import zoneinfo

from cronsim import CronSim
from werkzeug import Request, Response

PROJECT = 42
KEY = "0123456789abcdef0123456789abcdef"  # a DSN's public key, as Sentry shows one
STATUSES = {"in_progress", "ok", "error"}
CHECK_IN_FIELDS = {
    "check_in_id", "monitor_slug", "status", "environment", "duration", "monitor_config",
    "contexts",
}  # fmt: skip
CONFIG_FIELDS = {
    "schedule", "checkin_margin", "max_runtime", "timezone", "failure_issue_threshold",
    "recovery_threshold", "owner",
}  # fmt: skip


def invalid(check_in: dict) -> str:
    """Why Relay or Sentry would drop or refuse `check_in` ("" when they take it)."""
    unknown = set(check_in) - CHECK_IN_FIELDS
    if unknown:
        return f"fields Relay does not know: {sorted(unknown)}"
    try:
        uuid.UUID(str(check_in.get("check_in_id")))
    except ValueError:
        return "check_in_id is not a UUID"
    slug = check_in.get("monitor_slug")
    if not isinstance(slug, str) or not re.fullmatch(r"[a-z0-9_-]{1,50}", slug):
        return f"monitor_slug {slug!r} is not a slug of at most 50 characters"
    if check_in.get("status") not in STATUSES:
        return f"status {check_in.get('status')!r}"
    if "duration" in check_in:
        duration = check_in["duration"]
        if not isinstance(duration, int | float) or duration < 0:
            return f"duration {duration!r}"
        if check_in["status"] == "in_progress":
            return "a duration on in_progress"
    environment = check_in.get("environment", "")
    if (
        not isinstance(environment, str)
        or len(environment) > 64
        or re.search(r"[/\n\r\f]", environment)
    ):
        return f"environment {environment!r}"
    config = check_in.get("monitor_config")
    if config is not None:
        return invalid_config(config)
    return ""


def invalid_config(config: dict) -> str:
    unknown = set(config) - CONFIG_FIELDS
    if unknown:
        return f"monitor_config fields Sentry does not know: {sorted(unknown)}"
    schedule = config.get("schedule")
    if not isinstance(schedule, dict) or schedule.get("type") != "crontab":
        return f"schedule {schedule!r}"
    value = schedule.get("value")
    if not isinstance(value, str) or len(value.split()) != 5:
        return f"crontab {value!r} is not five fields"
    try:
        CronSim(value, __import__("datetime").datetime(2026, 1, 1))
    except Exception as exc:  # cronsim's own errors: what Sentry's validator refuses
        return f"crontab {value!r}: {exc}"
    margin, runtime = config.get("checkin_margin"), config.get("max_runtime")
    if not isinstance(margin, int) or isinstance(margin, bool) or not 1 <= margin <= 40320:
        return f"checkin_margin {margin!r} (whole minutes, 1-40320)"
    if not isinstance(runtime, int) or isinstance(runtime, bool) or not 1 <= runtime <= 40320:
        return f"max_runtime {runtime!r} (whole minutes, 1-40320)"
    if config.get("timezone") not in zoneinfo.available_timezones():
        return f"timezone {config.get('timezone')!r}"
    for name in ("failure_issue_threshold", "recovery_threshold"):
        if name in config and not (isinstance(config[name], int) and 1 <= config[name] <= 720):
            return f"{name} {config[name]!r}"
    return ""


class SentryRecorder:
    """The ingest endpoint. `mode`: "ok" (200, as Relay), "429", "500" (retryable), "hold"
    (accepts the connection and never answers: a black hole), or "slow start" (answers an
    in_progress `delay` seconds late)."""

    def __init__(self, httpserver, project: int = PROJECT, key: str = KEY):
        self.project, self.key = project, key
        self.mode = "ok"
        self.delay = 2.0
        self.check_ins: list[dict] = []  # in arrival order
        self.events: list[dict] = []  # the other items: a project's own error events
        self.requests: list[tuple[dict, bytes]] = []  # (headers, raw body)
        self.problems: list[str] = []
        self.release = threading.Event()  # ends a "hold"
        self.lock = threading.Lock()
        self.server = httpserver
        httpserver.expect_request(f"/api/{project}/envelope/", method="POST").respond_with_handler(
            self.handle
        )

    @property
    def dsn(self) -> str:
        return f"http://{self.key}@127.0.0.1:{self.server.port}/{self.project}"

    def handle(self, request: Request) -> Response:
        from sentry_sdk.envelope import Envelope

        body = request.get_data()
        if request.headers.get("Content-Encoding") == "gzip":
            import gzip

            body = gzip.decompress(body)
        with self.lock:
            self.requests.append((dict(request.headers), body))
        if self.mode == "hold":
            self.release.wait(60)
            return Response("", status=504)
        if self.mode == "slow start" and b'"in_progress"' in body:
            time.sleep(self.delay)  # the in_progress is answered late; the run's end is not
        auth = request.headers.get("X-Sentry-Auth", "")
        if f"sentry_key={self.key}" not in auth or "sentry_version=7" not in auth:
            self.problems.append(f"auth header {auth!r}")
            return Response('{"detail":"bad auth"}', status=401)
        envelope = Envelope.deserialize(body)
        for item in envelope.items:
            payload = json.loads(item.payload.get_bytes())
            with self.lock:
                if item.type == "check_in":
                    why = invalid(payload)
                    if why:
                        self.problems.append(why)
                    self.check_ins.append(payload)
                else:
                    self.events.append({"type": item.type, **(payload or {})})
        if self.mode == "429":
            return Response("", status=429, headers={"Retry-After": "60"})
        if self.mode == "500":
            return Response("", status=500)
        return Response(json.dumps({"id": uuid.uuid4().hex}), content_type="application/json")

    def statuses(self) -> list[tuple[str, str]]:
        """[(check-in id, status)] in arrival order."""
        return [(c["check_in_id"], c["status"]) for c in self.check_ins]
