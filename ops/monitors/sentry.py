"""Sentry Crons check-ins: a run's start and end, as the second monitor beside healthchecks.io.

A run sends `in_progress` when its job starts and `ok` or `error` with its duration when it
ends, both under the run's id (its `rid`, which healthchecks.io's pings carry too), to the
monitor named after the job. Each check-in carries the monitor's config, so the first one
creates the monitor and later ones keep it in step with crontab.d (Sentry's upsert): the
schedule, TIME_ZONE, a check-in margin from the job's grace, a maximum runtime from its
--timeout, derived as sync_healthchecks derives a check. A job without a schedule (@reboot, a
command run by hand) sends none: its check-ins reach a monitor made in Sentry, or nothing.

They go out as Sentry's envelope protocol (an HTTP POST to the DSN's `/api/<project>/envelope/`)
through the standard library, with the pings' rules (ops/monitors/pings.py): the start in the
background, never delaying the job; every request bounded, all of a run's within the ping
budget; nothing raised; the DSN's key never printed. What Sentry does with them (docs/sentry.md):
an `error`, a run not closed within its maximum runtime, and a missed run open an issue; a
missed run is noticed only once the monitor's environment has had a check-in.
"""

import datetime as dt
import json
import logging
import math
import threading
import time
import urllib.parse
import uuid

from .dsn import SLUG_MAX, Dsn, DsnError, parse_dsn  # noqa: F401  (callers' names for them)
from .monitors import SentryConfig
from .pings import MARGIN, RETRY_STATUSES, ResolveTimeout, connection, cut_at, distinct, tries

log = logging.getLogger("ops.sentry")

CLIENT = "cronops/0.1"
MAX_MINUTES = 40320  # Sentry's limit on a margin and a runtime: 28 days


def monitor_config(job, tz: str) -> dict | None:
    """The monitor's config for a declared job with a schedule (None without one): what
    sync_healthchecks gives its check (ops/monitors/hcsync.py), in Sentry's terms (minutes)."""
    if job is None or not job.cron_expr:
        return None
    from ..run.retries import longest_run
    from .grace import grace_seconds

    grace = grace_seconds(job)
    runtime = longest_run(job.options, job.options.timeout) if job.options.timeout else grace
    return {
        "schedule": {"type": "crontab", "value": job.cron_expr},
        "timezone": tz,
        "checkin_margin": min(MAX_MINUTES, max(1, math.ceil(grace / 60))),
        "max_runtime": min(MAX_MINUTES, max(1, math.ceil(runtime / 60))),
    }


