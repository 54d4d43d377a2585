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
- a check is `new` until its first success or failure ping and a `new` check never goes down
  (`status_at`, `going_down_after`: the server's `Check.get_status` and `going_down_after`);
  a success makes it `up`, due again at the schedule's next fire time after that ping (a simple
  check: `timeout` after it), `grace` later `down`; a `/start` makes it due `grace` after;
- "filter by HTTP body" (`filter_http_body`) decodes the body strictly as UTF-8 (500 when it
  is not), then for *every* ping, whatever its URL says: a failure keyword → failure, else a
  success keyword → success, else a start keyword → start, else a failure with
  `filter_default_fail`, else ignored (the empty `/start` included); keywords are
  comma-separated and matched as substrings;
- `methods="POST"`: HEAD and GET pings are ignored (200, recorded as ignored);
- a paused check with `manual_resume` ignores every ping; without it a success or failure
  resumes it (`up` / `down`), a `/start` opens a run on it (down a grace later without an end)
  and a `/log` changes nothing (`Check.ping`); `manual_resume` must be a boolean (400);
- `hosted=True`: more than 5 pings a minute to one check are dropped: by slug 429, by UUID
  200 `OK (rate limited)` (and a missing UUID 200 `OK (not found)`);
- the API: `X-Api-Key` of exactly 32 characters else 401 `missing api key`, a wrong one 401
  `wrong api key`; `POST /api/v3/checks/` with `unique: ["slug"]` upserts the *first* match
  (201 / 200); `POST /api/v3/checks/<uuid>` updates; `GET ?tag=` lists; `DELETE` removes;
  `POST .../pause` (`paused`, its open run dropped), `.../resume` (409 unless paused; a
  resumed check is `new` again, its last ping forgotten: never down until pinged);
  `GET /api/v3/channels/`; `null` values 400; timeout and grace 60 ... 31,536,000; `tz` renamed
  by the server's own table as observed (`CET` → `Europe/Brussels`; tzdata links such as
  `America/Montreal` kept as written: hcserver_api.SERVER_TZ_RENAMES); `channels`: `*` every
  integration, `""` none, else ids or names (an unknown one 400 `invalid channel identifier:
  X`, an empty one 400 `empty channel identifier`);
- the read-only API key (`read_key`) lists checks and reads one, with `unique_key` instead of
  `uuid` and without `ping_url`, `update_url`, `pause_url`, `resume_url` and `channels`; every
  other call with it (writes, the channel list) answers 401 `wrong api key`.

`delay(kind, seconds)` holds pings of one kind before the server acts on them, as a slow
server does; a client that closes its connection meanwhile is never acted on (what nginx does
when the client goes away before the request reached the application). `hold(kind, seconds)`
holds them and acts on them whatever the client did meanwhile (a proxy that does not abort a
request whose client went away, or a queue in front of the application: the whole request was
in). `slow_answer(kind, seconds)` acts at once and answers late.

Tests inspect `checks`, `check(slug)`, each check's `state` and `exit_status`, and `pings` (in the
order the server acted on them, bodies as stored).
"""

from __future__ import annotations

import datetime as dt
import re
import select
import socket
import threading
import time
import uuid as uuidlib
import zoneinfo
from dataclasses import dataclass, field

from cronsim import CronSim
from werkzeug import Request, Response

from .hcserver_api import API_KEY, CHANNELS, READ_KEY, ManagementAPI

__all__ = ["API_KEY", "CHANNELS", "READ_KEY", "Check", "HealthchecksServer", "Ping"]

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SLUG_RE = re.compile(r"^[a-z0-9_-]+$")
HOSTED_LIMIT_PER_MINUTE = 5


def keyword_in(text: str, keywords: str) -> bool:
    """The server's keyword match: any of the comma-separated keywords, as a substring."""
    return any(k.strip() and k.strip() in text for k in (keywords or "").split(","))


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
    # "filter by HTTP body" (filter_http_body: the keywords below applied to ping bodies;
    # filter_subject and filter_body are the e-mail ones, which pings ignore)
    filter_http_body: bool = False
    filter_subject: bool = False
    filter_body: bool = False
    filter_default_fail: bool = False
    start_kw: str = ""
    success_kw: str = ""
    failure_kw: str = ""
    # live state
    status: str = "new"  # new, up, down, paused (as stored; status_at() is what is shown)
    last_start: dt.datetime | None = None
    last_start_rid: str | None = None
    exit_status: int | None = None
    n_pings: int = 0
    last_ping: dt.datetime | None = None

    @property
    def started(self) -> bool:
        return self.last_start is not None

    def grace_start(self, *, with_started: bool = True) -> dt.datetime | None:
        """The server's `get_grace_start`: when the next ping is due (None: never)."""
        result = None
        if self.status == "up" and self.last_ping is not None:
            if self.kind == "simple":
                result = self.last_ping + dt.timedelta(seconds=self.timeout)
            else:
                local = self.last_ping.astimezone(zoneinfo.ZoneInfo(self.tz))
                result = next(CronSim(self.schedule, local)).astimezone(dt.UTC)
        if with_started and self.last_start is not None and self.status != "down":
            result = self.last_start if result is None else min(result, self.last_start)
        return result

    def going_down_after(self) -> dt.datetime | None:
        """When `sendalerts` flips it down and alerts (None for new, paused and down checks
        that are not running)."""
        start = self.grace_start()
        return None if start is None else start + dt.timedelta(seconds=self.grace)

    def status_at(self, now: dt.datetime | None = None) -> str:
        """The server's `get_status` (API v3: no "started"): up, grace, down, new or paused."""
        now = now or dt.datetime.now(dt.UTC)
        grace = dt.timedelta(seconds=self.grace)
        if self.last_start is not None and now >= self.last_start + grace:
            return "down"
        if self.status in ("new", "paused", "down"):
            return self.status
        start = self.grace_start(with_started=False)
        if start is None or now < start:
            return "up"
        return "down" if now >= start + grace else "grace"

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


