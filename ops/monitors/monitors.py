"""The monitors of a run: one part with two members, healthchecks.io pings and Sentry check-ins.

The runner tells the monitors what a run does (its job started, it ended with an exit code or
as a failure or a mere note, it skipped its slot); each member turns that into requests of its
own, or none. They share the run's id (`rid`: a ping's `rid`, a check-in's id) and the ping
budget: the final requests of the members go out side by side, so a run's end costs at most
one budget whatever the members' servers do. Nothing here raises or changes an exit code.
"""

import threading
import time
import uuid
from typing import TYPE_CHECKING

from ..values import Value

if TYPE_CHECKING:
    from .dsn import Dsn

JOIN_MARGIN = 0.5  # seconds past the deadline a member is waited for (its own cut-off)


class RunMonitors:
    """What the runner speaks to: `start()`, `finish(...)`, `log(message)`, `rid`."""

    def __init__(self, members: list, rid: str, budget: float):
        self.members, self.rid, self.budget = members, rid, budget

    def start(self) -> None:
        for member in self.members:
            member.start()  # each in a thread of its own: the job never waits

    def finish(self, exit_code: int | None, body: bytes, **how) -> bool:
        """The end of the run (Pinger.finish's arguments); True when a member's request was
        taken."""
        return self._each(lambda m, deadline: m.finish(exit_code, body, deadline=deadline, **how))

    def log(self, message: str) -> bool:
        """A skip or a note that is no run (already done, busy, paused)."""
        return self._each(lambda m, deadline: m.log(message, deadline=deadline))

    def _each(self, call) -> bool:
        """`call` on every member, side by side, all by one deadline: the run's end costs at
        most one budget (a member still at it then is left to end on its own)."""
        deadline = time.monotonic() + self.budget
        done = [False] * len(self.members)

        def one(i: int) -> None:
            done[i] = bool(call(self.members[i], deadline))

        threads = []
        for i in range(1, len(self.members)):
            thread = threading.Thread(target=one, args=(i,), daemon=True, name="cronops-monitor")
            try:
                thread.start()
            except RuntimeError:  # no thread to be had: one after the other, same deadline
                one(i)
                continue
            threads.append(thread)
        if self.members:
            one(0)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()) + JOIN_MARGIN)
        return any(done)


class PingConfig(Value, frozen=True):
    """healthchecks.io's settings (ops/monitors/pings.py sends the pings)."""

    base_url: str
    ping_key: str = ""
    auto_create: bool = False
    budget: float = 10.0

    @classmethod
    def from_settings(cls) -> "PingConfig":
        from .. import conf

        return cls(
            base_url=conf.ping_url(),
            ping_key=conf.ping_key(),
            auto_create=conf.auto_create(),
            budget=conf.ping_budget_seconds(),
        )


class SentryConfig(Value, frozen=True):
    """Sentry's settings (ops/monitors/sentry.py sends the check-ins)."""

    dsn: "Dsn | None"
    environment: str = ""
    budget: float = 10.0

    @classmethod
    def from_settings(cls) -> "SentryConfig":
        from .. import conf

        value = conf.sentry_dsn()
        if value:
            from .dsn import parse_dsn
        return cls(
            dsn=parse_dsn(value) if value else None,
            environment=conf.sentry_environment(),
            budget=conf.ping_budget_seconds(),
        )


class Configs(Value, frozen=True):
    """The members' settings, read (and so checked) once, before anything is claimed."""

    pings: PingConfig
    sentry: SentryConfig

    @classmethod
    def from_settings(cls) -> "Configs":
        return cls(PingConfig.from_settings(), SentryConfig.from_settings())


def for_run(
    configs: Configs,
    name: str,
    job,
    *,
    ping: str | None,
    no_ping: bool,
    tz: str,
    enabled: bool = True,
) -> RunMonitors:
    """The monitors of one run of job `name` (`job`: its crontab.d declaration, or None), with
    its --ping and --no-ping (which keeps the run from both members)."""
    rid = str(uuid.uuid4())
    on = enabled and not no_ping
    # A member is made only when it has somewhere to send (a ping key or --ping; a DSN), and
    # its module imported only then: a run with neither (or --no-ping) loads neither.
    members: list = []
    if on and (ping or configs.pings.ping_key):
        from .pings import Pinger

        members.append(Pinger(configs.pings, name, override=ping, enabled=on, rid=rid))
    sentry = configs.sentry
    if on and sentry.dsn is not None:
        from .sentry import CheckIns, monitor_config

        monitor = monitor_config(job, tz)
        members.append(CheckIns(sentry, name, rid, monitor=monitor, enabled=on))
    return RunMonitors(members, rid, budget=configs.pings.budget)


def could_not_start(opts, job, message: str) -> None:
    """A failure for a run that could not start (the lock directory unusable, the database
    unreachable), with the job's options: /fail, an `error` check-in; no exit status."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    from .redact import Redactor

    try:
        watch = for_run(
            Configs.from_settings(),
            opts.job_name,
            job,
            ping=opts.ping,
            no_ping=bool(opts.no_ping),
            tz=settings.TIME_ZONE,
        )
    except ImproperlyConfigured:
        return  # a monitor's own setting is what is wrong: said as such where it is read
    message = Redactor.from_settings(settings).text(message)
    watch.finish(None, f"cronops: {message}\n".encode(), kind="fail")


def pause_notes(name: str, job, *, resumed: bool = False) -> list[str]:
    """What a pause (or its end) did to the job's monitors, one line each, for job_pause,
    job_resume and the Jobs page. healthchecks.io's check is paused by ops/control/pauses.py
    (its note comes with the pause); Sentry's monitor cannot be, with a DSN: said here."""
    from .sentry import pause_note

    note = pause_note(name, job, resumed=resumed)
    return [note] if note else []
