"""sync_healthchecks against the healthchecks stand-in (tests/hcserver.py, the `hc` fixture).

The stand-in follows the API's documented behaviour and the server as observed: `X-Api-Key` of
exactly 32 characters else 401 `missing api key`, a wrong key 401 `wrong api key`; upsert with
`unique: ["slug"]` updates the first match (201 created / 200 updated); strict validation
answers 400 with `json validation error: <field> ...` (nulls included); `channels` omitted
leaves them alone, `*` assigns all; `tz` is renamed by the server's own table (`CET` →
`Europe/Brussels`), other names kept as written.
"""

import datetime as dt
import io
import textwrap

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ops.monitors.hcapi import ApiError, HealthchecksAPI
from ops.schedule.crontabd import parse_text

from .hcserver import API_KEY, CHANNELS, READ_KEY, HealthchecksServer

assert len(API_KEY) == 32
TAG = "cronops-shop"

CRON = textwrap.dedent(
    """\
    # Charge every active subscription once per logical day.
    0 3 * * *     --catch-up=3 --timeout=30m charge_daily
    # Delete expired Django sessions.
    @daily        --name=clear-sessions --timeout=10m clearsessions
    */15 * * * *  --timeout=5s --name=tick sleep_demo --seconds=0
    @reboot       --name=warmup sleep_demo --seconds=0
    """
)


FakeHealthchecks = HealthchecksServer  # its old name (tests/test_deploy.py)


@pytest.fixture
def configured(hc, settings, tmp_path):
    directory = tmp_path / "crontab.d"
    directory.mkdir()
    (directory / "10-app.cron").write_text(CRON)
    settings.OPS_CRONTAB_DIR = directory
    settings.HEALTHCHECKS_API_URL = hc.url
    settings.HEALTHCHECKS_API_KEY = API_KEY
    settings.HEALTHCHECKS_CHANNELS = "*"
    settings.OPS_HC_TAG = TAG
    settings.TIME_ZONE = "Europe/Moscow"
    return directory


def sync(*args):
    """(exit code, stdout, error message) of an in-process run."""
    out = io.StringIO()
    try:
        call_command("sync_healthchecks", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), ""


# --- creating, updating, idempotence -------------------------------------------------------


def test_the_first_sync_creates_one_check_per_job_with_its_schedule(hc, configured):
    code, out, _ = sync()
    assert code == 0
    assert set(c["slug"] for c in hc.checks.values()) == {
        "charge_daily",
        "clear-sessions",
        "tick",
        "warmup",
    }
    charge = hc.by_slug("charge_daily")
    assert charge["kind"] == "cron"
    assert charge["schedule"] == "0 3 * * *"
    assert charge["tz"] == "Europe/Moscow"
    assert charge["grace"] == 1800  # its --timeout=30m
    assert charge["desc"] == (
        "Charge every active subscription once per logical day.\n\ncronops job: charge_daily"
    )
    assert charge["methods"] == "POST"  # a crawler's GET of a ping URL is no success
    assert charge["tags"] == TAG
    assert charge["channels"] == CHANNELS  # HEALTHCHECKS_CHANNELS=* on create
    assert hc.by_slug("clear-sessions")["schedule"] == "0 0 * * *"  # @daily, five fields
    assert hc.by_slug("tick")["grace"] == 60  # 5 s timeout, raised to the API's minimum
    warmup = hc.by_slug("warmup")
    assert (warmup["kind"], warmup["timeout"]) == ("simple", 31_536_000)  # @reboot
    assert "created      charge_daily: cron '0 3 * * *' Europe/Moscow, grace 30m" in out
    assert out.splitlines()[-1] == "healthchecks.io: 4 created, 0 unchanged"
    for _, _, body in hc.writes():
        assert body["unique"] == ["slug"]
        assert None not in body.values()


def test_a_second_sync_reports_nothing_to_change_and_writes_nothing(hc, configured):
    sync()
    writes = len(hc.writes())
    code, out, _ = sync()
    assert code == 0
    assert out.strip() == "healthchecks.io: nothing to change (4 checks up to date)"
    assert len(hc.writes()) == writes
    assert [m for m, _, _ in hc.api_log[-1:]] == ["GET"]  # one listing by tag, nothing else


