"""How a run was started: by cron, by hand (who, at a terminal or not), from the Jobs page, as
a retry or as a catch-up slot (JobRun.trigger and started_by; JobRun.started_how says it in a
few words).

run_job finds out once, at its start, from what the kernel says about it (no query, no change
to the installed crontab lines, a few small reads of /proc):

- the Jobs page (Run now, Run again) starts run_job with OPS_ACTION_ID (ops/control/actions.py):
  the action's user started it;
- else, a cron daemon among its ancestors (a process named `cron` or `crond`, Debian's and
  cronie's daemons and the children they fork for each job, which run `/bin/sh -c <line>`): cron
  started it, through an installed line or a script that line runs;
- else it was run by hand, by the OS user (`alice as app` under `sudo -u app`, from
  SUDO_USER), at a terminal when its session has a controlling terminal (a shell, an `ssh -t`;
  not `ssh host 'cmd'`, not systemd, not a Kubernetes CronJob's pod).

Each row of the history gets the run_job's trigger, except an attempt after the first
(`retry`) and a slot before the current one run by --catch-up (`catch_up`); all keep who.
"""

import os
import pwd

from ..models import JobAction, Trigger
from ..values import Value
from .process import stat_of

CRON_DAEMONS = ("cron", "crond")  # /proc/<pid>/comm of Debian's cron (and cronie's, busybox's)
MAX_ANCESTORS = 64


class Origin(Value):
    trigger: str  # Trigger.CRON, HAND, TERMINAL or PAGE: how this run_job was started
    user: str = ""  # who: the OS user by hand; the Jobs page's user (from its action)
    action: int | None = None  # the Jobs page's action (its user is read once, when needed)

    def fields(self, *, catch_up: bool = False, attempt: int = 1) -> dict:
        """A new history row's `trigger` and `started_by`."""
        if self.action is not None and not self.user:
            found = JobAction.objects.filter(pk=self.action).values_list("username", flat=True)
            self.user = found.first() or "?"
        trigger = Trigger.RETRY if attempt > 1 else Trigger.CATCH_UP if catch_up else self.trigger
        return {"trigger": trigger, "started_by": self.user[:150]}


# Set by the warm dispatcher (ops/run/dispatch.py) before it forks each run_job, whose
# ancestors are gone by the time it looks (a double fork, a session of its own): whether cron
# started the dispatcher. None: not forked by one.
dispatched_by_cron: bool | None = None


def detect(action: int | None) -> Origin:
    """This run_job's origin; `action`: the Jobs page's action that started it, if one did."""
    if action is not None:
        return Origin(Trigger.PAGE, action=action)
    _, ppid, tty = _stat(os.getpid()) or ("", 0, 0)
    if dispatched_by_cron or (dispatched_by_cron is None and under_cron(ppid)):
        return Origin(Trigger.CRON)
    return Origin(Trigger.TERMINAL if tty else Trigger.HAND, os_user())


def under_cron(pid: int) -> bool:
    """Whether `pid` or one of its ancestors is a cron daemon (or a child it forked)."""
    for _ in range(MAX_ANCESTORS):
        found = _stat(pid) if pid > 0 else None
        if found is None:
            return False
        comm, pid, _ = found
        if comm in CRON_DAEMONS:
            return True
    return False


def os_user() -> str:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    # sudo's own variable, but the environment's: no newline or escape into a --log header
    sudo = "".join(c for c in os.environ.get("SUDO_USER", "") if c.isprintable())[:64]
    return f"{sudo} as {name}" if sudo and sudo != name else name


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(comm, parent pid, controlling terminal's device number or 0) of `pid`, or None."""
    found = stat_of(pid)
    try:
        return (found[0], int(found[1][1]), int(found[1][4])) if found else None
    except (IndexError, ValueError):
        return None