class HealthchecksServer(ManagementAPI):
    """One healthchecks project (ping key, API key) behind a pytest-httpserver."""

    def __init__(
        self,
        server,
        *,
        ping_key: str = "",
        api_key: str = API_KEY,
        read_key: str = READ_KEY,
        body_limit: int = 10_000,
        hosted: bool = False,
    ):
        self.server = server
        self.ping_key = ping_key
        self.api_key = api_key
        self.read_key = read_key
        self.body_limit = body_limit
        self.hosted = hosted
        self.checks: dict[str, Check] = {}
        self.pings: list[Ping] = []
        self.api_log: list[tuple[str, str, dict | None]] = []
        self.api_fail_with: tuple[int, dict] | None = None
        self._delays: dict[str, float] = {}
        self._holds: dict[str, float] = {}
        self._holds_until: dict[str, str] = {}
        self._hold_timeout = 30.0
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

    def hold(self, kind: str, seconds: float) -> None:
        """Hold pings of `kind` for `seconds`, then act on them whatever the client did."""
        self._holds[kind] = seconds

    def hold_until(self, kind: str, acted: str, timeout: float = 30.0) -> None:
        """Hold pings of `kind` until the server has acted on a ping of kind `acted` (at most
        `timeout` seconds), then act on them whatever the client did: an order, not a time."""
        self._holds_until[kind] = acted
        self._hold_timeout = timeout

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
        time.sleep(self._holds.get(kind, 0.0))
        if acted := self._holds_until.get(kind):
            deadline = time.monotonic() + self._hold_timeout
            while time.monotonic() < deadline:
                with self._lock:
                    if any(p.kind == acted and p.action == acted for p in self.pings):
                        break
                time.sleep(0.02)
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
        elif check.filter_http_body:
            try:
                # strict, and of the body as cut to the limit (`request.body[:limit]`): the
                # server's own decode fails with 500, a cut inside a character included
                text = stored.decode("utf-8")
            except UnicodeDecodeError:
                return Response("Internal Server Error", status=500)
            # The keywords decide for every kind of ping: the URL's exit status, /start and
            # /log included, counts for nothing once the filter is on.
            if keyword_in(text, check.failure_kw):
                action = "fail"
            elif keyword_in(text, check.success_kw):
                action = "success"
            elif keyword_in(text, check.start_kw):
                action = "start"
            elif check.filter_default_fail:
                action = "fail"
            else:
                action = "ign"
        if check.status == "paused" and check.manual_resume:
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
        """The server's `Check.ping`: a start opens a run (last_ping unchanged), a success or
        failure closes the run of its rid (a failure, or a success without a rid, any run)."""
        check.n_pings += 1
        now = dt.datetime.now(dt.UTC)
        if action in ("log", "ign"):
            return
        if action == "start":
            check.last_start, check.last_start_rid = now, rid
            return
        check.last_ping = now
        if check.last_start is not None and (
            rid == check.last_start_rid or action == "fail" or rid is None
        ):
            check.last_start = None
        check.status = "down" if action == "fail" else "up"
        check.exit_status = exit_status