def test_a_changed_timeout_updates_the_grace_and_leaves_channels_alone(hc, configured):
    sync()
    hc.by_slug("charge_daily")["channels"] = [CHANNELS[1]]  # chosen by hand in the web UI
    (configured / "10-app.cron").write_text(CRON.replace("--timeout=30m", "--timeout=45m"))
    code, out, _ = sync()
    assert code == 0
    assert "updated      charge_daily: grace 30m → 45m" in out
    assert out.splitlines()[-1] == "healthchecks.io: 1 updated, 3 unchanged"
    method, path, body = hc.writes()[-1]
    assert (method, path) == ("POST", "/api/v3/checks/")
    assert "channels" not in body
    assert hc.by_slug("charge_daily")["channels"] == [CHANNELS[1]]
    assert hc.by_slug("charge_daily")["grace"] == 2700


def test_an_auto_created_check_is_adopted_keeping_its_channels_and_tags(hc, configured):
    hc.add(slug="charge_daily", name="charge_daily", tags="billing", channels=[CHANNELS[0]])
    code, out, _ = sync()
    assert code == 0
    adopted = hc.by_slug("charge_daily")
    assert len([c for c in hc.checks.values() if c["slug"] == "charge_daily"]) == 1
    assert adopted["tags"] == f"billing {TAG}"
    assert adopted["channels"] == [CHANNELS[0]]
    assert adopted["schedule"] == "0 3 * * *"
    assert "updated      charge_daily:" in out
    assert sync()[1].strip() == "healthchecks.io: nothing to change (4 checks up to date)"


def test_dry_run_shows_the_changes_and_changes_nothing(hc, configured):
    code, out, _ = sync("--dry-run")
    assert code == 0
    assert "would create charge_daily: cron '0 3 * * *' Europe/Moscow, grace 30m" in out
    assert out.splitlines()[-1] == (
        "healthchecks.io: 4 to create, 0 unchanged (dry run: nothing was changed)"
    )
    assert hc.writes() == []
    assert hc.checks == {}


# --- prune ----------------------------------------------------------------------------------


def test_a_removed_job_is_reported_and_deleted_only_with_prune(hc, configured):
    sync()
    hc.add(slug="someone-elses", name="someone-elses", tags="other-project")
    (configured / "10-app.cron").write_text(CRON.replace("@reboot", "# @reboot"))
    code, out, _ = sync()
    assert code == 0
    assert f"stale        warmup: tagged {TAG!r}, not in crontab.d (--prune deletes it)" in out
    assert "warmup" in {c["slug"] for c in hc.checks.values()}

    code, out, _ = sync("--prune", "--dry-run")
    assert f"would delete warmup: tagged {TAG!r}, no such job in crontab.d" in out
    assert "warmup" in {c["slug"] for c in hc.checks.values()}

    code, out, _ = sync("--prune")
    assert code == 0
    assert f"deleted      warmup: tagged {TAG!r}, no such job in crontab.d" in out
    assert out.splitlines()[-1] == "healthchecks.io: 1 deleted, 3 unchanged"
    assert {c["slug"] for c in hc.checks.values()} == {
        "charge_daily",
        "clear-sessions",
        "tick",
        "someone-elses",  # not ours: never touched
    }
    assert hc.writes()[-1][0] == "DELETE"
    assert sync("--prune")[1].strip() == "healthchecks.io: nothing to change (3 checks up to date)"


def test_prune_refuses_when_crontab_d_has_no_jobs(hc, configured):
    sync()
    (configured / "10-app.cron").write_text("# nothing scheduled\n")
    code, _, error = sync("--prune")
    assert code == 2
    assert error == "crontab.d has no jobs: refusing to --prune every check of the project"
    assert len(hc.checks) == 4


# --- errors: one line, non-zero exit, never the key -----------------------------------------


