"""export_schedule --format=kubernetes: crontab.d as batch/v1 CronJobs.

Every manifest is checked against the official Kubernetes OpenAPI schemas that the
`kubernetes-validate` package carries (offline, strict: unknown fields are errors), for every
version it ships from 1.27 (the first with a stable `timeZone`) to the newest. The schedule
rules are checked against a transcription of robfig/cron v3 (the parser Kubernetes uses) on one
side and cronsim (Debian's rules, the runner's slot maths) on the other.
"""

import datetime as dt
import io
import math
import shutil
import urllib.parse
from pathlib import Path

import pytest
import yaml
from cronsim import CronSim
from django.core.management import call_command
from django.core.management.base import CommandError
from kubernetes_validate import ValidationError
from kubernetes_validate import validate as k8s_validate
from kubernetes_validate.utils import all_versions

from ops.schedule import kubernetes, kubernetes_yaml
from ops.schedule.crontabd import parse_text
from ops.schedule.kubernetes import ExportError, ExportOptions

from .conftest import DAILY, REPO, wait_for_line

POSTGRES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "app"}}
SQLITE = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/app/var/db.sqlite3"}}
OPTIONS = ExportOptions(image="registry.example/shop:1.4.2", env_secrets=("shop-env",))
K8S_VERSIONS = sorted(
    {v for v in all_versions() if tuple(int(x) for x in v.split(".")[:2]) >= (1, 27)},
    key=lambda v: tuple(int(x) for x in v.split(".")),
)


def test_kubernetes_validate_ships_the_versions_this_file_checks():
    assert K8S_VERSIONS[0] == "1.27.0"
    assert len(K8S_VERSIONS) >= 5, K8S_VERSIONS


def crontab_dir(tmp_path: Path, *files: str) -> Path:
    """A crontab.d with the given files (10-a.cron, 20-b.cron, ...)."""
    directory = tmp_path / "crontab.d"
    directory.mkdir(exist_ok=True)
    for i, text in enumerate(files, start=1):
        (directory / f"{i}0-jobs.cron").write_text(text)
    return directory


TODAY = dt.date(2026, 12, 1)


def export(directory, options=OPTIONS, time_zone="UTC", databases=POSTGRES) -> list[dict]:
    return kubernetes.export(
        options, databases=databases, time_zone=time_zone, today=TODAY, crontab_dir=directory
    )


def parsed(documents: list[dict]) -> list[dict]:
    """What a reader of the printed stream gets (PyYAML, as kubectl would parse it)."""
    return list(yaml.safe_load_all(kubernetes_yaml.yaml_stream(documents)))


def by_name(documents: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in documents}


# --- the mapping, field by field ----------------------------------------------------------------


