"""sync_healthchecks against a server on 127.0.0.1 that answers like the healthchecks.io API v3.

`FakeHealthchecks` follows the documented behaviour (and healthchecks' own views): `X-Api-Key`
of exactly 32 characters else 401 `missing api key`, a wrong key 401 `wrong api key`; upsert
with `unique: ["slug"]` answers 201 created / 200 updated; strict validation answers 400 with
`json validation error: <field> ...` (nulls included); `channels` omitted leaves them alone,
`*` assigns all; `GET ?tag=` lists; `DELETE /checks/<uuid>` removes.
"""

import io
import json
import re
import textwrap
import uuid
import zoneinfo

import pytest
from cronsim import CronSim, CronSimError
from django.core.management import call_command
from django.core.management.base import CommandError
from werkzeug import Response

from ops.crontabd import parse_text
from ops.hcapi import ApiError, HealthchecksAPI

API_KEY = "hcw_" + "k3y" * 9 + "a"  # 32 characters, like a real key
assert len(API_KEY) == 32
CHANNELS = ["4f1e8c0a-0000-4000-8000-00000000000a", "4f1e8c0a-0000-4000-8000-00000000000b"]
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


class FakeHealthchecks:
    """An in-memory healthchecks project behind pytest-httpserver."""

    STR_FIELDS = ("name", "slug", "tags", "desc", "schedule", "tz", "channels", "methods")
    SECONDS_FIELDS = ("grace", "timeout")

    def __init__(self, server, key=API_KEY):
        self.server = server
        self.key = key
        self.checks: dict[str, dict] = {}
        self.log: list[tuple[str, str, dict | None]] = []
        self.fail_with: tuple[int, dict] | None = None
        server.expect_request(re.compile(r"^/api/v3/checks/.*")).respond_with_handler(self.handle)

    @property
    def url(self) -> str:
        return self.server.url_for("/api/v3/")

    # --- state helpers for tests ------------------------------------------------------------

    def add(self, **fields) -> dict:
        check = {
            "uuid": str(uuid.uuid4()),
            "name": fields.get("slug", ""),
            "slug": "",
            "tags": "",
            "desc": "",
            "grace": 3600,
            "kind": "simple",
            "timeout": 86400,
            "schedule": "* * * * *",
            "tz": "UTC",
            "channels": [],
        }
        check.update(fields)
        self.checks[check["uuid"]] = check
        return check

    def by_slug(self, slug) -> dict:
        return next(c for c in self.checks.values() if c["slug"] == slug)

    def writes(self):
        return [(m, p, b) for m, p, b in self.log if m != "GET"]

    # --- the API ----------------------------------------------------------------------------

    def to_dict(self, check) -> dict:
        update_url = self.server.url_for(f"/api/v3/checks/{check['uuid']}")
        result = {
            "name": check["name"],
            "slug": check["slug"],
            "tags": check["tags"],
            "desc": check["desc"],
            "grace": check["grace"],
            "n_pings": 0,
            "status": "new",
            "started": False,
            "last_ping": None,
            "next_ping": None,
            "manual_resume": False,
            "methods": "",
            "ping_url": "https://hc-ping.example/" + check["uuid"],
            "update_url": update_url,
            "pause_url": update_url + "/pause",
            "resume_url": update_url + "/resume",
            "channels": ",".join(sorted(check["channels"])),
        }
        if check["kind"] == "simple":
            result["timeout"] = check["timeout"]
        else:
            result["schedule"], result["tz"] = check["schedule"], check["tz"]
        return result

    def handle(self, request):
        body = None
        if request.method == "POST":
            try:
                body = json.loads(request.get_data() or b"null")
            except ValueError:
                return self.json({"error": "could not parse request body"}, 400)
        self.log.append((request.method, request.path, body))
        key = request.headers.get("X-Api-Key", "")
        if len(key) != 32:
            return self.json({"error": "missing api key"}, 401)
        if key != self.key:
            return self.json({"error": "wrong api key"}, 401)
        if self.fail_with is not None:
            status, document = self.fail_with
            return self.json(document, status)
        code = request.path.removeprefix("/api/v3/checks/").strip("/")
        if request.method == "GET" and not code:
            return self.list(request)
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
        return self.json(self.to_dict(check), 200)

    def list(self, request):
        tags = set(request.args.getlist("tag"))
        slug = request.args.get("slug")
        found = [
            self.to_dict(c)
            for c in self.checks.values()
            if tags.issubset(c["tags"].split()) and (slug is None or c["slug"] == slug)
        ]
        return self.json({"checks": found}, 200)

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
                if value > 31_536_000:
                    return f"json validation error: {key} is too large"
        if "name" in body and len(body["name"]) > 100:
            return "json validation error: name is too long"
        if "slug" in body and not re.fullmatch(r"[a-z0-9-_]*", body["slug"]):
            return "json validation error: slug does not match pattern"
        if "schedule" in body:
            try:
                if len(body["schedule"].split()) != 5:
                    raise CronSimError("not five fields")
                next(CronSim(body["schedule"], __import__("datetime").datetime(2000, 1, 1)))
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
            existing = next((c for c in self.checks.values() if c["slug"] == body["slug"]), None)
        if existing is None:
            check = self.add(name="", slug="", grace=3600, kind="simple", timeout=86400)
            self.update(check, body)
            return self.json(self.to_dict(check), 201)
        self.update(existing, body)
        return self.json(self.to_dict(existing), 200)

    def update(self, check, body):
        if "channels" in body:
            value = body["channels"]
            check["channels"] = (
                list(CHANNELS) if value == "*" else [c for c in value.split(",") if c]
            )
        if "schedule" in body:
            check["kind"], check["schedule"] = "cron", body["schedule"]
        elif "timeout" in body:
            check["kind"], check["timeout"] = "simple", body["timeout"]
        for key in ("name", "slug", "tags", "desc", "tz", "grace"):
            if key in body:
                check[key] = body[key]

    @staticmethod
    def json(document, status):
        return Response(json.dumps(document), status=status, content_type="application/json")