def test_a_wrong_api_key_is_one_clear_line_without_the_key(hc, configured, settings):
    settings.HEALTHCHECKS_API_KEY = "x" * 32
    code, out, error = sync()
    assert code == 1
    assert error == (
        "healthchecks.io: listing checks: 401 wrong api key: "
        "HEALTHCHECKS_API_KEY is not a read-write API key of this project "
        "(Project Settings → API Access)"
    )
    assert "x" * 32 not in error + out
    assert "\n" not in error


def test_a_key_of_the_wrong_length_gets_the_servers_missing_api_key(hc, configured, settings):
    settings.HEALTHCHECKS_API_KEY = "short"
    code, _, error = sync()
    assert code == 1
    assert "401 missing api key" in error
    assert "short" not in error


def test_a_validation_error_names_the_field(hc, configured):
    hc.api_fail_with = (400, {"error": "json validation error: grace is too small"})
    code, _, error = sync()
    assert code == 1
    assert error == (
        "healthchecks.io: listing checks: 400 rejected: json validation error: grace is too small"
    )


def test_the_fake_api_rejects_null_fields_and_the_client_never_sends_them(hc):
    api = HealthchecksAPI(hc.url, API_KEY)
    with pytest.raises(ApiError) as error:
        api._request("POST", "checks/", "raw", json={"slug": "x", "desc": None})
    assert str(error.value) == "raw: 400 rejected: json validation error: desc is not a string"
    created, check = api.upsert({"slug": "x", "name": "x", "desc": None, "grace": 60})
    assert created is True
    assert check["desc"] == ""
    assert hc.api_log[-1][2] == {"slug": "x", "name": "x", "grace": 60, "unique": ["slug"]}


def test_a_schedule_the_api_cannot_read_is_a_400_on_the_upsert(hc):
    api = HealthchecksAPI(hc.url, API_KEY)
    with pytest.raises(ApiError) as error:
        api.upsert({"slug": "x", "schedule": "@daily"})
    assert error.value.status == 400
    assert "schedule is not a valid cron" in str(error.value)


def test_rate_limiting_is_one_clear_line(hc, configured):
    hc.api_fail_with = (429, {"error": "rate limit exceeded"})
    code, _, error = sync()
    assert code == 1
    assert error.endswith("429 rate limited by healthchecks.io: run it again in a minute")


def test_an_unreachable_api_is_one_clear_line(configured, settings):
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.HEALTHCHECKS_API_URL = f"http://127.0.0.1:{port}/api/v3/"
    code, _, error = sync()
    assert code == 1
    assert error == (
        f"healthchecks.io: listing checks: cannot reach the healthchecks.io API "
        f"at http://127.0.0.1:{port}/api/v3/ (connection failed)"
    )


def test_without_an_api_key_it_says_where_to_get_one(configured, settings):
    settings.HEALTHCHECKS_API_KEY = ""
    code, _, error = sync()
    assert code == 2
    assert "HEALTHCHECKS_API_KEY is not set" in error


def test_the_default_tag_names_the_project_directory(settings):
    from ops.monitors.hcsync import project_tag

    settings.OPS_HC_TAG = ""
    settings.BASE_DIR = "/srv/My Shop"
    assert project_tag(settings) == "cronops-my-shop"
    settings.OPS_HC_TAG = "shop-prod"  # OPS_HC_TAG in .env
    assert project_tag(settings) == "shop-prod"


def test_job_specs_are_built_from_crontab_d():
    from ops.monitors.hcsync import desired_spec

    job = parse_text("# Nightly.\n0 3 * * * --timeout=2h x\n", "t.cron").jobs[0]
    assert desired_spec(job, tz="UTC", tag="t") == {
        "name": "x",
        "slug": "x",
        "tags": "t",
        "desc": "Nightly.\n\ncronops job: x",
        "grace": 7200,
        "methods": "POST",
        "schedule": "0 3 * * *",
        "tz": "UTC",
    }


# --- a deployed copy, as an operator runs it -------------------------------------------------


