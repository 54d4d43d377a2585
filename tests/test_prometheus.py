"""`job_status --format=prometheus`: the exposition text, the atomic `--output` file, and the
real thing: Debian's node_exporter reading it through its textfile collector, promtool checking
the file and the alert rules of docs/prometheus.md.

node_exporter and promtool come from Debian's `prometheus-node-exporter` and `prometheus`
packages (.ci/services.sh installs them); the test starts its own node_exporter on a free
loopback port and never touches the system's service.
"""

import datetime as dt
import http.client
import io
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import textwrap

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError

from ops.monitors import status
from tests import test_status
from tests.conftest import REPO, require, wait_until
from tests.test_status import (
    CRON,
    EXPECTED,
    NOW,
    at,
    insert_orm,
    insert_sql,
    job_status,
    manage_at,
    scenario_rows,
)

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
FAMILIES = (
    "cronops_job_state",
    "cronops_job_last_success_timestamp_seconds",
    "cronops_job_last_run_timestamp_seconds",
    "cronops_job_last_duration_seconds",
    "cronops_job_last_exit_code",
    "cronops_job_consecutive_failures",
    "cronops_job_next_fire_timestamp_seconds",
)


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """{(metric name, frozenset of (label, value)): value} for every sample line.

    A sample with a timestamp (a third field) does not match SAMPLE and fails the test.
    """
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line without timestamp: {line!r}"
        name, labels, value = match.groups()
        pairs = frozenset(LABEL.findall(labels or ""))
        samples[(name, pairs)] = float(value)
    return samples


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def ts(text: str) -> float:
    return at(text).timestamp()


def assert_scenario(samples):
    """The values the shared job_status scenario must give at NOW (tests/test_status.py)."""
    for job, state in EXPECTED.items():
        for candidate in status.STATES:
            expected = 1 if candidate == state else 0
            assert value(samples, "cronops_job_state", job_name=job, state=candidate) == expected, (
                job,
                candidate,
            )
    name = "cronops_job_"
    # ok-job: its 2026-11-29 03:00 run started 03:00:03 and took 6 s
    assert value(samples, name + "last_success_timestamp_seconds", job_name="ok-job") == ts(
        "2026-11-29 03:00:09"
    )
    assert value(samples, name + "last_run_timestamp_seconds", job_name="ok-job") == ts(
        "2026-11-29 03:00:03"
    )
    assert value(samples, name + "last_duration_seconds", job_name="ok-job") == 6.0
    assert value(samples, name + "last_exit_code", job_name="ok-job") == 0
    assert value(samples, name + "next_fire_timestamp_seconds", job_name="ok-job") == ts(
        "2026-11-30 03:00"
    )
    # bad-job: failed (3), then timed out (124): two failures in a row
    assert value(samples, name + "last_exit_code", job_name="bad-job") == 124
    assert value(samples, name + "consecutive_failures", job_name="bad-job") == 2
    assert value(samples, name + "last_duration_seconds", job_name="bad-job") == 300.0
    # busy-job runs now: no exit code yet; new-job never ran: no run, no success
    assert ("cronops_job_last_exit_code", frozenset({("job_name", "busy-job")})) not in samples
    new_job = {k[0] for k in samples if ("job_name", "new-job") in k[1]}
    assert new_job == {
        name + "state",
        name + "consecutive_failures",
        name + "next_fire_timestamp_seconds",
    }
    assert value(samples, name + "consecutive_failures", job_name="new-job") == 0
    # ad-hoc and @reboot jobs have no next fire time
    for job in ("export", "boot-job"):
        assert (name + "next_fire_timestamp_seconds", frozenset({("job_name", job)})) not in samples


# --- in-process -----------------------------------------------------------------------------


cron_dir = test_status.cron_dir  # the shared fixture (a crontab.d of test jobs)


@pytest.fixture
def scenario(request, db):
    directory = request.getfixturevalue("cron_dir")
    insert_orm(scenario_rows())
    return directory


@pytest.mark.django_db
def test_the_prometheus_format_gives_every_figure_per_job_with_help_and_type(scenario):
    with time_machine.travel(NOW, tick=False):
        code, out = job_status("--format=prometheus")
    assert code == 1  # printed, the exit code still says "not all ok", as for the table
    assert_scenario(parse(out))
    for family in FAMILIES:
        assert f"# HELP {family} " in out
        assert f"# TYPE {family} gauge\n" in out
    assert set(re.findall(r"^(cronops_\w+)", out, re.M)) == set(FAMILIES)


@pytest.mark.django_db
def test_the_json_and_table_formats_are_unchanged(scenario):
    with time_machine.travel(NOW, tick=False):
        assert job_status("--json") == job_status("--format=json")
        assert job_status() == job_status("--format=table")
        _, out = job_status("--json")
    assert json.loads(out)["jobs"][0]["job"] == "ok-job"
    with pytest.raises(CommandError, match="invalid choice: 'xml'"):
        call_command("job_status", "--format=xml", stdout=io.StringIO())