def test_the_projects_own_crontab_d_becomes_one_cronjob_per_job_field_by_field():
    options = ExportOptions(
        image="registry.example/shop:1.4.2", env_secrets=("shop-env",), namespace="shop"
    )
    documents = parsed(export(REPO / "crontab.d", options, time_zone="Europe/Moscow"))
    jobs = by_name(documents)
    assert list(jobs) == [
        "charge-daily",
        "summarise-charges",
        "task-worker",
        "clear-sessions",
        "prune-runs",
        "metrics",
        "prune-metrics",
    ]

    charge = jobs["charge-daily"]
    assert charge["apiVersion"] == "batch/v1" and charge["kind"] == "CronJob"
    assert charge["metadata"]["namespace"] == "shop"
    labels = {
        "app.kubernetes.io/name": "cronops",
        "app.kubernetes.io/managed-by": "cronops",
        "cronops/job": "charge_daily",  # the original name, '_' and all
    }
    assert charge["metadata"]["labels"] == labels
    assert charge["metadata"]["annotations"] == {
        "cronops/source": "10-billing.cron:2",
        "cronops/description": "Charge every active subscription once per logical day "
        "(Moscow time in production).",
    }
    spec = charge["spec"]
    assert spec["schedule"] == "0 3 * * *"
    assert spec["timeZone"] == "Europe/Moscow"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] == 3600
    assert spec["successfulJobsHistoryLimit"] == 3
    assert spec["failedJobsHistoryLimit"] == 3
    assert spec["jobTemplate"]["metadata"]["labels"] == labels
    job_spec = spec["jobTemplate"]["spec"]
    assert job_spec["backoffLimit"] == 0
    # --timeout=30m and --kill-after's 10 s for the current slot and each of --catch-up=3
    # earlier ones, plus 5m
    assert job_spec["activeDeadlineSeconds"] == 4 * (30 * 60 + 10) + 300
    pod = job_spec["template"]
    assert pod["metadata"]["labels"] == labels
    assert pod["spec"]["restartPolicy"] == "Never"
    assert "serviceAccountName" not in pod["spec"]
    [container] = pod["spec"]["containers"]
    assert container["image"] == "registry.example/shop:1.4.2"
    assert container["command"] == ["python", "manage.py", "run_job", "charge_daily"]
    assert container["envFrom"] == [{"secretRef": {"name": "shop-env"}}]
    assert {"name": "TIME_ZONE", "value": "Europe/Moscow"} in container["env"]
    # Each pod is its own host in the claims, whatever OPS_HOST the Secret carries.
    assert {"name": "OPS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in (
        container["env"]
    )
    lock = next(e["value"] for e in container["env"] if e["name"] == "OPS_LOCK_DIR")
    assert container["volumeMounts"] == [{"name": "cronops-lock", "mountPath": lock}]
    assert pod["spec"]["volumes"] == [{"name": "cronops-lock", "emptyDir": {}}]
    assert "resources" not in container and "workingDir" not in container

    sessions = jobs["clear-sessions"]
    assert sessions["spec"]["schedule"] == "@daily"
    assert sessions["metadata"]["labels"]["cronops/job"] == "clear-sessions"
    assert sessions["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 10 * 60 + 10 + 300
    command = sessions["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    # run_job by job name: the image's crontab.d supplies --timeout and the command itself
    assert command["command"] == ["python", "manage.py", "run_job", "clear-sessions"]

    prune = jobs["prune-runs"]
    assert prune["spec"]["schedule"] == "30 4 * * *"
    assert prune["metadata"]["annotations"]["cronops/source"] == "95-cronops.cron:3"
    assert prune["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 30 * 60 + 10 + 300


def test_options_reach_their_fields_and_resources_only_when_given(tmp_path):
    directory = crontab_dir(tmp_path, "*/15 * * * *  --name=tick sleep_demo --seconds=0\n")
    options = ExportOptions(
        image="img:1",
        env_secrets=("base-env", "extra-env"),
        namespace="jobs",
        service_account="cron-runner",
        starting_deadline=600,
        deadline_margin=60,
        successful_history=1,
        failed_history=5,
        app="shop",
        python="/app/.venv/bin/python",
        workdir="/app",
        requests=kubernetes.parse_resources("memory=128Mi,cpu=100m", "--requests"),
        limits=kubernetes.parse_resources("memory=256Mi", "--limits"),
    )
    [tick] = parsed(export(directory, options))
    spec = tick["spec"]
    assert spec["startingDeadlineSeconds"] == 600
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (1, 5)
    assert tick["metadata"]["labels"]["app.kubernetes.io/name"] == "shop"
    job_spec = spec["jobTemplate"]["spec"]
    assert "activeDeadlineSeconds" not in job_spec  # no --timeout: as long as under cron
    pod = job_spec["template"]["spec"]
    assert pod["serviceAccountName"] == "cron-runner"
    [container] = pod["containers"]
    assert container["command"] == ["/app/.venv/bin/python", "manage.py", "run_job", "tick"]
    assert container["workingDir"] == "/app"
    assert container["envFrom"] == [
        {"secretRef": {"name": "base-env"}},
        {"secretRef": {"name": "extra-env"}},
    ]
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }


# --- the official schemas ---------------------------------------------------------------------

AWKWARD = """\
# Quotes " and ', a backslash \\, a colon: and # hash, 'Zürich' → ☃ 🚀, {not: a map}
0 2 * * 1-5   --timeout=90s --catch-up=2 charge_daily
# Yearly, by name.
@annually     --name=yearly_report --no-ping sleep_demo --seconds=0
*/5 9-17 * jan-mar,oct MON-FRI  --name=office sleep_demo --seconds=1
"""


def every_kind_of_manifest(tmp_path) -> list[dict]:
    full = ExportOptions(
        image="registry.example:5000/shop/app@sha256:" + "a" * 64,
        env_secrets=("shop-env",),
        namespace="shop",
        service_account="cron",
        workdir="/srv/app",
        requests={"cpu": "250m", "memory": "256Mi", "ephemeral-storage": "1Gi"},
        limits={"memory": "512Mi"},
    )
    plain = export(REPO / "crontab.d", OPTIONS, time_zone="UTC")
    return plain + export(crontab_dir(tmp_path, AWKWARD), full, time_zone="America/New_York")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_passes_the_official_schema_strictly(tmp_path, version):
    documents = parsed(every_kind_of_manifest(tmp_path))
    assert len(documents) == 10  # the project's seven jobs and three awkward ones
    for document in documents:
        assert k8s_validate(document, version, strict=True) == version.rsplit(".", 1)[0]


@pytest.mark.parametrize("version", [K8S_VERSIONS[0], K8S_VERSIONS[-1]])
def test_the_strict_schema_check_would_catch_a_misspelt_field(tmp_path, version):
    """The control for the test above: the validator does reject what Kubernetes rejects."""
    [document] = parsed(export(crontab_dir(tmp_path, "@daily charge_daily\n")))
    container = document["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    container["envfrom"] = container.pop("envFrom")
    with pytest.raises(ValidationError, match="envfrom"):
        k8s_validate(document, version, strict=True)


def test_the_yaml_reads_back_exactly_as_the_manifests_were_built(tmp_path):
    documents = every_kind_of_manifest(tmp_path)
    assert parsed(documents) == documents
    weird = {"a": "line\nbreak\ttab \x7f del \u2028 ls \x85 nel \ufeff bom", "b": [[], {}]}
    assert yaml.safe_load(kubernetes_yaml.to_yaml(weird)) == weird


# --- schedules: Kubernetes reads them as Debian does, or they are refused ----------------------

REFUSED = [
    ("0 3 * * 7   charge_daily", "day of week 7 in '7' is Sunday to Debian's cron"),
    ("0 3 * * 5-7 charge_daily", "day of week 7 in '5-7'"),
    ("0 3 * * 1,6-7 charge_daily", "day of week 7 in '1,6-7'"),
    ("0 3 */2 * 1 charge_daily", "day of month '*/2' and day of week '1': Debian's cron runs"),
    ("0 3 1 * */2 charge_daily", "day of month '1' and day of week '*/2'"),
    ("0 3 */10 * mon-fri charge_daily", "match both (a day field starting with '*'"),
    ("0 3 1,* * 1 charge_daily", "match either (a day field starting with '*'"),
    ("@reboot charge_daily", "@reboot has no Kubernetes equivalent"),
]


@pytest.mark.parametrize(("line", "message"), REFUSED)
def test_a_schedule_kubernetes_reads_differently_is_refused_with_file_and_line(
    tmp_path, line, message
):
    directory = crontab_dir(tmp_path, f"# fine\n@hourly --name=ok sleep_demo\n\n{line}\n")
    with pytest.raises(ExportError) as caught:
        export(directory)
    text = str(caught.value)
    assert text.startswith(f"{directory / '10-jobs.cron'}:4: charge_daily: "), text
    assert message in text
    assert "\n" not in text


ACCEPTED = [
    "0 3 * * *",
    "*/15 * * * *",
    "0 3 */2 * *",  # a step in a day field, the other one '*': AND for both
    "0 3 * * */2",
    "0 3 */1 * 1",  # '*/1' is a star for both
    "0 3 1,15 * 1",  # neither is a star: OR for both
    "0 3 1-7 * mon",
    "0 0 * * 0",
    "0 0 * * sun",
    "5 4 * JAN-MAR,oct MON-FRI",
    "0 0 31 1,3,5 *",
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
]


@pytest.mark.parametrize("schedule", ACCEPTED)
def test_a_schedule_kubernetes_reads_the_same_is_written_as_it_stands(schedule):
    job = parse_text(f"{schedule} charge_daily\n", "10-billing.cron").jobs[0]
    assert kubernetes.kubernetes_schedule(job) == job.schedule


# A transcription of robfig/cron v3 (kubernetes/kubernetes vendor/github.com/robfig/cron/v3:
# parser.go getRange/getField, spec.go bounds and dayMatches), for the day fields.
STAR_BIT = 1 << 63
MONTH_NAMES = "jan feb mar apr may jun jul aug sep oct nov dec".split()
ROBFIG_BOUNDS = {
    "dom": (1, 31, {}),
    "month": (1, 12, {m: i for i, m in enumerate(MONTH_NAMES, 1)}),
    "dow": (0, 6, {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}),
}


def robfig_field(text: str, kind: str) -> int:
    low, high, names = ROBFIG_BOUNDS[kind]

    def number(word):
        return names[word.lower()] if word.lower() in names else int(word)

    bits = 0
    for expr in [e for e in text.split(",") if e]:
        range_and_step = expr.split("/")
        low_and_high = range_and_step[0].split("-")
        extra = 0
        if low_and_high[0] in ("*", "?"):
            start, end, extra = low, high, STAR_BIT
        else:
            start = number(low_and_high[0])
            end = number(low_and_high[1]) if len(low_and_high) == 2 else start
        step = 1
        if len(range_and_step) == 2:
            step = int(range_and_step[1])
            if len(low_and_high) == 1:
                end = high
            if step > 1:
                extra = 0
        if start < low or end > high or start > end or step == 0:
            raise ValueError(f"robfig/cron rejects {expr!r}")
        for i in range(start, end + 1, step):
            bits |= 1 << i
        bits |= extra
    return bits


def robfig_days(dom: str, month: str, dow: str, first: dt.date, days: int) -> set[dt.date]:
    dom_bits, month_bits, dow_bits = (
        robfig_field(dom, "dom"),
        robfig_field(month, "month"),
        robfig_field(dow, "dow"),
    )
    found = set()
    for n in range(days):
        date = first + dt.timedelta(days=n)
        go_weekday = (date.weekday() + 1) % 7  # Go: Sunday is 0
        dom_match = bool(1 << date.day & dom_bits)
        dow_match = bool(1 << go_weekday & dow_bits)
        if dom_bits & STAR_BIT or dow_bits & STAR_BIT:
            matches = dom_match and dow_match
        else:
            matches = dom_match or dow_match
        if 1 << date.month & month_bits and matches:
            found.add(date)
    return found


def debian_days(dom: str, month: str, dow: str, first: dt.date, days: int) -> set[dt.date]:
    start = dt.datetime.combine(first, dt.time()) - dt.timedelta(minutes=1)
    end = start + dt.timedelta(days=days)
    found = set()
    for fire in CronSim(f"0 0 {dom} {month} {dow}", start):
        if fire >= end:
            return found
        found.add(fire.date())
    return found


DAY_FIELDS = [
    ("*", "*", "*"),
    ("*/2", "*", "*"),
    ("*", "*", "*/2"),
    ("*/2", "*", "1"),
    ("1", "*", "*/2"),
    ("*/10", "*", "mon-fri"),
    ("1,*", "*", "1"),
    ("*/1", "*", "1"),
    ("1,15", "*", "1"),
    ("1-7", "*", "mon"),
    ("*/3", "feb", "*/3"),
    ("13", "*", "fri"),
    ("31", "jan,mar,may", "*"),
    ("*", "*/2", "0"),
    ("1", "*", "*"),
    ("*/2", "*/3", "*/2,3"),
    ("*/2,2-30/2", "*", "0-6"),  # stars differ, but every day matches both: AND = OR
]


@pytest.mark.parametrize(("dom", "month", "dow"), DAY_FIELDS)
def test_an_exported_schedule_fires_on_the_same_days_under_both_parsers(dom, month, dow):
    """Over four years (a leap day and every weekday of every date): the exporter accepts
    exactly the day fields on which robfig/cron and Debian's rules (cronsim) pick the same
    days, and refuses the others."""
    job = parse_text(f"0 0 {dom} {month} {dow} charge_daily\n", "10-billing.cron").jobs[0]
    first, days = dt.date(2025, 1, 1), 4 * 366
    same = robfig_days(dom, month, dow, first, days) == debian_days(dom, month, dow, first, days)
    try:
        kubernetes.kubernetes_schedule(job)
        accepted = True
    except ExportError:
        accepted = False
    assert accepted == same


def test_debians_sunday_7_is_an_error_for_kubernetes_parser():
    with pytest.raises(ValueError, match="rejects"):
        robfig_field("7", "dow")
    with pytest.raises(ValueError, match="rejects"):
        robfig_field("5-7", "dow")
    assert robfig_field("*/7", "dow") == 1  # Sunday only, like Debian's {0, 7}


# --- names --------------------------------------------------------------------------------------


def test_job_names_become_dns_names_and_keep_the_original_in_a_label(tmp_path):
    directory = crontab_dir(tmp_path, "@daily --name=nightly_report_v2 sleep_demo\n")
    [document] = export(directory)
    assert document["metadata"]["name"] == "nightly-report-v2"
    assert document["metadata"]["labels"]["cronops/job"] == "nightly_report_v2"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("warmup_", "'warmup-' must start and end with a letter or digit"),
        ("warmup-", "'warmup-' must start and end with a letter or digit"),
        ("a" * 53, "is 53 characters, Kubernetes allows 52 for a CronJob"),
    ],
)
def test_a_job_name_that_cannot_be_a_cronjob_name_is_refused_with_file_and_line(
    tmp_path, name, message
):
    directory = crontab_dir(tmp_path, f"\n@daily --name={name} sleep_demo\n")
    with pytest.raises(ExportError) as caught:
        export(directory)
    assert str(caught.value).startswith(f"{directory / '10-jobs.cron'}:2: job name '{name}' ")
    assert message in str(caught.value)


def test_a_52_character_name_is_still_fine(tmp_path):
    directory = crontab_dir(tmp_path, f"@daily --name={'a' * 52} sleep_demo\n")
    assert export(directory)[0]["metadata"]["name"] == "a" * 52


def test_two_jobs_whose_names_collide_after_mapping_are_refused_naming_both(tmp_path):
    directory = crontab_dir(
        tmp_path,
        "0 3 * * * charge_daily\n",
        "# again\n0 4 * * * --name=charge-daily charge_daily\n",
    )
    with pytest.raises(ExportError) as caught:
        export(directory)
    assert str(caught.value) == (
        f"{directory / '20-jobs.cron'}:2: job name 'charge-daily' becomes the CronJob name "
        f"'charge-daily', like 'charge_daily' at {directory / '10-jobs.cron'}:1 ('_' becomes "
        "'-'): rename one with --name="
    )


# --- settings and options -----------------------------------------------------------------------


def test_sqlite_is_refused_in_one_line_before_crontab_d_is_read(tmp_path):
    directory = crontab_dir(tmp_path, "0 3 * * 7 charge_daily\n")  # would be refused too
    with pytest.raises(ExportError) as caught:
        export(directory, databases=SQLITE)
    text = str(caught.value)
    assert text.startswith("DATABASE_URL is SQLite: ")
    assert "shared" in text and "PostgreSQL" in text
    assert "db.sqlite3" not in text and "\n" not in text


def test_a_crontab_d_error_is_the_validators_own_line(tmp_path):
    directory = crontab_dir(tmp_path, "0 3 * * * charge_daily --no-such-option\n")
    with pytest.raises(ExportError, match=r"10-jobs.cron:1: charge_daily's arguments: "):
        export(directory)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "US/Eastern", "Etc/GMT+3", "EST5EDT"])
