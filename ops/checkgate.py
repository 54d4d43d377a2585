"""Which commands run cronops' system checks, and Django's checks of its models and admin.

Django runs the system checks before most commands of a project. cronops' (ops/checks.py) and
Django's checks of cronops' six models, five ModelAdmins and their URLs cost every one of them
~2 % of a start (bench/RESULTS.md, P9), for problems of a deploy and a developer, not of
`manage.py clearsessions`: cronops' checks run under the commands in CHECKING, and wherever the
checks are asked for outside a management command (a script's or a test's `run_checks()`);
Django's checks of cronops' own code, as model_check and static_checks() say. Everything else
hears of a broken cronops setting from the cronops command that uses it (run_job,
install_crontab).
"""

import functools
import sys
import types
from pathlib import Path

from django.core.checks import Tags, register

CHECKING = frozenset({"check", "runserver", "migrate", "test"})
# Where BaseCommand's code runs: `execute`, runserver's `inner_run` (its own thread under the
# autoreloader) and `check` (BaseCommand.check, which execute calls, and a command may too)
_COMMAND_FRAMES = frozenset({"execute", "inner_run", "check"})


def command() -> str | None:
    """The management command the checks run under: the innermost on this thread's stack
    (call_command("check") inside another command is `check`; a command that calls its own
    check() asks for them as `check` does), else manage.py's (or django-admin's) command word;
    None for neither (a script, a test)."""
    from django.core.management.base import BaseCommand

    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _COMMAND_FRAMES:
            running = frame.f_locals.get("self")
            if isinstance(running, BaseCommand):
                called_by = frame.f_back.f_code.co_name if frame.f_back else ""
                if frame.f_code.co_name != "check":
                    return _kind(type(running))
                if called_by != "execute":  # not execute's own call: asked for
                    return "check"
        frame = frame.f_back
    return launched()


def launched() -> str | None:
    """The command word of manage.py's (django-admin's, `python -m django`'s) command line; None
    for another program's (a script, pytest)."""
    return _command_word(tuple(sys.argv))


@functools.lru_cache(maxsize=4)
def _command_word(argv: tuple[str, ...]) -> str | None:
    launcher = Path(argv[0]).parts[-2:] if argv else ()
    if not launcher or len(argv) < 2:
        return None
    if launcher[-1] not in ("manage.py", "django-admin") and launcher != ("django", "__main__.py"):
        return None  # python -m pytest's __main__.py is not `python -m django`'s
    return next((word for word in argv[1:] if not word.startswith("-")), "")


def _kind(command_class: type) -> str:
    """A command's name, or that of the command in CHECKING it subclasses (a project's
    `deploycheck` built on `check`, staticfiles' `runserver`): by module, as Django names them."""
    for kind in command_class.__mro__:
        name = kind.__module__.rpartition(".")[2]
        if name in CHECKING:
            return name
    return command_class.__module__.rpartition(".")[2]


def checking(commands: frozenset[str] = CHECKING) -> bool:
    """Whether the checks running now are ones cronops' checks serve."""
    name = command()
    return name is None or name in commands


def static_checks() -> bool:
    """Whether to run checks of cronops' own code that no setting, database or crontab.d can
    change (Django's checks of its ModelAdmins, their URLs and the database-free checks of its
    models): outside a management command only, where cronops' test suite asks for them
    (tests/test_checkgate.py); a project's commands, `check` included, would only pay for them."""
    # manage.py's command line answers without the stack (~30 k instructions a look, and each
    # of cronops' models, ModelAdmins and admin URLs asks)
    return launched() is None and command() is None


def model_check(cls, /, **kwargs):
    """Django's checks of one of cronops' models (`check = classmethod(model_check)`): those
    that depend on a database (a partial unique constraint on MySQL) when given one (`check
    --database`, `migrate`, `test`; Django 6 gives every command's checks the databases), the
    rest under static_checks()."""
    from django.db.models import Model

    if kwargs.get("databases") or cls._meta.app_label != "ops" or static_checks():
        return Model.check.__func__(cls, **kwargs)  # type: ignore[attr-defined]
    return []  # a project's model built on one of these is checked as any of its own


# ops/checks.py's checks, by name and by the tags and deploy flag Django selects them by:
# registered here, one function a group (Django inspects the signature of each it registers,
# ~80 k instructions), so that a command outside CHECKING neither runs them nor imports their
# module (with what it imports: ~2 M instructions)
CHECKS: dict[tuple[str, bool], tuple[str, ...]] = {
    (Tags.compatibility, False): (
        "check_settings",
        "check_time_zone",
        "check_crontabd",
        "check_sentry",
        "check_time_zone_name",
        "check_directories",
    ),
    (Tags.compatibility, True): ("check_pings",),
    (Tags.security, False): ("check_redact_names", "check_env_file"),
    (Tags.database, False): ("check_migrations",),
}


def _gated(tag: str, deploy: bool, names: tuple[str, ...]):
    def check(app_configs=None, **kwargs):
        if not checking():
            return []
        from . import checks

        found = []
        for name in names:
            found += getattr(checks, name)(app_configs=app_configs, **kwargs)
        return found

    check.__name__ = check.__qualname__ = f"cronops_{tag}{'_deploy' * deploy}_checks"
    return check


_GATED = [(_gated(tag, deploy, names), tag, deploy) for (tag, deploy), names in CHECKS.items()]


def register_checks() -> None:
    for check, tag, deploy in _GATED:  # the same functions each time: registered once
        register(check, tag, deploy=deploy)