def envelope(payload: dict, *, now: dt.datetime) -> bytes:
    """One check-in as an envelope: its header, the item's header, the item."""
    item = json.dumps(payload, separators=(",", ":")).encode()
    head = {"sent_at": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    return b"\n".join(
        [
            json.dumps(head, separators=(",", ":")).encode(),
            json.dumps({"type": "check_in", "length": len(item)}).encode(),
            item,
        ]
    )


class CheckIns:
    """The check-ins of one run (one check-in id)."""

    def __init__(
        self,
        config: SentryConfig,
        job: str,
        rid: str,
        *,
        monitor: dict | None = None,
        enabled: bool = True,
    ):
        self.config, self.job, self.monitor = config, job, monitor
        self.enabled = enabled and config.dsn is not None
        self.check_in_id = uuid.UUID(rid).hex
        self._started: float | None = None  # time.monotonic() of the start
        self._start_thread: threading.Thread | None = None
        self._problems: list[tuple[str, str]] = []
        if self.enabled and len(job) > SLUG_MAX:  # Sentry would cut it: another job's monitor?
            self.enabled = False
            log.warning(
                "job %s…: no Sentry check-ins: the name is longer than the %d characters of a "
                "monitor's slug (give it a shorter --name)",
                job[:SLUG_MAX],
                SLUG_MAX,
            )

    def start(self) -> None:
        """`in_progress`, from a thread of its own: the job never waits for it."""
        if not self.enabled or self._started is not None:
            return
        self._started = time.monotonic()
        deadline = self._started + self.config.budget
        thread = threading.Thread(
            target=self._send, args=("in_progress", None, deadline), daemon=True,
            name="cronops-sentry-start",
        )  # fmt: skip
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had (a process limit): no start
            self._problems.append(("in_progress", str(exc)))
            return
        self._start_thread = thread

    def finish(
        self,
        exit_code: int | None,
        body: bytes = b"",
        *,
        kind: str | None = None,
        deadline: float | None = None,
        **_: object,
    ) -> bool:
        """The run's end: `ok` (exit 0) or `error`, by `deadline`. A run that ends without its
        job having run (kind "log": waiting for its upstream; taken over, whose start went out)
        closes its start as `error` when it sent one (it did not complete here), else sends
        nothing."""
        if not self.enabled:
            return False
        if kind == "log" and self._started is None:
            return False
        now = time.monotonic()
        duration = None if self._started is None else now - self._started  # the run's own
        status = "ok" if exit_code == 0 and kind is None else "error"
        deadline = deadline or now + self.config.budget
        if self._start_thread is not None:  # `ok` before `in_progress` still closes the run
            self._start_thread.join(max(0.0, (deadline - now) / 2))
        ok = self._send(status, duration, deadline)
        self._report()
        return ok

    def log(self, message: str, deadline: float | None = None) -> bool:
        """A skip (already done, busy, paused): no check-in marks it."""
        return False

    def _send(self, status: str, duration: float | None, deadline: float) -> bool:
        assert self.config.dsn is not None
        payload: dict = {
            "check_in_id": self.check_in_id,
            "monitor_slug": self.job,
            "status": status,
        }
        if duration is not None:
            payload["duration"] = round(duration, 3)
        if self.config.environment:
            payload["environment"] = self.config.environment
        if self.monitor is not None:
            payload["monitor_config"] = self.monitor
        body = envelope(payload, now=dt.datetime.now(dt.UTC))
        reason = ""
        for timeout in tries(deadline):
            try:
                code, retry_after = self._post(body, timeout, deadline)
            except Exception as exc:  # whatever it is, the run goes on: one line says it
                # Never the text of an exception but ours: it may carry the URL.
                reason = str(exc) if isinstance(exc, ResolveTimeout) else type(exc).__name__
            else:
                if 200 <= code < 300:
                    return True
                reason = f"HTTP {code}" + (f", retry after {retry_after} s" if retry_after else "")
                if code not in RETRY_STATUSES:
                    break
        self._problems.append((status, reason or "no time left in the ping budget"))
        return False

    def _post(self, body: bytes, timeout: float, deadline: float) -> tuple[int, str]:
        assert self.config.dsn is not None
        parts = urllib.parse.urlsplit(self.config.dsn.endpoint)
        conn = connection(parts, timeout, deadline - MARGIN)
        auth = (
            f"Sentry sentry_key={self.config.dsn.public_key}, sentry_version=7, "
            f"sentry_client={CLIENT}"
        )
        headers = {
            "Content-Type": "application/x-sentry-envelope",
            "User-Agent": CLIENT,
            "X-Sentry-Auth": auth,
        }
        try:
            with cut_at(conn, deadline - MARGIN):  # a server that answers a byte at a time
                conn.request("POST", parts.path, body=body, headers=headers)
                response = conn.getresponse()
                response.read(1000)
                return response.status, response.headers.get("Retry-After", "").strip()[:10]
        finally:
            conn.close()

    def _report(self) -> None:
        """One line per distinct problem of this run (its start's too), then forget them."""
        problems, self._problems = self._problems, []
        host = self.config.dsn.host if self.config.dsn else "?"
        for reason, statuses in distinct(problems).items():
            what = " and ".join(statuses)
            if reason.startswith("HTTP 429"):
                why = f"rate-limited by Sentry ({reason})"
            else:
                why = f"failed ({reason})"
            log.warning(
                "job %s: Sentry %s check-in to %s %s; the job's outcome is unchanged",
                self.job,
                what,
                host,
                why,
            )


def pause_note(name: str, job, *, resumed: bool = False) -> str:
    """What a pause (or its end) does to the job's Sentry monitor, one line, "" without Sentry:
    nothing. Pausing or muting a monitor takes Sentry's UI or an auth token, not the DSN."""
    from .. import conf

    if not conf.sentry_dsn() or (job is not None and job.options.no_ping):
        return ""
    if resumed:
        return f"Sentry: unmute the monitor {name!r} in Sentry if you muted it for the pause"
    return (
        f"Sentry: the monitor {name!r} is not paused (a DSN cannot pause it): mute it in Sentry "
        "(Crons → the monitor → Mute) to keep its missed runs from opening issues"
    )