def test_time_zones_kubernetes_and_python_both_know_are_written_as_they_stand(tmp_path, zone):
    [document] = export(crontab_dir(tmp_path, "@daily charge_daily\n"), time_zone=zone)
    assert document["spec"]["timeZone"] == zone
    container = document["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "TIME_ZONE", "value": zone} in container["env"]


@pytest.mark.parametrize(
    ("zone", "message"),
    [
        ("Local", "'Local' means the node's zone"),
        ("local", "'Local' means the node's zone"),
        ("Mars/Olympus_Mons", "not in the time-zone database"),
        ("Europe/Fifteen_Letters", "is not a name Kubernetes accepts"),  # a part > 14
        ("../etc/passwd", "is not a name Kubernetes accepts"),
        ("", "is not a name Kubernetes accepts"),
    ],
)
def test_a_time_zone_kubernetes_would_reject_is_refused(tmp_path, zone, message):
    with pytest.raises(ExportError, match=message):
        export(crontab_dir(tmp_path, "@daily charge_daily\n"), time_zone=zone)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"image": ""}, "--image ''"),
        ({"image": "shop app"}, "no spaces"),
        ({"namespace": "Shop"}, "--namespace 'Shop'"),
        ({"env_secrets": ()}, "--env-secret: name the Secret"),
        ({"env_secrets": ("shop_env",)}, "--env-secret 'shop_env'"),
        ({"service_account": "-sa"}, "--service-account '-sa'"),
        ({"starting_deadline": 5}, "--starting-deadline: at least 10s"),
        ({"failed_history": -1}, "--failed-history: a count ≥ 0"),
        ({"app": "my app"}, "--app 'my app'"),
    ],
)
def test_an_option_kubernetes_would_reject_is_refused(tmp_path, changes, message):
    options = ExportOptions(**{**OPTIONS.__dict__, **changes})
    with pytest.raises(ExportError, match=message):
        export(crontab_dir(tmp_path, "@daily charge_daily\n"), options)


