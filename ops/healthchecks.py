"""healthchecks.io pings: start in the background, a final ping within a bounded budget.

Monitoring never blocks or fails a job: every request has a timeout, retries stop at a deadline,
and nothing here raises. URLs carry the project's ping key, so they are never printed: messages
name the job and the kind of ping only.
"""

import http.client
import logging
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass

log = logging.getLogger("ops.healthchecks")

RETRY_STATUSES = {408, 429, 500, 502, 503, 504}
ATTEMPTS = 3
BACKOFF = (1.0, 2.0)
ATTEMPT_TIMEOUT = 5.0
DEFAULT_BODY_LIMIT = 10_000  # self-hosted default; the server's own header wins
MARGIN = 0.05  # seconds kept back from the ping budget


@dataclass(frozen=True)
class PingConfig:
    base_url: str
    ping_key: str = ""
    auto_create: bool = False
    budget: float = 10.0

    @classmethod
    def from_settings(cls):
        from django.conf import settings

        return cls(
            base_url=settings.HEALTHCHECKS_PING_URL,
            ping_key=settings.HEALTHCHECKS_PING_KEY,
            auto_create=settings.HEALTHCHECKS_AUTO_CREATE,
            budget=settings.OPS_PING_BUDGET_SECONDS,
        )


def check_url(config: PingConfig, job: str, override: str | None = None) -> tuple[str, str]:
    """(url, query) for a job's check; url is "" when pings are not configured."""
    base = config.base_url if config.base_url.endswith("/") else config.base_url + "/"
    if override:
        if override.startswith(("http://", "https://")):
            return override.rstrip("/"), ""
        return base + override, ""
    if not config.ping_key:
        return "", ""
    return f"{base}{config.ping_key}/{job}", "create=1" if config.auto_create else ""


class Pinger:
    """The pings of one run (one `rid`)."""

    def __init__(
        self, config: PingConfig, job: str, override: str | None = None, enabled: bool = True
    ):
        self.config = config
        self.job = job
        self.url, self.query = check_url(config, job, override) if enabled else ("", "")
        self.rid = str(uuid.uuid4())
        self.body_limit: int | None = None
        self._start_thread: threading.Thread | None = None
        self._finishing = threading.Event()  # a /start retried after the end would reopen it

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def start(self) -> None:
        """Send /start in a daemon thread: the job never waits for it."""
        if not self.enabled:
            return
        deadline = time.monotonic() + self.config.budget
        self._start_thread = threading.Thread(
            target=self._send,
            args=("start", "/start", b"", deadline),
            daemon=True,
            name="cronops-start-ping",
        )
        self._start_thread.start()

    def finish(
        self, exit_code: int | None, body: bytes, *, kind: str | None = None, head: bytes = b""
    ) -> bool:
        """The final ping: success (0), /<exit code>, or /fail (kind="fail").

        The body is `head` (the runner's own note) followed by the end of `body` (the output
        tail), cut to the server's limit: the note must survive the cut, the output's start
        need not."""
        if not self.enabled:
            return False
        deadline = time.monotonic() + self.config.budget
        if self._start_thread is not None:
            # Keep order (start before the end) but leave half the budget to the final ping;
            # a start still retrying after that gives up.
            self._start_thread.join(max(0.0, self.config.budget / 2))
            self._finishing.set()
        if kind == "fail":
            suffix = "/fail"
        else:
            suffix = "" if exit_code == 0 else f"/{exit_code}"
        return self._send(
            kind or ("success" if exit_code == 0 else "failure"),
            suffix,
            self._cut(head, body),
            deadline,
        )

    def log(self, message: str) -> bool:
        if not self.enabled:
            return False
        deadline = time.monotonic() + self.config.budget
        return self._send("log", "/log", message.encode(), deadline)

    def _cut(self, head: bytes, body: bytes) -> bytes:
        limit = self.body_limit or DEFAULT_BODY_LIMIT
        head = head[:limit]
        room = limit - len(head)
        return head + (body[-room:] if room and len(body) > room else body if room else b"")

    def _send(self, kind: str, suffix: str, body: bytes, deadline: float) -> bool:
        query = f"rid={self.rid}" + (f"&{self.query}" if self.query else "")
        url = f"{self.url}{suffix}?{query}"
        reason = ""
        for attempt in range(ATTEMPTS):
            if kind == "start" and self._finishing.is_set():
                return False
            # The budget is a bound, not a target: keep a margin for the connection's setup
            # and teardown, so a server that never answers costs at most the budget.
            remaining = deadline - time.monotonic() - MARGIN
            if remaining <= MARGIN:
                break
            try:
                status, headers, text = post(url, body, timeout=min(ATTEMPT_TIMEOUT, remaining))
            except (OSError, ValueError, http.client.HTTPException) as exc:
                # Exception texts may carry the URL, and so the key: name the class only.
                reason = type(exc).__name__
            else:
                limit = headers.get("Ping-Body-Limit", "")
                if limit.isdigit():
                    self.body_limit = int(limit)
                if status in (200, 201):
                    if text not in ("OK", "Created"):
                        log.warning("job %s: %s ping answered %r", self.job, kind, text)
                    return True
                reason = f"HTTP {status}"
                if status not in RETRY_STATUSES:
                    break
            if attempt < len(BACKOFF):
                time.sleep(max(0.0, min(BACKOFF[attempt], deadline - time.monotonic() - MARGIN)))
        log.warning(
            "job %s: %s ping failed (%s); the job's outcome is unchanged",
            self.job,
            kind,
            reason or "no time left in the ping budget",
        )
        return False


def post(url: str, body: bytes, timeout: float) -> tuple[int, http.client.HTTPMessage, str]:
    """One POST; (status, headers, first 60 characters of the body).

    The standard library's http.client rather than requests: pings run on every cron run, and
    importing requests cost 67 ms of a 456 ms Django start-up (bench/RESULTS.md, P1).
    """
    parts = urllib.parse.urlsplit(url)
    conn_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_class(parts.hostname, parts.port, timeout=timeout)
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request(
            "POST",
            path,
            body=body,
            headers={"User-Agent": "cronops", "Content-Type": "text/plain; charset=utf-8"},
        )
        response = conn.getresponse()
        text = response.read(200).decode("utf-8", "replace").strip()[:60]
        return response.status, response.headers, text
    finally:
        conn.close()