@pytest.fixture
def hc(httpserver):
    return FakeHealthchecks(httpserver)


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
    assert charge["desc"] == "Charge every active subscription once per logical day."
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
    assert [m for m, _, _ in hc.log[-1:]] == ["GET"]  # one listing by tag, nothing else


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
        f"healthchecks.io: listing checks tagged {TAG!r}: 401 wrong api key: "
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
    hc.fail_with = (400, {"error": "json validation error: grace is too small"})
    code, _, error = sync()
    assert code == 1
    assert error == (
        f"healthchecks.io: listing checks tagged {TAG!r}: 400 rejected: "
        "json validation error: grace is too small"
    )


def test_the_fake_api_rejects_null_fields_and_the_client_never_sends_them(hc):
    api = HealthchecksAPI(hc.url, API_KEY)
    with pytest.raises(ApiError) as error:
        api._request("POST", "checks/", "raw", json={"slug": "x", "desc": None})
    assert str(error.value) == "raw: 400 rejected: json validation error: desc is not a string"
    created, check = api.upsert({"slug": "x", "name": "x", "desc": None, "grace": 60})
    assert created is True
    assert check["desc"] == ""
    assert hc.log[-1][2] == {"slug": "x", "name": "x", "grace": 60, "unique": ["slug"]}


def test_a_schedule_the_api_cannot_read_is_a_400_on_the_upsert(hc):
    api = HealthchecksAPI(hc.url, API_KEY)
    with pytest.raises(ApiError) as error:
        api.upsert({"slug": "x", "schedule": "@daily"})
    assert error.value.status == 400
    assert "schedule is not a valid cron" in str(error.value)


def test_rate_limiting_is_one_clear_line(hc, configured):
    hc.fail_with = (429, {"error": "rate limit exceeded"})
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
        f"healthchecks.io: listing checks tagged {TAG!r}: cannot reach the healthchecks.io API "
        f"at http://127.0.0.1:{port}/api/v3/ (connection failed)"
    )


def test_without_an_api_key_it_says_where_to_get_one(configured, settings):
    settings.HEALTHCHECKS_API_KEY = ""
    code, _, error = sync()
    assert code == 2
    assert "HEALTHCHECKS_API_KEY is not set" in error


def test_the_default_tag_names_the_project_directory(settings):
    from ops.hcsync import project_tag

    settings.OPS_HC_TAG = ""
    settings.BASE_DIR = "/srv/My Shop"
    assert project_tag(settings) == "cronops-my-shop"
    settings.OPS_HC_TAG = "shop-prod"  # OPS_HC_TAG in .env
    assert project_tag(settings) == "shop-prod"


def test_job_specs_are_built_from_crontab_d():
    from ops.hcsync import desired_spec

    job = parse_text("# Nightly.\n0 3 * * * --timeout=2h x\n", "t.cron").jobs[0]
    assert desired_spec(job, tz="UTC", tag="t") == {
        "name": "x",
        "slug": "x",
        "tags": "t",
        "desc": "Nightly.",
        "grace": 7200,
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