@pytest.mark.parametrize("text", ["cpu", "cpu=lots", "gpu=1", "memory=1Gi,"])
def test_a_malformed_resource_list_is_refused(text):
    with pytest.raises(ExportError, match=r"--requests .*NAME=QUANTITY"):
        kubernetes.parse_resources(text, "--requests")


def test_an_empty_crontab_d_is_refused(tmp_path):
    with pytest.raises(ExportError, match=r"crontab\.d has no jobs"):
        export(crontab_dir(tmp_path, "# nothing yet\n"))


# --- the command, in process ---------------------------------------------------------------------

# The command never connects; DATABASES only tells it which engine the pods will use.
in_process = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def run_command(settings, tmp_path, *args) -> str:
    settings.OPS_CRONTAB_DIR = crontab_dir(
        tmp_path, "0 3 * * * charge_daily\n@daily clearsessions\n"
    )
    out = io.StringIO()
    call_command(
        "export_schedule",
        "--format=kubernetes",
        "--image=img:1",
        "--env-secret=shop-env",
        *args,
        stdout=out,
    )
    return out.getvalue()


@in_process
def test_the_command_prints_one_stream_and_its_errors_exit_2(settings, tmp_path):
    settings.DATABASES = POSTGRES
    text = run_command(settings, tmp_path, "--starting-deadline=10m")
    assert text.startswith(kubernetes_yaml.HEADER + "---\n")
    documents = list(yaml.safe_load_all(text))
    assert [d["metadata"]["name"] for d in documents] == ["charge-daily", "clearsessions"]
    assert documents[0]["spec"]["startingDeadlineSeconds"] == 600
    with pytest.raises(CommandError) as caught:
        run_command(settings, tmp_path, "--deadline-margin=soon")
    assert caught.value.returncode == 2
    assert str(caught.value).startswith("--deadline-margin: bad duration 'soon'")


