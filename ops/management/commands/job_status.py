import json
from pathlib import Path
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone

from ops import conf, schema
from ops.monitors import metrics, status, status_render
from ops.schedule.crontabd import CrontabError, load_schedule

FORMATS = ("table", "json", "prometheus")


def render(report: status.Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(status_render.to_json(report), indent=2) + "\n"
    if fmt == "prometheus":
        return metrics.render(report)
    return status_render.render_table(report) + "\n"


class Command(BaseCommand):
    help = (
        "One row per job (crontab.d and the run history): schedule, next fire time, last "
        "success, last outcome, durations, start lag, failure streak and state. Exit 0 when "
        "every job is ok or running, 1 otherwise (with --output: 0 once the file is written)."
    )

    # A monitoring probe reports the jobs even when a system check (time zone, pings) fails:
    # install_crontab and `manage.py check` are where those errors stop a deploy.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--job", metavar="NAME", help="only this job")
        parser.add_argument(
            "--format",
            choices=FORMATS,
            default=None,
            dest="fmt",
            help="table (default), json (docs/operating.md) or prometheus (text exposition)",
        )
        parser.add_argument("--json", action="store_true", dest="as_json", help="--format=json")
        parser.add_argument(
            "--output",
            metavar="FILE",
            help="write to FILE atomically (mode 0644), e.g. for node_exporter's textfile "
            "collector; exit 0 once written, whatever the jobs' states",
        )

    def handle(self, *args, job=None, fmt=None, as_json=False, output=None, **options):
        if as_json and fmt not in (None, "json"):
            raise CommandError(
                f"--json and --format={fmt} contradict each other: give one", returncode=2
            )
        fmt = "json" if as_json else fmt or "table"
        if output and fmt == "table":
            # A table in node_exporter's textfile directory would be a scrape error, silently.
            raise CommandError(
                "--output writes --format=prometheus or --format=json: give one", returncode=2
            )
        try:
            conf.validate()
        except conf.SettingError as exc:
            raise CommandError(str(exc), returncode=2) from None
        try:
            schedule = load_schedule()
        except CrontabError as exc:
            raise CommandError(str(exc), returncode=2) from None
        try:
            report = status.collect(
                schedule, now=timezone.now(), tz=ZoneInfo(settings.TIME_ZONE), only=job
            )
        except status.UnknownJob as exc:
            raise CommandError(str(exc), returncode=2) from None
        except DatabaseError as exc:
            raise CommandError(
                f"cannot read the run history: {schema.database_error_line(exc)}", returncode=2
            ) from None
        text = render(report, fmt)
        if output:
            # An exporter's job is the file: the states are in it, so its exit code says only
            # whether it was written (run from cron, exit 1 would look like its own failure).
            try:
                metrics.write_textfile(Path(output), text)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise CommandError(f"cannot write {output}: {reason}", returncode=2) from None
            return
        self.stdout.write(text, ending="")
        if not report.healthy:
            raise SystemExit(1)
