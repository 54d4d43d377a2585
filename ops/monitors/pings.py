"""healthchecks.io pings: start in the background, a final ping within a bounded budget.

Monitoring never blocks or fails a job: every request has a timeout, the final ping (name
resolution included) ends by its deadline, and nothing here raises. URLs carry the project's
ping key, so they are never printed: messages name the job, the check's slug and the kind of
ping only.

Order within a run: the server pairs a `/start` with its final ping by `rid`, in the order it
acts on them, and a start acted on after the success leaves the check "started" (down one
grace later). So a start is never sent once the final ping is going out, and a start that was
sent is never given up while the job runs (a request an intermediary holds can be delivered
after its client went away: given up early, it would be delivered late) nor sent twice.
When the job ends with its start unanswered, the final ping waits for it (half the budget at
most), then abandons it: its connection is half-closed, so an intermediary that drops requests
whose client went away drops it. One that delivers it anyway answers it, late: the final ping
is then sent again (same rid, within the budget), which closes the run the start reopened.
"""

import contextlib
import http.client
import ipaddress
import logging
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator

from ..run.output import truncation_notice, utf8_end, utf8_start
from .monitors import PingConfig

log = logging.getLogger("ops.healthchecks")

# 429 is not retried: the hosted service limits a check to 5 pings a minute, and a retry a
# second later only counts against that limit again.
RETRY_STATUSES = {408, 500, 502, 503, 504}
ATTEMPTS = 3
BACKOFF = (1.0, 2.0)
ATTEMPT_TIMEOUT = 5.0
DEFAULT_BODY_LIMIT = 10_000  # self-hosted default; the server's own header wins
MARGIN = 0.05  # seconds kept back from the ping budget


class ResolveTimeout(TimeoutError):
    """The name lookup did not end within the ping's budget."""


class Cancelled(Exception):
    """A start ping given up because the run's final ping is going out."""