@in_process
@pytest.mark.parametrize("workdir", ["rel/dir", "app", "./app", "/my app", ""])
def test_a_workdir_that_is_not_an_absolute_path_is_refused_with_exit_2(settings, tmp_path, workdir):
    settings.DATABASES = POSTGRES
    with pytest.raises(CommandError) as caught:
        run_command(settings, tmp_path, f"--workdir={workdir}")
    assert caught.value.returncode == 2
    assert str(caught.value) == (
        f"--workdir {workdir!r}: an absolute path in the image, no spaces (e.g. /app)"
    )


@in_process
def test_an_absolute_workdir_is_the_containers_working_dir(settings, tmp_path):
    settings.DATABASES = POSTGRES
    documents = list(yaml.safe_load_all(run_command(settings, tmp_path, "--workdir=/srv/app")))
    container = documents[0]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["workingDir"] == "/srv/app"


@in_process
def test_output_dir_is_a_kustomization_listing_every_cronjob_file(settings, tmp_path):
    settings.DATABASES = POSTGRES
    target = tmp_path / "deploy" / "cron"
    said = run_command(settings, tmp_path, f"--output-dir={target}")
    assert said.strip() == f"wrote 2 CronJobs and kustomization.yaml to {target} (3 files)"
    kustomization = yaml.safe_load((target / "kustomization.yaml").read_text())
    assert kustomization == {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["cronjob-charge-daily.yaml", "cronjob-clearsessions.yaml"],
    }
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [*kustomization["resources"], "kustomization.yaml"]
    )
    for name in kustomization["resources"]:
        [document] = list(yaml.safe_load_all((target / name).read_text()))
        assert name == f"cronjob-{document['metadata']['name']}.yaml"
        k8s_validate(document, K8S_VERSIONS[-1], strict=True)

    # A job leaves crontab.d: its file goes with it, the rest is rewritten.
    (settings.OPS_CRONTAB_DIR / "10-jobs.cron").write_text("@daily clearsessions\n")
    call_command(
        "export_schedule",
        "--format=kubernetes",
        "--image=img:1",
        "--env-secret=shop-env",
        f"--output-dir={target}",
        stdout=io.StringIO(),
    )
    assert sorted(p.name for p in target.iterdir()) == [
        "cronjob-clearsessions.yaml",
        "kustomization.yaml",
    ]