def test_a_deployed_project_syncs_twice_and_never_prints_its_key(sqlite_project, hc):
    sqlite_project.write_cron("10-app.cron", CRON)
    sqlite_project.write_env(
        HEALTHCHECKS_API_URL=hc.url,
        HEALTHCHECKS_API_KEY=API_KEY,
        HEALTHCHECKS_PING_KEY="pk-" + "p" * 20,
    )
    first = sqlite_project.manage("sync_healthchecks")
    assert first.returncode == 0, first.stderr
    assert "healthchecks.io: 4 created, 0 unchanged" in first.stdout
    assert {(c["tags"], c["tz"]) for c in hc.checks.values()} == {("cronops-app", "UTC")}
    second = sqlite_project.manage("sync_healthchecks")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "healthchecks.io: nothing to change (4 checks up to date)"
    sqlite_project.write_env(HEALTHCHECKS_API_KEY="y" * 32)
    wrong = sqlite_project.manage("sync_healthchecks")
    assert wrong.returncode == 1
    assert wrong.stderr.strip().startswith("CommandError: healthchecks.io: listing checks")
    assert len(wrong.stderr.strip().splitlines()) == 1
    for result in (first, second, wrong):
        assert API_KEY not in result.stdout + result.stderr
        assert "y" * 32 not in result.stdout + result.stderr


# --- the server as observed: zone names, duplicates, copies, renames, methods ---------------