class Unanswered(Exception):
    """The request went out, and no answer came (timeout, connection lost): unlike a request
    never sent, the server may have it, or get it later."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check_url(config: PingConfig, job: str, override: str | None = None) -> tuple[str, str]:
    """(url without its query, query) for a job's check; url is "" when pings are off.

    An override URL may carry a query (`...?create=1`): it is kept apart, so that `/start` or
    `/<code>` go into the path and `rid` joins that query."""
    base = config.base_url if config.base_url.endswith("/") else config.base_url + "/"
    if override:
        if override.startswith(("http://", "https://")):
            parts = urllib.parse.urlsplit(override)
            url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
            return url.rstrip("/"), parts.query
        return base + override, ""
    if not config.ping_key:
        return "", ""
    return f"{base}{config.ping_key}/{job}", "create=1" if config.auto_create else ""


def with_rid(query: str, rid: str) -> str:
    """`query` with `rid` set (an existing rid is replaced, the other parameters kept)."""
    pairs = [(k, v) for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if k != "rid"]
    return urllib.parse.urlencode([("rid", rid), *pairs])


def cut_body(
    head: bytes, body: bytes, limit: int, *, written: int | None = None, cut: bool = False
) -> bytes:
    """`head`, then as much of the end of `body` as fits in `limit` bytes, cut on UTF-8
    character boundaries (a body starting inside a character is refused by servers that
    decode it strictly). `body` is output as text; `written`: how many bytes the job wrote;
    `cut`: its start was left out already. Output cut here or before is headed by a notice,
    after `head`."""
    head = utf8_end(head[:limit])
    room = limit - len(head)
    if room <= 0:
        return head
    if not cut and len(body) <= room:
        return head + body
    notice = truncation_notice(len(body) if written is None else written).encode()
    keep = room - len(notice)
    if keep <= 0:
        return head + utf8_start(body[-room:])
    return head + notice + utf8_start(body[-keep:])


def ascii_safe(body: bytes) -> bytes:
    """`body` with its non-ASCII characters written as escapes (`é` → `\\xe9`)."""
    return body.decode("utf-8", "replace").encode("ascii", "backslashreplace")


class Pinger:
    """The pings of one run (one `rid`)."""

    def __init__(
        self,
        config: PingConfig,
        job: str,
        override: str | None = None,
        enabled: bool = True,
        rid: str | None = None,
    ):
        self.config = config
        self.job = job
        self.by_slug = not override
        self.url, self.query = check_url(config, job, override) if enabled else ("", "")
        self.rid = rid or str(uuid.uuid4())
        self.body_limit: int | None = None
        self._start_thread: threading.Thread | None = None
        self._gate = threading.Lock()  # held while a start is being sent
        self._finishing = False  # no start is sent from now on
        self._final_out = False  # the final ping is going out
        self._start_late = False  # the start was answered after the final ping went out
        self._start_sock: socket.socket | None = None  # a start sent and not answered yet
        self._problems: list[tuple[str, str]] = []  # (kind of ping, why), reported once

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def start(self) -> None:
        """Send /start in a daemon thread: the job never waits for it. Once per run: a retried
        attempt (--retries) sends none of its own."""
        if not self.enabled or self._start_thread is not None:
            return
        deadline = time.monotonic() + self.config.budget
        thread = threading.Thread(
            target=self._send,
            args=("start", "/start", b"", deadline),
            daemon=True,
            name="cronops-start-ping",
        )
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had (a process limit): no /start
            self._problems.append(("start", str(exc)))
            return
        self._start_thread = thread

    def finish(
        self,
        exit_code: int | None,
        body: bytes,
        *,
        kind: str | None = None,
        head: bytes = b"",
        written: int | None = None,
        cut: bool = False,
        deadline: float | None = None,
    ) -> bool:
        """The final ping: success (0), /<exit code>, /fail (kind="fail") or /log (kind="log":
        neither success nor failure), by `deadline` (default: the ping budget from now).

        The body is `head` (the runner's own note) followed by the end of `body` (the output
        tail), cut to the server's limit: the note must survive the cut, the output's start
        need not. `written` and `cut` as for `cut_body`."""
        if not self.enabled:
            return False
        deadline = deadline or time.monotonic() + self.config.budget
        self._end_start((deadline - time.monotonic()) / 2)
        if kind in ("fail", "log"):
            suffix = f"/{kind}"
        else:
            suffix = "" if exit_code == 0 else f"/{exit_code}"
        payload = cut_body(
            head, body, self.body_limit or DEFAULT_BODY_LIMIT, written=written, cut=cut
        )

        def escaped() -> bytes:
            # Escaped as a whole and cut again: the end of the output stays, not its start.
            safe_head, safe_body = ascii_safe(head), ascii_safe(body)
            return cut_body(safe_head, safe_body, len(payload), written=written, cut=cut)

        name = kind or ("success" if exit_code == 0 else "failure")
        with self._gate:
            self._final_out = True
        ok = self._send(name, suffix, payload, deadline, escaped)
        if ok and kind != "log" and self._start_landed_late(deadline):
            # The server acted on the start after the final ping: the run it reopened goes
            # down one grace later unless the same final ping closes it again.
            ok = self._send(name, suffix, payload, deadline, escaped)
        self._wake_start()
        self._report()
        return ok

    def arm(self, body: bytes) -> str:
        """One success ping that is not a run (sync_healthchecks arming a new check): "" when
        the server took it, else why not, in a few words."""
        if not self.enabled:
            return "no ping URL"
        ok = self._send("arming", "", body, time.monotonic() + self.config.budget)
        problems, self._problems = self._problems, []
        return "" if ok and not problems else "; ".join(why for _, why in problems)

    def log(self, message: str, deadline: float | None = None) -> bool:
        if not self.enabled:
            return False
        deadline = deadline or time.monotonic() + self.config.budget
        body = cut_body(b"", message.encode(), self.body_limit or DEFAULT_BODY_LIMIT)
        ok = self._send("log", "/log", body, deadline)
        self._report()
        return ok

    def _end_start(self, wait: float) -> None:
        """Wait up to `wait` seconds for the start ping, then send no more of it and abandon
        one still unanswered."""
        if self._start_thread is None:
            return
        self._start_thread.join(max(0.0, wait))
        with self._gate:  # a start being written finishes writing; none begins after this
            self._finishing = True
            # Tells a server or intermediary still holding the request that its client went
            # away; the read side stays open, for an answer that comes anyway.
            self._shut_start(socket.SHUT_WR)

    def _start_landed_late(self, deadline: float) -> bool:
        """After the final ping: wait (until `deadline`) for a start abandoned unanswered;
        True when the server answered it after the final ping went out."""
        with self._gate:
            waiting = self._start_sock is not None
        if waiting and self._start_thread is not None:
            self._start_thread.join(max(0.0, deadline - time.monotonic() - MARGIN))
        with self._gate:
            return self._start_late

    def _wake_start(self) -> None:
        """End a start's wait for its answer: the run's pings are done."""
        with self._gate:
            self._shut_start(socket.SHUT_RDWR)

    def _shut_start(self, how: int) -> None:
        """Shut the unanswered start's connection (`how`); with the gate held, so that the
        start thread cannot close it meanwhile (its descriptor could be another's by then).
        The plain socket's shutdown, also under TLS: SSLSocket's drops its TLS state, and an
        answer that still comes could not be read."""
        if self._start_sock is not None:
            try:
                socket.socket.shutdown(self._start_sock, how)
            except OSError:
                pass

    def _send(
        self,
        kind: str,
        suffix: str,
        body: bytes,
        deadline: float,
        escaped: Callable[[], bytes] | None = None,
    ) -> bool:
        url = f"{self.url}{suffix}?{with_rid(self.query, self.rid)}"
        reason = ""
        for timeout in tries(deadline):
            if kind == "start" and self._finishing:
                return False
            try:
                status, headers, text = self._post(url, body, timeout, deadline - MARGIN, kind)
            except Cancelled:
                return False
            except Unanswered as exc:
                if kind == "start" and self._finishing:
                    return False  # abandoned on purpose by the final ping
                reason = exc.reason
                if kind == "start":
                    break  # it may still be delivered: a second one would only land later
            except (OSError, ValueError, http.client.HTTPException) as exc:
                if kind == "start" and self._finishing:
                    return False  # cut short on purpose by the final ping
                # Exception texts may carry the URL, and so the key: name the class only.
                reason = str(exc) if isinstance(exc, ResolveTimeout) else type(exc).__name__
            else:
                limit = headers.get("Ping-Body-Limit", "")
                if limit.isdigit():
                    self.body_limit = int(limit)
                if kind == "start":
                    with self._gate:
                        self._start_late = status in (200, 201) and self._final_out
                        if self._finishing:
                            return False  # abandoned: its answer only says when it landed
                if status in (200, 201):
                    if text not in ("OK", "Created"):
                        # Hosted UUID pings answer 200 even when dropped: say why.
                        self._problems.append((kind, f"answered {text!r}"))
                    return True
                reason = f"HTTP {status}"
                if status not in RETRY_STATUSES:
                    break
                if status == 500 and not body.isascii():
                    # A server that cuts the body to a limit not learned yet (no answer to
                    # /start) may cut inside a character, and one filtering by body then
                    # fails to decode it: retry with a body that any cut leaves valid.
                    body = escaped() if escaped else ascii_safe(body)[: len(body)]
        self._problems.append((kind, reason or "no time left in the ping budget"))
        return False

    def _post(
        self, url: str, body: bytes, timeout: float, deadline: float, kind: str
    ) -> tuple[int, http.client.HTTPMessage, str]:
        """One POST; (status, headers, first 60 characters of the body).

        The standard library's http.client rather than requests: pings run on every cron run,
        and importing requests cost 67 ms of a 456 ms Django start-up (bench/RESULTS.md, P1).
        """
        parts = urllib.parse.urlsplit(url)
        conn = connection(parts, timeout, deadline)
        start = kind == "start"
        # A start stays open while the job runs (above); any other ping ends by its deadline,
        # also against a server that answers a byte at a time.
        try:
            with cut_at(conn, None if start else deadline):
                return self._exchange(conn, parts, body, start)
        finally:
            if start:
                with self._gate:
                    self._start_sock = None
            conn.close()

    def _exchange(
        self, conn, parts: urllib.parse.SplitResult, body: bytes, start: bool
    ) -> tuple[int, http.client.HTTPMessage, str]:
        conn.connect()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"User-Agent": "cronops", "Content-Type": "text/plain; charset=utf-8"}
        if start:
            with self._gate:
                if self._finishing:
                    raise Cancelled
                self._start_sock = conn.sock
                written(conn.request, "POST", path, body=body, headers=headers)
            # Never given up while the job runs: an intermediary holding it could still
            # deliver it after we left, later than the final ping. `_wake_start` ends the wait.
            conn.sock.settimeout(None)
        else:
            written(conn.request, "POST", path, body=body, headers=headers)
        response = written(conn.getresponse)
        text = written(response.read, 200).decode("utf-8", "replace").strip()[:60]
        return response.status, response.headers, text

    def _report(self) -> None:
        """One line per distinct problem of this run, then forget them."""
        problems, self._problems = self._problems, []
        for reason, kinds in distinct(problems).items():
            log.warning("job %s: %s", self.job, self._explain(reason, kinds))

    def _explain(self, reason: str, kinds: list[str]) -> str:
        what = " and ".join(kinds) + (" pings" if len(kinds) > 1 else " ping")
        if reason in ("HTTP 404", "answered 'OK (not found)'"):
            if self.by_slug:
                return (
                    f"the check {self.job!r} does not exist on the server ({what}: "
                    f"{reason.removeprefix('answered ')}): run `manage.py sync_healthchecks` "
                    "or set HEALTHCHECKS_AUTO_CREATE=1 (or HEALTHCHECKS_PING_KEY is wrong)"
                )
            return (
                f"the check given by --ping does not exist on the server ({what}: "
                f"{reason.removeprefix('answered ')}): check its UUID or URL"
            )
        if reason == "HTTP 409":
            return (
                f"two checks share the slug {self.job!r} on the server ({what}: HTTP 409 "
                "ambiguous slug): delete or rename one of them in the healthchecks.io project"
            )
        if reason in ("HTTP 429", "answered 'OK (rate limited)'"):
            return (
                f"{what} rate-limited by the server ({reason.removeprefix('answered ')}: "
                "more than 5 pings a minute to one check); the job's outcome is unchanged"
            )
        if reason.startswith("answered "):
            return f"{what} {reason}"
        return f"{what} failed ({reason}); the job's outcome is unchanged"


def tries(deadline: float) -> Iterator[float]:
    """The timeouts of a request's attempts (ATTEMPTS at most, BACKOFF between them), all
    within `deadline` (time.monotonic()): the budget is a bound, not a target, and a margin is
    kept for a connection's setup and teardown, so that a server that never answers costs at
    most the budget. The caller breaks out on an answer that is not retried."""
    for attempt in range(ATTEMPTS):
        remaining = deadline - time.monotonic() - MARGIN
        if remaining <= MARGIN:
            return
        yield min(ATTEMPT_TIMEOUT, remaining)
        if attempt < len(BACKOFF):
            time.sleep(max(0.0, min(BACKOFF[attempt], deadline - time.monotonic() - MARGIN)))


def distinct(problems: list[tuple[str, str]]) -> dict[str, list[str]]:
    """{reason: the kinds of request it struck}, in order: one line per reason, not per try."""
    seen: dict[str, list[str]] = {}
    for kind, reason in problems:
        kinds = seen.setdefault(reason, [])
        if kind not in kinds:
            kinds.append(kind)
    return seen


def written(call: Callable, *args, **kwargs):
    """`call(...)` once the request has started going out: a failure is Unanswered."""
    try:
        return call(*args, **kwargs)
    except (OSError, http.client.HTTPException) as exc:
        raise Unanswered(type(exc).__name__) from None


def resolve(host: str, port: int, timeout: float) -> list[tuple]:
    """getaddrinfo bounded by `timeout`: the C resolver cannot be interrupted, so it runs in a
    daemon thread that is left behind when it hangs (a dead nameserver: 5 s x attempts)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    result: dict = {}

    def lookup():
        try:
            result["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            result["error"] = exc

    thread = threading.Thread(target=lookup, daemon=True, name="cronops-resolve")
    thread.start()
    thread.join(max(0.0, timeout))
    if thread.is_alive():
        raise ResolveTimeout("name resolution timed out")
    if "error" in result:
        raise result["error"]
    return result["addresses"]


@contextlib.contextmanager
def cut_at(conn: http.client.HTTPConnection, deadline: float | None):
    """The request on `conn` ends by `deadline` (time.monotonic()) whatever the server does: a
    socket timeout bounds each read, not their sum, and a server that answers a byte every
    second would hold the request for as long as it likes. A timer shuts the socket then, and
    what was read by then is no answer: TimeoutError."""
    if deadline is None:
        yield
        return
    cut_off = threading.Event()

    def cut() -> None:
        sock = conn.sock
        if sock is not None:
            cut_off.set()
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    timer: threading.Timer | None = threading.Timer(max(0.0, deadline - time.monotonic()), cut)
    assert timer is not None
    timer.daemon = True
    try:
        timer.start()
    except RuntimeError:  # no thread to be had: the per-read timeout is all there is
        timer = None
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
    if cut_off.is_set():
        raise TimeoutError("no whole answer within the ping budget")


def connection(parts: urllib.parse.SplitResult, timeout: float, deadline: float):
    """An http.client connection whose name lookup and connect end by `deadline`.

    It connects to the resolved address itself; http.client still sends the host name in the
    Host header and, for https, as the TLS server name (SNI) and certificate check."""
    https = parts.scheme == "https"
    conn_class = http.client.HTTPSConnection if https else http.client.HTTPConnection
    assert parts.hostname is not None, "ping URLs are checked for a host name"
    conn = conn_class(parts.hostname, parts.port, timeout=timeout)

    def create_connection(address, timeout=None, source_address=None):
        host, port = address
        addresses = resolve(host, port, deadline - time.monotonic())
        error: OSError = TimeoutError("no time left to connect")
        for family, kind, proto, _, sockaddr in addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock = socket.socket(family, kind, proto)
            sock.settimeout(min(timeout or left, left))
            try:
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            return sock
        raise error

    # http.client's hook for opening the socket (private, so not in typeshed)
    conn._create_connection = create_connection  # type: ignore[attr-defined]
    return conn