@in_process
def test_output_dir_never_overwrites_files_it_did_not_write(settings, tmp_path):
    settings.DATABASES = POSTGRES
    target = tmp_path / "cron"
    target.mkdir()
    mine = "resources:\n  - my-cronjob.yaml\n"
    (target / "kustomization.yaml").write_text(mine)
    with pytest.raises(CommandError) as caught:
        run_command(settings, tmp_path, f"--output-dir={target}")
    assert caught.value.returncode == 2
    assert "kustomization.yaml was not written by export_schedule" in str(caught.value)
    assert (target / "kustomization.yaml").read_text() == mine
    assert [p.name for p in target.iterdir()] == ["kustomization.yaml"]


# --- a deployed copy, as a real process ---------------------------------------------------------


def test_a_deployed_project_exports_on_postgresql_and_refuses_sqlite(project):
    for path in (REPO / "crontab.d").glob("*.cron"):
        shutil.copy2(path, project.dir / "crontab.d" / path.name)
    args = (
        "export_schedule",
        "--format=kubernetes",
        "--image=registry.example/shop:1.4.2",
        "--env-secret=shop-env",
        "--namespace=shop",
    )
    first = project.manage(*args, env={"PYTHONHASHSEED": "1"})
    if project.db.backend == "sqlite":
        assert first.returncode == 2, first
        assert first.stdout == ""
        [line] = first.stderr.splitlines()
        assert line.startswith("CommandError: DATABASE_URL is SQLite: ")
        return
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    again = project.manage(*args, env={"PYTHONHASHSEED": "2"})
    assert again.returncode == 0, again.stderr
    assert again.stdout.encode() == first.stdout.encode()  # byte for byte
    documents = list(yaml.safe_load_all(first.stdout))
    assert [d["metadata"]["name"] for d in documents] == [
        "charge-daily",
        "summarise-charges",
        "task-worker",
        "clear-sessions",
        "prune-runs",
        "metrics",
        "prune-metrics",
    ]
    for document in documents:
        for version in (K8S_VERSIONS[0], K8S_VERSIONS[-1]):
            k8s_validate(document, version, strict=True)
    # The pods get their settings from the Secret: nothing from .env is written out.
    password = urllib.parse.urlsplit(project.db.url).password
    for secret in (project.settings["SECRET_KEY"], project.db.url, password):
        assert not secret or secret not in first.stdout


