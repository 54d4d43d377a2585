"""Which commands run cronops' system checks (ops/checkgate.py): `check`, `runserver`, `migrate`
and `test`, and a script's or a test's run_checks(); not the project's other commands, which
would pay for them on every start (bench/RESULTS.md, P9)."""

import threading

import pytest
from django.contrib.admin import AdminSite, site
from django.core.checks import run_checks
from django.core.management.base import BaseCommand
from django.db import models
from django.test.utils import isolate_apps
from django.urls.resolvers import RoutePattern

from ops import checkgate
from ops.admin import OwnURL, ReadOnlyAdmin
from ops.checkgate import model_check
from ops.models import Effect, Job, JobAction, JobPause, JobRun, SlotClaim

BROKEN = {"OPS_HEARTBEAT_SECONDS": "soon"}  # ops.E006


@pytest.mark.process
def test_a_broken_cronops_setting_stops_check_and_migrate_but_not_another_command(
    sqlite_project,
):
    checked = sqlite_project.manage("check", env=BROKEN)
    assert checked.returncode == 1
    assert "(ops.E006) OPS_HEARTBEAT_SECONDS" in checked.stderr
    migrated = sqlite_project.manage("migrate", "--plan", env=BROKEN)
    assert migrated.returncode == 1
    assert "(ops.E006)" in migrated.stderr
    # showmigrations runs the system checks (Django's default), but not cronops'
    other = sqlite_project.manage("showmigrations", "ops", env=BROKEN)
    assert other.returncode == 0, other.stderr
    assert "ops.E006" not in other.stderr
    assert "[X] 0001_initial" in other.stdout


@pytest.mark.process
def test_call_command_check_inside_another_command_runs_cronops_checks(sqlite_project):
    script = "from django.core.management import call_command; call_command('check')"
    result = sqlite_project.manage("shell", "-c", script, env=BROKEN)
    assert result.returncode == 1
    assert "(ops.E006) OPS_HEARTBEAT_SECONDS" in result.stderr


class Check(BaseCommand):
    """A command whose module's last name is `check`, as Django's own (or a subclass of it)."""


Check.__module__ = "someapp.management.commands.check"


class Other(BaseCommand):
    pass


Other.__module__ = "someapp.management.commands.clearsessions"


def test_the_command_is_the_innermost_one_running_on_this_thread():
    seen = []

    def handle_other(self, *args, **options):
        seen.append(checkgate.command())
        Check().execute(skip_checks=True, no_color=True, force_color=False)

    def handle_check(self, *args, **options):
        seen.append(checkgate.command())

    Other.handle = handle_other
    Check.handle = handle_check
    Other().execute(skip_checks=True, no_color=True, force_color=False)
    assert seen == ["clearsessions", "check"]


