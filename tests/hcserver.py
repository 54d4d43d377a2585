"""A healthchecks.io stand-in on 127.0.0.1: pings and the Management API v3, as the server behaves.

It follows ../shared/FACTS.md ("healthchecks.io pinging API", "Management API v3" and
"healthchecks server, as observed"), point by point:

- pings by UUID (`/<uuid>[/start|/fail|/log|/<0-255>]`) and by slug (`/<ping key>/<slug>[...]`);
  a missing slug or a wrong ping key answers 404 `not found`; `?create=1` creates a *simple*
  check (1 day, grace 1 h, no tags, every channel) and answers 201 `Created`; two checks with
  one slug answer 409 `ambiguous slug`; an uppercase slug 400;
- every ping answer carries `Ping-Body-Limit`; the stored body is the first `body_limit` bytes;
- `/fail` stores no exit status, `/<code>` stores it, a plain success stores none;
- `rid` pairing: a start opens a run, the success with the same rid closes it, a success with
  another rid leaves it open, a failure closes it; a `/start` that arrives after its success
  leaves the check "started";
- "filter by HTTP body" checks decode the body strictly as UTF-8 (500 when it is not), ignore
  an empty-body `/start`, and pick success / failure by keyword;
- `methods="POST"`: HEAD and GET pings are ignored (200, recorded as ignored);
- `hosted=True`: more than 5 pings a minute to one check are dropped: by slug 429, by UUID
  200 `OK (rate limited)` (and a missing UUID 200 `OK (not found)`);
- the API: `X-Api-Key` of exactly 32 characters else 401 `missing api key`, a wrong one 401
  `wrong api key`; `POST /api/v3/checks/` with `unique: ["slug"]` upserts the *first* match
  (201 / 200); `POST /api/v3/checks/<uuid>` updates; `GET ?tag=` lists; `DELETE` removes;
  `null` values 400; timeout and grace 60 ... 31,536,000; `tz` stored under its current tzdata
  name (the links of tzdata's `backward` file, read from tzdata.zi, not typed in here).

`delay(kind, seconds)` holds pings of one kind before the server acts on them, as a slow
server does; a client that closes its connection meanwhile is never acted on (what nginx does
when the client goes away before the request reached the application). `slow_answer(kind,
seconds)` acts at once and answers late.

Tests inspect `checks`, `check(slug)`, each check's `state` and `exit_status`, and `pings` (in the
order the server acted on them, bodies as stored).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import select
import socket
import threading
import time
import uuid as uuidlib
import zoneinfo
from dataclasses import dataclass, field
from pathlib import Path

from cronsim import CronSim, CronSimError
from werkzeug import Request, Response

API_KEY = "hcw_" + "k3y" * 9 + "a"  # 32 characters, like a real key
CHANNELS = ["4f1e8c0a-0000-4000-8000-00000000000a", "4f1e8c0a-0000-4000-8000-00000000000b"]
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SLUG_RE = re.compile(r"^[a-z0-9_-]+$")
MAX_SECONDS = 31_536_000
HOSTED_LIMIT_PER_MINUTE = 5


def _tzdata_zi() -> Path:
    for directory in zoneinfo.TZPATH:
        if (Path(directory) / "tzdata.zi").is_file():
            return Path(directory) / "tzdata.zi"
    import importlib.resources

    return Path(str(importlib.resources.files("tzdata.zoneinfo") / "tzdata.zi"))


def legacy_zone_names() -> dict[str, str]:
    """{legacy name: current name} from tzdata's links (`L TARGET LINK` in tzdata.zi).

    The UTC and GMT aliases (`UTC`, `Etc/Universal`, `GMT` ...) link into Etc/: the server keeps
    those as written, so they are left out."""
    links = {}
    for line in _tzdata_zi().read_text().splitlines():
        if line.startswith("L "):
            _, target, name = line.split()
            if not target.startswith("Etc/"):
                links[name] = target
    return links


LEGACY_TZ = legacy_zone_names()


@dataclass
class Check:
    uuid: str
    name: str = ""
    slug: str = ""
    tags: str = ""
    desc: str = ""
    kind: str = "simple"
    timeout: int = 86400
    grace: int = 3600
    schedule: str = "* * * * *"
    tz: str = "UTC"
    channels: list[str] = field(default_factory=list)
    methods: str = ""
    manual_resume: bool = False
    # "filter by HTTP body" (filter_http_body, success_kw, failure_kw)
    filter_body: bool = False
    success_kw: str = ""
    failure_kw: str = ""
    # live state
    status: str = "new"  # new, up, down
    last_start_rid: str | None = None
    started: bool = False
    exit_status: int | None = None
    n_pings: int = 0
    last_ping: dt.datetime | None = None

    # The API tests read checks like the JSON they were: check["tz"].
    def __getitem__(self, key: str):
        return getattr(self, key)

    def __setitem__(self, key: str, value) -> None:
        setattr(self, key, value)

    @property
    def state(self) -> str:
        """What the web UI shows: "started" while a run is open, else the status."""
        return "started" if self.started else self.status


@dataclass
class Ping:
    kind: str  # start, success, fail, log, or the exit status as text
    action: str  # what the server did: start, success, fail, log, ign, aborted, limited
    method: str
    check: str | None  # uuid
    slug: str
    rid: str | None
    exit_status: int | None
    body: bytes
    status: int  # the HTTP status answered


class HealthchecksServer:
    """One healthchecks project (ping key, API key) behind a pytest-httpserver."""

    def __init__(
        self,
        server,
        *,
        ping_key: str = "",
        api_key: str = API_KEY,
        body_limit: int = 10_000,
        hosted: bool = False,
    ):
        self.server = server
        self.ping_key = ping_key
        self.api_key = api_key
        self.body_limit = body_limit
        self.hosted = hosted
        self.checks: dict[str, Check] = {}
        self.pings: list[Ping] = []
        self.api_log: list[tuple[str, str, dict | None]] = []
        self.api_fail_with: tuple[int, dict] | None = None
        self._delays: dict[str, float] = {}
        self._slow_answers: dict[str, float] = {}
        self._recent: dict[str, list[float]] = {}
        self._lock = threading.RLock()
        server.expect_request(re.compile(r"^/")).respond_with_handler(self.handle)

    # --- for tests ------------------------------------------------------------------------

    @property
    def ping_url(self) -> str:
        return self.server.url_for("/")

    @property
    def api_url(self) -> str:
        return self.server.url_for("/api/v3/")

    url = api_url  # the old FakeHealthchecks' name

    def add(self, **fields) -> Check:
        check = Check(uuid=fields.pop("uuid", None) or str(uuidlib.uuid4()))
        if "slug" in fields and "name" not in fields:
            check.name = fields["slug"]
        for key, value in fields.items():
            setattr(check, key, value)
        with self._lock:
            self.checks[check.uuid] = check
        return check

    def check(self, slug: str) -> Check:
        [found] = [c for c in self.checks.values() if c.slug == slug]
        return found

    by_slug = check

    def copy(self, check: Check) -> Check:
        """The web UI's "Create a Copy": tags, desc, schedule and the rest kept, a new UUID."""
        return self.add(
            slug=f"{check.slug}-copy",
            name=f"{check.name} (copy)",
            **{
                k: getattr(check, k)
                for k in ("tags", "desc", "kind", "timeout", "grace", "schedule", "tz", "methods")
            },
            channels=list(check.channels),
        )

    def delay(self, kind: str, seconds: float) -> None:
        """Hold pings of `kind` (start, success, fail, log, or an exit status) for `seconds`."""
        self._delays[kind] = seconds

    def slow_answer(self, kind: str, seconds: float) -> None:
        """Act on pings of `kind` at once but answer them `seconds` later."""
        self._slow_answers[kind] = seconds

    def pings_of(self, slug: str) -> list[Ping]:
        return [p for p in self.pings if p.slug == slug]

    def writes(self):
        return [(m, p, b) for m, p, b in self.api_log if m != "GET"]

    # --- dispatch -------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        if request.path.startswith("/api/v3/"):
            with self._lock:
                return self.api(request)
        return self.ping(request)

    # --- pings ----------------------------------------------------------------------------

    def _answer(self, text: str, status: int = 200) -> Response:
        return Response(text, status=status, headers={"Ping-Body-Limit": str(self.body_limit)})

    def ping(self, request: Request) -> Response:
        parts = request.path.strip("/").split("/")
        by_uuid = bool(UUID_RE.match(parts[0]))
        rest = parts[1:] if by_uuid else parts[2:]
        if not by_uuid and len(parts) < 2:
            return self._answer("not found", 404)
        if len(rest) > 1:
            return self._answer("not found", 404)
        kind = rest[0] if rest else "success"
        if kind not in ("success", "start", "fail", "log") and not (
            kind.isdigit() and 0 <= int(kind) <= 255
        ):
            return self._answer("not found", 404)
        request.get_data()  # read now: only a closed connection is left to see while held
        delay = self._delays.get(kind, 0.0)
        if delay and not self._wait_unless_abandoned(request, delay):
            with self._lock:
                self.pings.append(
                    Ping(kind, "aborted", request.method, None, "", None, None, b"", 499)
                )
            return self._answer("client went away", 499)
        with self._lock:
            response = self._ping(request, parts, by_uuid, kind)
        time.sleep(self._slow_answers.get(kind, 0.0))
        return response

    @staticmethod
    def _wait_unless_abandoned(request: Request, seconds: float) -> bool:
        """Wait `seconds`; False as soon as the client closes its connection."""
        sock = request.environ.get("werkzeug.socket")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if sock is None:
                time.sleep(left)
                break
            readable, _, _ = select.select([sock], [], [], min(left, 0.05))
            if readable:
                try:
                    if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        return False
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    return False
                time.sleep(min(left, 0.05))  # readable but not closed: keep waiting
        return True

    def _ping(self, request: Request, parts: list[str], by_uuid: bool, kind: str) -> Response:
        body = request.get_data()
        rid = request.args.get("rid")
        if by_uuid:
            check = self.checks.get(parts[0])
            slug = check.slug if check else ""
            if check is None:
                if self.hosted:
                    return self._answer("OK (not found)")
                return self._answer("not found", 404)
        else:
            key, slug = parts[0], parts[1]
            if not SLUG_RE.match(slug):
                return self._answer("invalid slug", 400)
            if key != self.ping_key:
                return self._answer("not found", 404)
            matches = [c for c in self.checks.values() if c.slug == slug]
            if len(matches) > 1:
                return self._answer("ambiguous slug", 409)
            created = False
            if not matches:
                if request.args.get("create") != "1":
                    return self._answer("not found", 404)
                check = self.add(slug=slug, name=slug, channels=list(CHANNELS))
                created = True
            else:
                check = matches[0]
        if self.hosted and self._limited(check.uuid):
            self.pings.append(
                Ping(kind, "limited", request.method, check.uuid, slug, rid, None, b"", 0)
            )
            if by_uuid:
                self.pings[-1].status = 200
                return self._answer("OK (rate limited)")
            self.pings[-1].status = 429
            return self._answer("rate limited", 429)
        stored = body[: self.body_limit]
        action = {"success": "success", "start": "start", "fail": "fail", "log": "log"}.get(kind)
        exit_status = None
        if action is None:
            exit_status = int(kind)
            action = "success" if exit_status == 0 else "fail"
        if check.methods == "POST" and request.method != "POST":
            action = "ign"
        elif check.filter_body:
            try:
                # strict, and of the body as cut to the limit (`request.body[:limit]`): the
                # server's own decode fails with 500, a cut inside a character included
                text = stored.decode("utf-8")
            except UnicodeDecodeError:
                return Response("Internal Server Error", status=500)
            if action == "start" and not stored:
                action = "ign"
            elif action == "success" and kind == "success":
                if check.failure_kw and check.failure_kw in text:
                    action = "fail"
                elif check.success_kw and check.success_kw in text:
                    action = "success"
                else:
                    action = "ign"
        status = 201 if not by_uuid and created else 200
        self.pings.append(
            Ping(kind, action, request.method, check.uuid, slug, rid, exit_status, stored, status)
        )
        self._apply(check, action, rid, exit_status)
        return self._answer("Created" if status == 201 else "OK", status)

    def _limited(self, check_uuid: str) -> bool:
        now = time.monotonic()
        recent = [t for t in self._recent.get(check_uuid, []) if now - t < 60]
        limited = len(recent) >= HOSTED_LIMIT_PER_MINUTE
        if not limited:
            recent.append(now)
        self._recent[check_uuid] = recent
        return limited

    @staticmethod
    def _apply(check: Check, action: str, rid: str | None, exit_status: int | None) -> None:
        if action in ("log", "ign"):
            return
        check.n_pings += 1
        check.last_ping = dt.datetime.now(dt.UTC)
        if action == "start":
            check.started, check.last_start_rid = True, rid
            return
        if action == "success":
            if check.started and (rid is None or rid == check.last_start_rid):
                check.started = False
            check.status = "up"
        else:  # fail: closes any open run
            check.started = False
            check.status = "down"
        check.exit_status = exit_status

    # --- the Management API v3 ------------------------------------------------------------

    STR_FIELDS = ("name", "slug", "tags", "desc", "schedule", "tz", "channels", "methods")
    SECONDS_FIELDS = ("grace", "timeout")

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
        if key != self.api_key:
            return self.json({"error": "wrong api key"}, 401)
        if self.api_fail_with is not None:
            status, document = self.api_fail_with
            return self.json(document, status)
        code = request.path.removeprefix("/api/v3/checks/").strip("/")
        if request.method == "GET" and not code:
            tags = set(request.args.getlist("tag"))
            slug = request.args.get("slug")
            found = [
                self.to_dict(c)
                for c in self.checks.values()
                if tags.issubset(c.tags.split()) and (slug is None or c.slug == slug)
            ]
            return self.json({"checks": found}, 200)
        if request.method == "POST" and not code:
            return self.upsert(body)
        check = self.checks.get(code)
        if check is None:
            return Response("not found", status=404)
        if request.method == "DELETE":
            del self.checks[code]
            return self.json(self.to_dict(check), 200)
        if request.method == "POST":
            error = self.validate(body)
            if error:
                return self.json({"error": error}, 400)
            self.update(check, body)
        return self.json(self.to_dict(check), 200)

    def to_dict(self, check: Check) -> dict:
        update_url = self.server.url_for(f"/api/v3/checks/{check.uuid}")
        result = {
            "name": check.name,
            "slug": check.slug,
            "tags": check.tags,
            "desc": check.desc,
            "grace": check.grace,
            "n_pings": check.n_pings,
            "status": check.status,
            "started": check.started,
            "last_ping": check.last_ping.isoformat() if check.last_ping else None,
            "next_ping": None,
            "manual_resume": check.manual_resume,
            "methods": check.methods,
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
        error = self.validate(body)
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
            check.channels = list(CHANNELS) if value == "*" else [c for c in value.split(",") if c]
        if "schedule" in body:
            check.kind, check.schedule = "cron", body["schedule"]
        elif "timeout" in body:
            check.kind, check.timeout = "simple", body["timeout"]
        if "tz" in body:
            check.tz = LEGACY_TZ.get(body["tz"], body["tz"])
        for key in ("name", "slug", "tags", "desc", "grace", "methods", "manual_resume"):
            if key in body:
                setattr(check, key, body[key])

    @staticmethod
    def json(document, status):
        return Response(json.dumps(document), status=status, content_type="application/json")