def test_a_usage_error_exits_2_before_anything_is_printed(sqlite_project):
    result = sqlite_project.manage("export_schedule", "--format=kubernetes", "--image=img:1")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--env-secret" in result.stderr


def pod_env(container: dict, pod: str, lock_dir: Path) -> dict:
    """The environment the manifest gives a pod named `pod` (its emptyDir at `lock_dir`)."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, item
            env[item["name"]] = pod
    assert env["OPS_LOCK_DIR"] == kubernetes.LOCK_DIR
    env["OPS_LOCK_DIR"] = str(lock_dir)
    return env


def test_two_pods_of_one_schedule_run_its_slot_once_with_the_manifests_env(pg_project, tmp_path):
    """The controller's "two Jobs for one schedule": two pods, each with its own lock
    directory, started with the env and the command of the exported manifest, share the
    PostgreSQL claim. The Secret carries OPS_HOST from a server's .env, as a copied .env would;
    the manifest's per-pod OPS_HOST must win, or each pod would take the other's live claim
    for a dead process of its own host."""
    project = pg_project
    project.write_env(OPS_HOST="web1")
    project.add_command(
        "slow_charge",
        """
        with open(os.environ["CHARGES"], "a") as f:
            f.write("charged\\n")
        print("charging", flush=True)
        go = os.environ["CHARGES"] + ".go"  # works until the second pod has tried
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)
        """,
    )
    project.write_cron("10-billing.cron", f"{DAILY} --timeout=1m slow_charge\n")  # 3 runs, 1 slot
    exported = project.manage(
        "export_schedule", "--format=kubernetes", "--image=img:1", "--env-secret=env"
    )
    assert exported.returncode == 0, exported.stderr
    [document] = yaml.safe_load_all(exported.stdout)
    [container] = document["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][:3] == ["python", "manage.py", "run_job"]
    command = container["command"][2:]
    charges = tmp_path / "charges.txt"

    def pod(name: str) -> dict:
        return {**pod_env(container, name, tmp_path / name / "lock"), "CHARGES": charges}

    first = project.popen(*command, env=pod("slow-charge-29000000-aaaaa"))
    wait_for_line(first, "charging")
    second = project.manage(*command, env=pod("slow-charge-29000000-bbbbb"))
    assert second.returncode == 75, second.stdout + second.stderr
    assert "slow-charge-29000000-aaaaa" in second.stdout + second.stderr
    Path(f"{charges}.go").touch()
    assert first.wait(60) == 0
    late = project.manage(*command, env=pod("slow-charge-29000000-ccccc"))
    assert late.returncode == 0, late.stderr
    assert "already done" in late.stdout
    assert charges.read_text() == "charged\n"
    hosts = project.db.query("SELECT host, outcome FROM ops_jobrun ORDER BY id")
    assert hosts[0] == ("slow-charge-29000000-aaaaa", "succeeded")
    assert {h for h, _ in hosts} == {f"slow-charge-29000000-{x * 5}" for x in "abc"}


def test_a_job_that_stands_by_gets_its_standby_bound_added_to_the_deadline(tmp_path, settings):
    """A second Job's pod for the slot may wait out the standby bound, then run the slot."""
    settings.OPS_HEARTBEAT_SECONDS = 30
    settings.OPS_STANDBY = ""
    directory = crontab_dir(
        tmp_path,
        "0 3 * * * --standby --timeout=10m --name=a clearsessions\n"
        "0 4 * * * --standby=5m --timeout=10m --name=b clearsessions\n"
        "0 5 * * * --timeout=10m --name=c clearsessions\n",
    )
    deadlines = {
        d["metadata"]["name"]: d["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"]
        for d in export(directory)
    }
    # the standby's bound (--timeout plus 3 heartbeats, or its own), then --timeout + --kill-after
    assert deadlines == {
        "a": 600 + 90 + 610 + 300,
        "b": 300 + 610 + 300,
        "c": 610 + 300,
    }
    settings.OPS_STANDBY = "on"  # the pods' settings: every job stands by
    assert export(directory)[2]["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == (
        600 + 90 + 610 + 300
    )
    settings.OPS_STANDBY = "perhaps"
    with pytest.raises(ExportError, match="OPS_STANDBY: 'perhaps'"):
        export(directory)