@pytest.mark.django_db
def test_output_replaces_the_file_atomically_with_mode_0644_and_exits_zero(scenario, tmp_path):
    target = tmp_path / "textfile" / "cronops.prom"  # the directory is created
    with time_machine.travel(NOW, tick=False):
        code, out = job_status("--format=prometheus", f"--output={target}")
        assert (code, out) == (0, "")  # unhealthy jobs, but the exporter did its job
        first = target.stat()
        assert stat.S_IMODE(first.st_mode) == 0o644
        assert_scenario(parse(target.read_text()))
        job_status("--format=prometheus", "--output", str(target))
    # a new file renamed over the old one (a reader holding the old one keeps reading it whole)
    assert target.stat().st_ino != first.st_ino
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["cronops.prom"]


@pytest.mark.django_db
def test_output_creates_its_directory_readable_by_node_exporter_whatever_the_umask(
    scenario, tmp_path
):
    target = tmp_path / "textfile" / "cronops.prom"
    old = os.umask(0o077)
    try:
        with time_machine.travel(NOW, tick=False):
            assert job_status("--format=prometheus", f"--output={target}") == (0, "")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


@pytest.mark.django_db
def test_output_into_an_unusable_directory_is_one_line_and_exit_2(scenario, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(CommandError) as error:
        call_command(
            "job_status",
            "--format=prometheus",
            f"--output={blocker}/cronops.prom",
            stdout=io.StringIO(),
        )
    assert error.value.returncode == 2
    assert str(error.value) == f"cannot write {blocker}/cronops.prom: Not a directory"


@pytest.mark.django_db
def test_output_of_the_terminal_table_is_refused_so_no_scrape_breaks(scenario, tmp_path):
    target = tmp_path / "cronops.prom"
    with pytest.raises(CommandError) as error:
        call_command("job_status", f"--output={target}", stdout=io.StringIO())
    assert error.value.returncode == 2
    assert str(error.value) == "--output writes --format=prometheus or --format=json: give one"
    assert not target.exists()


def test_label_values_are_escaped():
    from ops.monitors.metrics import render

    report = status.Report(now=NOW, tz=dt.UTC)
    report.jobs.append(
        status.JobStatus(job='we"ird\\job\nx', state="ok", reason="", declared=False)
    )
    text = render(report)
    assert 'cronops_job_state{job_name="we\\"ird\\\\job\\nx",state="ok"} 1' in text


# --- the real thing: promtool and node_exporter ---------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        return response.read().decode()
    finally:
        conn.close()


@pytest.fixture
def node_exporter(tmp_path):
    """Debian's node_exporter with only the textfile collector, on a free loopback port."""
    require(os.access(NODE_EXPORTER, os.X_OK), "prometheus-node-exporter not installed")
    directory = tmp_path / "textfile"
    directory.mkdir()
    port = free_port()
    proc = subprocess.Popen(
        [
            NODE_EXPORTER,
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={directory}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def listening():
        try:
            return scrape(port) is not None
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()
            return False

    try:
        wait_until(listening, f"node_exporter to listen on 127.0.0.1:{port}", 20)
        yield directory, port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_node_exporter_serves_the_jobs_from_the_file_job_status_writes(project, node_exporter):
    require(os.access(PROMTOOL, os.X_OK), "promtool not installed (Debian package prometheus)")
    directory, port = node_exporter
    project.write_cron("50-test.cron", CRON)
    insert_sql(project.db, scenario_rows())
    target = directory / "cronops.prom"
    result = manage_at(project, NOW, "job_status", "--format=prometheus", f"--output={target}")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")

    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=target.read_bytes(), capture_output=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == b""  # no lint complaint either

    text = scrape(port)
    samples = parse(text)
    assert value(samples, "node_textfile_scrape_error") == 0
    assert value(samples, "node_textfile_mtime_seconds", file=str(target)) == int(
        target.stat().st_mtime
    )
    assert_scenario(samples)


# --- the alert rules of docs/prometheus.md ----------------------------------------------


def readme_rules() -> str:
    guide = (REPO / "docs" / "prometheus.md").read_text()
    blocks = re.findall(r"```yaml\n(groups:.*?)```", guide, re.S)
    assert len(blocks) == 1, "docs/prometheus.md has one block of alert rules"
    return blocks[0]


# The scrape target's own labels, which Prometheus adds to every series it scrapes.
TARGET = {"job": "node", "instance": "w:9100"}


def as_stored(line: str) -> str:
    """A sample line of our file as Prometheus stores it after scraping node_exporter (default
    `honor_labels: false`): the target's labels added, and a file label clashing with one of
    them renamed `exported_<name>` (a `job` label would become `exported_job`)."""
    match = SAMPLE.match(line)
    assert match, line
    name, labels, _ = match.groups()
    stored = {}
    for label, value in LABEL.findall(labels or ""):
        stored["exported_" + label if label in TARGET else label] = value
    stored.update(TARGET)
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(stored.items())) + "}"


def stored_state_series(job: str, state: str) -> str:
    """The series `job_status --format=prometheus` writes for `job` in `state`, as stored."""
    from ops.monitors.metrics import render

    report = status.Report(now=NOW, tz=dt.UTC)
    report.jobs.append(status.JobStatus(job=job, state=state, reason="", declared=True))
    (line,) = [
        line
        for line in render(report).splitlines()
        if line.startswith("cronops_job_state{") and f'state="{state}"' in line
    ]
    return as_stored(line)


def test_the_job_label_survives_a_scrape_under_the_name_the_rules_use():
    stored = stored_state_series("charge_daily", "failing")
    assert stored == (
        'cronops_job_state{instance="w:9100",job="node",job_name="charge_daily",state="failing"}'
    )
    assert "exported_" not in stored  # nothing of ours clashes with the target's labels
    rules = readme_rules()
    assert "$labels.job_name" in rules
    assert "exported_job" not in rules


RULE_TESTS = textwrap.dedent(
    """\
    rule_files: [rules.yml]
    evaluation_interval: 1m
    tests:
      - interval: 1m
        input_series:
          - series: '{charge_daily_failing}'
            values: '0 0 1 1 1 1'
          - series: '{charge_daily_ok}'
            values: '1 1 0 0 0 0'
          - series: '{clear_sessions_overdue}'
            values: '0 0 0 1 1 1'
          - series: '{mtime}'
            values: '0 60 120 120 120 120 120 120 120 120 120'
        alert_rule_test:
          - eval_time: 1m
            alertname: CronJobFailing
            exp_alerts: []
          - eval_time: 2m
            alertname: CronJobFailing
            exp_alerts:
              - exp_labels:
                  severity: critical
                  job_name: charge_daily
                  state: failing
                  job: node
                  instance: "w:9100"
                exp_annotations:
                  summary: "cron job charge_daily on w:9100 is failing"
                  description: "On the server: manage.py job_status --job charge_daily"
          - eval_time: 2m
            alertname: CronJobOverdue
            exp_alerts: []
          - eval_time: 3m
            alertname: CronJobOverdue
            exp_alerts:
              - exp_labels:
                  severity: warning
                  job_name: clear-sessions
                  state: overdue
                  job: node
                  instance: "w:9100"
                exp_annotations:
                  summary: "cron job clear-sessions on w:9100 has no success for its due slot"
                  description: "On the server: manage.py job_status --job clear-sessions"
          - eval_time: 6m
            alertname: CronopsMetricsStale
            exp_alerts: []
          - eval_time: 10m
            alertname: CronopsMetricsStale
            exp_alerts:
              - exp_labels:
                  severity: critical
                  file: /m/cronops.prom
                  job: node
                  instance: "w:9100"
                exp_annotations:
                  summary: "cronops metrics on w:9100 not updated for 5m: is cron running?"
    """
).format(
    charge_daily_failing=stored_state_series("charge_daily", "failing"),
    charge_daily_ok=stored_state_series("charge_daily", "ok"),
    clear_sessions_overdue=stored_state_series("clear-sessions", "overdue"),
    mtime=as_stored('node_textfile_mtime_seconds{file="/m/cronops.prom"} 0'),
)


@pytest.mark.process  # promtool
def test_the_readme_alert_rules_pass_promtool_and_fire_when_they_should(tmp_path):
    require(os.access(PROMTOOL, os.X_OK), "promtool not installed (Debian package prometheus)")
    rules = tmp_path / "rules.yml"
    rules.write_text(readme_rules())
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 3 rules found" in checked.stdout
    tests = tmp_path / "tests.yml"
    tests.write_text(RULE_TESTS)
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, cwd=tmp_path
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_example_crontab_writes_the_metrics_every_minute_and_keeps_two_days_of_them():
    from ops.schedule.crontabd import parse_text

    path = REPO / "crontab.d" / "96-metrics.cron"
    metrics, prune = parse_text(path.read_text(), str(path)).jobs
    assert (metrics.name, metrics.schedule, metrics.options.command) == (
        "metrics",
        "* * * * *",
        "job_status",
    )
    assert metrics.options.args == ["--format=prometheus", "--output=var/metrics/cronops.prom"]
    assert metrics.options.timeout == 50
    assert (prune.name, prune.options.command) == ("prune-metrics", "prune_runs")
    assert prune.options.args == ["--older-than=2d", "--job=metrics"]
    assert "var/metrics/cronops.prom" in (REPO / "docs" / "prometheus.md").read_text()