def test_outside_any_command_the_command_line_decides(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/srv/app/manage.py", "--verbosity=2", "clearsessions"])
    assert checkgate.command() == "clearsessions"
    assert not checkgate.checking()
    monkeypatch.setattr("sys.argv", ["manage.py", "runserver", "0:8000"])
    assert checkgate.checking()
    monkeypatch.setattr("sys.argv", ["django-admin", "check", "--deploy"])
    assert checkgate.checking()
    site_packages = "/venv/lib/python3.11/site-packages"
    monkeypatch.setattr("sys.argv", [f"{site_packages}/django/__main__.py", "check"])
    assert checkgate.command() == "check"  # python -m django check
    monkeypatch.setattr("sys.argv", [f"{site_packages}/pytest/__main__.py", "x"])
    assert checkgate.command() is None  # python -m pytest
    monkeypatch.setattr("sys.argv", ["/usr/bin/some-script"])
    assert checkgate.command() is None
    assert checkgate.checking()


def test_runservers_checks_on_their_own_thread_are_runservers(monkeypatch):
    """The autoreloader runs runserver's inner_run, which runs the checks, on a thread of its
    own: its stack holds inner_run, not execute."""

    class Runserver(BaseCommand):
        def inner_run(self):
            seen.append(checkgate.command())

    Runserver.__module__ = "django.contrib.staticfiles.management.commands.runserver"
    monkeypatch.setattr("sys.argv", ["/usr/bin/some-script"])
    seen: list[str | None] = []
    thread = threading.Thread(target=Runserver().inner_run)
    thread.start()
    thread.join()
    assert seen == ["runserver"]


@pytest.mark.django_db
def test_djangos_checks_of_cronops_models_and_admin_find_nothing():
    """What the project's commands skip (checks of cronops' own code) is asked here, where no
    command runs, with and without the database."""
    for model in (JobRun, SlotClaim, Effect, Job, JobPause, JobAction):
        assert model.check() == []
        assert model.check(databases=["default"]) == []
    ours = [a for m, a in site._registry.items() if m._meta.app_label == "ops"]
    assert len(ours) == 5
    assert [a.check() for a in ours] == [[]] * 5
    assert [m for a in ours for url in a.get_urls() for m in url.check()] == []
    assert [m for m in run_checks() if m.id and m.id.startswith(("admin.", "models."))] == []


@isolate_apps("ops")
def test_a_fault_in_cronops_own_code_is_found_by_its_tests_and_costs_no_command(monkeypatch):
    """Checks of cronops' models and admin find what Django's find (here in a broken copy)
    where cronops' test suite asks, and run under no command of the project."""

    class Broken(models.Model):
        name = models.CharField(max_length=-1)  # fields.E121
        check = classmethod(model_check)

        class Meta:
            app_label = "ops"

        def __str__(self) -> str:
            return self.name

    class BrokenAdmin(ReadOnlyAdmin):
        list_display = ["no_such_field"]  # admin.E108

    BrokenAdmin.__module__ = "ops.admin"  # one of ops' own (a project's are checked: below)
    # and an admin URL whose route begins with "/" (urls.W002)
    broken_url = OwnURL(RoutePattern("/history/", is_endpoint=True), lambda request: None)
    assert [m.id for m in Broken.check()] == ["fields.E121"]
    assert [m.id for m in BrokenAdmin(Broken, AdminSite()).check()] == ["admin.E108"]
    assert [m.id for m in broken_url.check()] == ["urls.W002"]
    monkeypatch.setattr("sys.argv", ["manage.py", "check"])  # also under `check` itself
    assert Broken.check() == []
    assert BrokenAdmin(Broken, AdminSite()).check() == []
    assert broken_url.check() == []
    # but a database's own rules are checked when `check --database` (or migrate) asks
    assert [m.id for m in Broken.check(databases=["default"])] == ["fields.E121"]


def test_every_check_of_ops_checks_is_registered_once_under_its_tags():
    from django.core.checks import registry

    import ops.checks

    defined = {n for n in dir(ops.checks) if n.startswith("check_")}
    listed = [n for names in checkgate.CHECKS.values() for n in names]
    assert sorted(listed) == sorted(defined)
    ours = [c for c in registry.registry.get_checks(True) if c.__module__ == "ops.checkgate"]
    assert sorted((c.__name__, tuple(c.tags)) for c in ours) == [
        ("cronops_compatibility_checks", ("compatibility",)),
        ("cronops_compatibility_deploy_checks", ("compatibility",)),
        ("cronops_database_checks", ("database",)),
        ("cronops_security_checks", ("security",)),
    ]


@pytest.mark.process
def test_check_by_tag_runs_cronops_checks_of_that_tag(sqlite_project):
    env = {**BROKEN, "OPS_REDACT": "NO_SUCH_NAME"}  # ops.E006 (compatibility), W006 (security)
    security = sqlite_project.manage("check", "--tag", "security", env=env)
    assert "(ops.W006)" in security.stderr and "ops.E006" not in security.stderr
    compatibility = sqlite_project.manage("check", "--tag", "compatibility", env=env)
    assert "(ops.E006)" in compatibility.stderr and "ops.W006" not in compatibility.stderr


COMMANDS = {
    # a deploy's own wrapper of `check`, under another name
    "deploycheck": "from django.core.management.commands.check import Command as Check\n\n\n"
    "class Command(Check):\n    pass\n",
    # a command that skips the automatic checks and asks for them itself
    "selfcheck": "from django.core.management.base import BaseCommand\n\n\n"
    "class Command(BaseCommand):\n    requires_system_checks = []\n\n"
    "    def handle(self, *args, **options):\n        self.check()\n",
}


@pytest.mark.process
def test_a_command_built_on_check_or_asking_for_the_checks_runs_cronops_checks(sqlite_project):
    commands = sqlite_project.dir / "commands" / "management" / "commands"
    for name, code in COMMANDS.items():
        (commands / f"{name}.py").write_text(code)
        result = sqlite_project.manage(name, env=BROKEN)
        assert result.returncode == 1, (name, result.stderr)
        assert "(ops.E006) OPS_HEARTBEAT_SECONDS" in result.stderr, name


@isolate_apps("ops", "commands")
def test_a_projects_model_and_admin_built_on_cronops_are_checked_as_its_own(monkeypatch):
    class FailedRun(JobRun):
        class Meta:
            proxy = True
            app_label = "commands"
            ordering = ["no_such_field"]  # models.E015

    class FailedRunAdmin(ReadOnlyAdmin):
        list_display = ["no_such_column"]  # admin.E108

    monkeypatch.setattr("sys.argv", ["manage.py", "check"])
    assert [m.id for m in FailedRun.check()] == ["models.E015"]
    assert [m.id for m in FailedRunAdmin(FailedRun, AdminSite()).check()] == ["admin.E108"]