def sync_with_stderr(*args):
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("sync_healthchecks", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue(), str(exc)
    return 0, out.getvalue(), err.getvalue(), ""


@pytest.mark.parametrize(
    ("zone", "stored"),
    [
        ("CET", "Europe/Brussels"),  # a zone of its own in Debian's tzdata, renamed by the server
        ("EST", "America/Panama"),
        ("US/Eastern", "America/New_York"),
        ("Europe/Kiev", "Europe/Kyiv"),
    ],
)
def test_a_time_zone_the_server_renames_settles_after_the_first_sync(
    hc, configured, settings, zone, stored
):
    settings.TIME_ZONE = zone
    code, _, err, _ = sync_with_stderr()
    assert code == 0
    assert hc.by_slug("charge_daily")["tz"] == stored
    # What the server did, said once it has: not a guess made before.
    assert [line for line in err.splitlines() if "TIME_ZONE" in line] == [
        f"note: healthchecks.io stores TIME_ZONE {zone!r} as {stored!r}, a zone with the same "
        "rules: later syncs leave it as it is"
    ]
    writes = len(hc.writes())
    code, out, err, _ = sync_with_stderr()
    assert code == 0
    assert out.strip() == "healthchecks.io: nothing to change (4 checks up to date)"
    assert "TIME_ZONE" not in err
    assert len(hc.writes()) == writes
    # A check stored under the name as written (a server that does not rename it) is the
    # same zone too.
    hc.by_slug("tick")["tz"] = zone
    assert sync_with_stderr()[1].strip().startswith("healthchecks.io: nothing to change")


@pytest.mark.parametrize("zone", ["America/Montreal", "Asia/Istanbul", "Asia/Calcutta"])
def test_a_linked_name_the_server_keeps_is_stored_as_written_and_settles(
    hc, configured, settings, zone
):
    """tzdata links these to other names, but the server's table does not rename them:
    nothing may claim that it stores another name."""
    settings.TIME_ZONE = zone
    code, _, err, _ = sync_with_stderr()
    assert code == 0
    assert hc.by_slug("charge_daily")["tz"] == zone
    assert "TIME_ZONE" not in err, err
    writes = len(hc.writes())
    code, out, _, _ = sync_with_stderr()
    assert out.strip() == "healthchecks.io: nothing to change (4 checks up to date)"
    assert len(hc.writes()) == writes


def test_a_check_whose_zone_has_other_rules_is_updated(hc, configured, settings):
    settings.TIME_ZONE = "Europe/Paris"
    sync_with_stderr()
    hc.by_slug("charge_daily")["tz"] = "Europe/London"  # an hour apart, all year
    code, out, _, _ = sync_with_stderr()
    assert code == 0
    assert "updated      charge_daily: tz 'Europe/London' → 'Europe/Paris'" in out
    assert hc.by_slug("charge_daily")["tz"] == "Europe/Paris"


def test_zones_are_the_same_when_they_tell_the_same_time_all_the_coming_year():
    from ops.schedule.tznames import same_rules

    now = dt.datetime(2026, 12, 3, 12, tzinfo=dt.UTC)
    assert same_rules("CET", "Europe/Brussels", now=now)
    assert same_rules("America/Montreal", "America/Toronto", now=now)
    assert same_rules("UTC", "Etc/UTC", now=now)
    assert not same_rules("Europe/Paris", "Europe/London", now=now)
    # One DST rule apart: the same offsets in winter, not in summer.
    assert not same_rules("Europe/Berlin", "Africa/Lagos", now=now)
    assert not same_rules("Europe/Paris", "Not/A_Zone", now=now)
    assert not same_rules("Europe/Paris", None, now=now)


def test_the_system_check_warns_about_a_legacy_time_zone_name(settings):
    from ops.checks import check_time_zone_name

    settings.TIME_ZONE = "Europe/Kiev"
    [warning] = check_time_zone_name()
    assert warning.id == "ops.W010"
    assert warning.msg == "TIME_ZONE 'Europe/Kiev' is a legacy tzdata name of 'Europe/Kyiv'"
    assert "TIME_ZONE = 'Europe/Kyiv' in your settings" in warning.hint
    assert "healthchecks" not in warning.hint  # the server's own table decides what it stores
    settings.TIME_ZONE = "UTC"  # an alias of Etc/UTC
    assert check_time_zone_name() == []


def test_two_checks_with_a_jobs_slug_are_reported_and_left_alone(hc, configured):
    sync()
    first = hc.by_slug("tick")
    second = hc.add(slug="tick", name="tick made by hand", grace=120)
    (configured / "10-app.cron").write_text(CRON.replace("--timeout=5s", "--timeout=10m"))
    writes = len(hc.writes())
    code, out, error = sync()
    assert code == 1
    line = next(line for line in out.splitlines() if line.startswith("duplicate"))
    assert line == (
        f"duplicate    tick: checks {first.uuid} 'tick', {second.uuid} 'tick made by hand' share "
        "this slug (pings get 409): delete or rename all but one in the web UI; nothing was "
        "changed for it"
    )
    assert error == (
        "healthchecks.io: several checks share the slug of job(s) tick: delete or rename the "
        "extra checks (nothing was changed for those jobs)"
    )
    assert len(hc.writes()) == writes  # nothing written, for tick or the others
    assert (first.grace, second.grace) == (60, 120)
    # The same report again, and still nothing written.
    assert sync()[:2] == (code, out)
    assert len(hc.writes()) == writes


def test_prune_spares_a_copy_made_in_the_web_ui_and_a_rename_stays(hc, configured):
    sync()
    charge = hc.by_slug("charge_daily")
    copy = hc.copy(charge)
    assert TAG in copy.tags.split() and copy.desc == charge.desc
    charge.name = "Daily billing"  # renamed in the web UI
    code, out, _ = sync("--prune")
    assert code == 0
    assert charge.name == "Daily billing"
    assert copy.uuid in hc.checks
    assert out.splitlines()[-1] == "healthchecks.io: nothing to change (4 checks up to date)"
    assert (
        f"kept         charge_daily-copy: tagged {TAG!r} but not created by this project "
        "(a copy made in the web UI?): --prune leaves it alone"
    ) in sync("--prune", "--dry-run")[1]
    # Its own checks still go when their job does.
    (configured / "10-app.cron").write_text(CRON.replace("@reboot", "# @reboot"))
    code, out, _ = sync("--prune")
    assert "deleted      warmup" in out
    assert copy.uuid in hc.checks and "warmup" not in {c.slug for c in hc.checks.values()}


def test_an_adopted_check_accepts_only_post_pings_after_the_sync(hc, configured):
    check = hc.add(slug="charge_daily", name="charge_daily", channels=[CHANNELS[0]])
    sync()
    assert check.methods == "POST"
    assert check.name == "charge_daily"


def test_jobs_that_never_ping_their_slug_get_no_check(hc, configured):
    # A check for a job with --no-ping (or --ping to another check) would never be pinged:
    # it would go down after its first slot and alert on every one after.
    other = hc.add(slug="elsewhere")
    (configured / "20-quiet.cron").write_text(
        "* * * * * --name=metrics --timeout=50s --no-ping sleep_demo --seconds=0\n"
        f"0 5 * * * --name=pinged-elsewhere --ping={other.uuid} sleep_demo --seconds=0\n"
    )
    code, out, _ = sync()
    assert code == 0
    slugs = {c.slug for c in hc.checks.values()}
    assert "metrics" not in slugs and "pinged-elsewhere" not in slugs
    assert "metrics" not in out and "pinged-elsewhere" not in out
    # One made by an older sync is this project's, and now stale.
    (configured / "20-quiet.cron").write_text("0 6 * * * --name=metrics sleep_demo --seconds=0\n")
    sync()
    (configured / "20-quiet.cron").write_text(
        "* * * * * --name=metrics --no-ping sleep_demo --seconds=0\n"
    )
    code, out, _ = sync("--prune")
    assert "deleted      metrics" in out


def test_a_ping_override_naming_the_jobs_own_check_keeps_it(hc, configured):
    # `--ping` with the UUID (or ping URL) of the very check sync made for the job: the job
    # pings it, so it is neither stale nor deleted by --prune.
    (configured / "20-own.cron").write_text("0 6 * * * --name=own sleep_demo --seconds=0\n")
    sync()
    [own] = [c for c in hc.checks.values() if c.slug == "own"]
    for ping in (own.uuid, f"https://hc-ping.com/{own.uuid}", "https://hc-ping.com/pk/own"):
        (configured / "20-own.cron").write_text(
            f"0 6 * * * --name=own --ping={ping} sleep_demo --seconds=0\n"
        )
        code, out, _ = sync("--prune")
        assert code == 0, out
        assert "deleted      own" not in out and "stale" not in out, out
        assert any(c.slug == "own" for c in hc.checks.values())


# --- the server's rules: channels, the read-only key, body filters -------------------------


@pytest.mark.parametrize("where", ["setting", "environment"])
def test_an_empty_channels_setting_creates_checks_with_no_integrations(
    hc, configured, settings, monkeypatch, where
):
    # HEALTHCHECKS_CHANNELS="" is documented as "none": the server takes "" as no channels.
    if where == "setting":
        settings.HEALTHCHECKS_CHANNELS = ""
    else:
        del settings.HEALTHCHECKS_CHANNELS
        monkeypatch.setenv("HEALTHCHECKS_CHANNELS", "")
    code, out, _ = sync()
    assert code == 0
    assert hc.writes()[0][2]["channels"] == ""
    assert {tuple(c.channels) for c in hc.checks.values()} == {()}
    created = "created      charge_daily: cron '0 3 * * *' Europe/Moscow, grace 30m, no channels"
    assert created in out


def test_an_unset_channels_setting_means_every_integration(hc, configured, settings, monkeypatch):
    del settings.HEALTHCHECKS_CHANNELS
    monkeypatch.delenv("HEALTHCHECKS_CHANNELS", raising=False)
    sync()
    assert {tuple(c.channels) for c in hc.checks.values()} == {tuple(CHANNELS)}


def test_a_channel_the_server_does_not_know_is_its_400(hc, configured, settings):
    settings.HEALTHCHECKS_CHANNELS = f"{CHANNELS[0]},nope"
    code, _, error = sync()
    assert code == 1
    assert error.endswith("400 rejected: invalid channel identifier: nope")
    assert hc.checks == {}


def test_a_read_only_key_is_refused_in_one_line_before_anything_is_changed(
    hc, configured, settings
):
    sync()
    # An update, and a check --prune would delete: neither may happen.
    changed = CRON.replace("--timeout=30m", "--timeout=45m").replace("@reboot", "# @reboot")
    (configured / "10-app.cron").write_text(changed)
    settings.HEALTHCHECKS_API_KEY = READ_KEY
    writes = len(hc.writes())
    for args in ((), ("--prune",), ("--dry-run",)):
        code, out, error = sync(*args)
        assert code == 1
        assert error == (
            "healthchecks.io: HEALTHCHECKS_API_KEY is the project's read-only API key: "
            "sync_healthchecks needs its read-write key (Project Settings → API Access); "
            "nothing was changed"
        )
        assert out == ""
    assert len(hc.writes()) == writes
    assert READ_KEY not in error


def test_a_read_only_key_of_a_project_without_checks_is_refused_too(hc, configured, settings):
    settings.HEALTHCHECKS_API_KEY = READ_KEY
    code, out, error = sync()
    assert code == 1
    assert "is the project's read-only API key" in error
    assert hc.writes() == [] and out == ""


def test_a_check_filtering_by_body_is_named_with_what_the_filter_does(hc, configured):
    sync()
    charge = hc.check("charge_daily")
    charge.name = "Daily billing"
    charge.filter_http_body, charge.success_kw, charge.failure_kw = True, "SUCCESS", "ERROR"
    tick = hc.check("tick")
    tick.filter_http_body, tick.filter_default_fail = True, True
    code, out, err, _ = sync_with_stderr()
    assert code == 0
    assert out.strip() == "healthchecks.io: nothing to change (4 checks up to date)"
    lines = [line for line in err.splitlines() if line.startswith("warning: check ")]
    advice = (
        ". Turn keyword filtering of HTTP bodies off in the check's Filtering Rules (or set "
        "filter_http_body to false through the API) to keep the exit status authoritative"
    )
    assert lines[0] == (
        "warning: check 'Daily billing' (charge_daily) filters by HTTP body: a ping's body "
        "decides what it is, not its exit status ('ERROR' → failure; 'SUCCESS' → success; "
        "anything else → ignored): a failed run whose output has 'SUCCESS' counts as a "
        "success; a run whose output has no keyword changes nothing (a failure never alerts, "
        "a success never counts); the empty /start is ignored (no duration); only the end of "
        "the output is sent: a keyword printed before it is cut away" + advice
    )
    assert lines[1] == (
        "warning: check 'tick' (tick) filters by HTTP body: a ping's body decides what it is, "
        "not its exit status (no keyword is set: every ping → failure): the empty /start is a "
        "failure, so every run alerts" + advice
    )
    assert len(lines) == 2


# --- what sync prints ---------------------------------------------------------------------


def test_prune_names_a_kept_copy_only_when_asked(hc, configured):
    sync()
    hc.copy(hc.check("charge_daily"))
    code, out, _ = sync("--prune")
    assert code == 0
    assert out.strip() == "healthchecks.io: nothing to change (4 checks up to date)"
    code, out, _ = sync("--prune", "--dry-run")
    assert "kept         charge_daily-copy" in out
    out = io.StringIO()
    call_command("sync_healthchecks", "--prune", verbosity=2, stdout=out)
    assert "kept         charge_daily-copy" in out.getvalue()


def test_the_stale_check_of_a_job_with_no_ping_says_why_it_is_stale(hc, configured):
    (configured / "20-quiet.cron").write_text("0 6 * * * --name=metrics sleep_demo --seconds=0\n")
    sync()
    (configured / "20-quiet.cron").write_text(
        "0 6 * * * --name=metrics --no-ping sleep_demo --seconds=0\n"
    )
    code, out, _ = sync()
    assert code == 0
    assert (
        f"stale        metrics: tagged {TAG!r}, its job pings no check (--no-ping) "
        "(--prune deletes it)"
    ) in out
    other = hc.add(slug="elsewhere")
    (configured / "20-quiet.cron").write_text(
        f"0 6 * * * --name=metrics --ping={other.uuid} sleep_demo --seconds=0\n"
    )
    assert (
        f"stale        metrics: tagged {TAG!r}, its job pings another check (--ping) "
        "(--prune deletes it)"
    ) in sync()[1]