# --- DST: what Kubernetes' parser skips --------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "30 2 * * * sleep_demo",
        "0 2 * * 0 sleep_demo",  # the last Sunday of March is a Sunday
        "15 1,2 * 3 * sleep_demo",
    ],
)
def test_a_fixed_time_job_in_the_skipped_spring_hour_is_refused_with_file_and_line(tmp_path, line):
    directory = crontab_dir(tmp_path, f"# a job\n{line}\n")
    with pytest.raises(kubernetes.ExportError) as refused:
        export(directory, time_zone="Europe/Berlin")
    message = str(refused.value)
    assert message.startswith(f"{directory}/10-jobs.cron:2: sleep_demo: ")
    assert (
        "on 2027-03-28 does not exist in Europe/Berlin (the clock jumps from 02:00 to 03:00)"
        in message
    )


@pytest.mark.parametrize(
    "line, zone",
    [
        ("30 2 * * * sleep_demo", "UTC"),  # no DST
        ("30 2 * * * sleep_demo", "Asia/Tokyo"),
        ("30 3 * * * sleep_demo", "Europe/Berlin"),  # after the jump
        ("30 2 * * 1-6 sleep_demo", "Europe/Berlin"),  # never on a Sunday
        ("30 2 * 4-12 * sleep_demo", "Europe/Berlin"),  # never in March
        ("*/15 * * * * sleep_demo", "Europe/Berlin"),  # a wildcard job runs in real time
        ("30 * * * * sleep_demo", "Europe/Berlin"),
        ("@daily sleep_demo", "Europe/Berlin"),
        ("30 1 * * * sleep_demo", "America/New_York"),  # its gap is 02:00-02:59
    ],
)
def test_a_job_kubernetes_runs_as_debian_does_on_spring_nights_is_exported(tmp_path, line, zone):
    [document] = export(crontab_dir(tmp_path, line + "\n"), time_zone=zone)
    assert document["spec"]["schedule"] == line.rsplit(" ", 1)[0]


def test_the_skipped_minutes_are_the_zones_own_gap():
    [first, *_] = kubernetes.skipped_wall_minutes("America/New_York", dt.date(2027, 1, 1), years=1)
    assert (first[0], first[-1], len(first)) == (
        dt.datetime(2027, 3, 14, 2, 0),
        dt.datetime(2027, 3, 14, 2, 59),
        60,
    )
    [lord_howe, *_] = kubernetes.skipped_wall_minutes(
        "Australia/Lord_Howe", dt.date(2027, 1, 1), years=1
    )
    assert len(lord_howe) == 30  # a half-hour change
    assert kubernetes.skipped_wall_minutes("UTC", dt.date(2027, 1, 1)) == ()


def test_a_date_whose_spring_night_is_years_away_is_refused_too(tmp_path):
    # 2033-03-27 is Berlin's spring night: seven years after the export, still refused.
    directory = crontab_dir(tmp_path, "30 2 27 3 * sleep_demo\n")
    with pytest.raises(kubernetes.ExportError, match="02:30 on 2033-03-27 does not exist"):
        export(directory, time_zone="Europe/Berlin")


def test_a_spring_night_later_on_the_day_of_the_export_counts_east_of_utc(tmp_path):
    # Auckland's spring night, 2027-09-26 02:00 NZST -> 03:00 NZDT: an export made at 01:00
    # local time that day (still the 25th in UTC) must see it.
    directory = crontab_dir(tmp_path, "30 2 * * * sleep_demo\n")
    with pytest.raises(kubernetes.ExportError, match="on 2027-09-26 does not exist"):
        kubernetes.export(
            OPTIONS, databases=POSTGRES, time_zone="Pacific/Auckland",
            today=dt.date(2027, 9, 26), crontab_dir=directory,
        )  # fmt: skip


def test_sunday_as_7_is_named_before_any_dst_night(tmp_path):
    directory = crontab_dir(tmp_path, "30 2 * * 7 sleep_demo\n")
    with pytest.raises(kubernetes.ExportError, match="day of week 7"):
        export(directory, time_zone="Europe/Berlin")


def test_retries_and_after_add_their_attempts_and_waits_to_the_deadline(tmp_path, settings):
    """Each attempt has its --timeout, the backoffs come between them (at their longest, with
    jitter), and --after's wait before them: the pod must outlive all of it."""
    settings.OPS_STANDBY = ""
    directory = crontab_dir(
        tmp_path,
        "0 2 * * * --name=rates clearsessions\n"
        "0 3 * * * --timeout=10m --retries=2 --retry-delay=1m --name=a clearsessions\n"
        "0 4 * * * --timeout=10m --after=rates --after-wait=20m --name=b clearsessions\n",
    )
    deadlines = {
        d["metadata"]["name"]: d["spec"]["jobTemplate"]["spec"].get("activeDeadlineSeconds")
        for d in export(directory)
    }
    assert deadlines["a"] == 3 * (10 * 60 + 10) + math.ceil(60 * 1.1 + 120 * 1.1) + 300
    assert deadlines["b"] == 10 * 60 + 10 + 20 * 60 + 300
