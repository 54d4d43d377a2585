from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ops import conf
from ops.schedule import kubernetes, kubernetes_yaml
from ops.schedule.durations import parse_duration

EXIT_USAGE = 2


def _seconds(flag: str, text: str) -> int:
    try:
        return round(parse_duration(text))
    except ValueError as exc:
        raise kubernetes.ExportError(f"{flag}: {exc}") from None


def _workdir(text: str | None) -> str | None:
    """--workdir: an absolute path in the image (a relative one depends on the image's own
    working directory, which is what --workdir overrides)."""
    if text is None:
        return None
    if not text.startswith("/") or any(c.isspace() or ord(c) < 32 for c in text):
        shown = repr(text) if len(text) <= 60 else repr(text[:60]) + "…"
        raise kubernetes.ExportError(
            f"--workdir {shown}: an absolute path in the image, no spaces (e.g. /app)"
        )
    return text


class Command(BaseCommand):
    help = (
        "Print crontab.d as Kubernetes CronJobs (batch/v1), one per job, each running "
        "`python manage.py run_job <job>`; or write them as a kustomize directory. "
        "Exit codes: 0 written, 2 crontab.d, settings or usage error."
    )
    requires_system_checks = []  # it reads settings and crontab.d; it never touches the database

    def add_arguments(self, parser):
        parser.add_argument(
            "--format", required=True, choices=["kubernetes"], help="kubernetes: batch/v1 CronJobs"
        )
        parser.add_argument("--image", required=True, help="the image with this project in it")
        parser.add_argument(
            "--env-secret",
            action="append",
            required=True,
            metavar="NAME",
            help="a Secret whose keys become the pods' settings (envFrom); may be repeated",
        )
        parser.add_argument("--namespace", help="metadata.namespace (default: none written)")
        parser.add_argument("--service-account", metavar="NAME", help="serviceAccountName")
        parser.add_argument(
            "--starting-deadline",
            default="1h",
            metavar="DURATION",
            help="startingDeadlineSeconds: how late a missed run may still start (default 1h)",
        )
        parser.add_argument(
            "--deadline-margin",
            default="5m",
            metavar="DURATION",
            help="added to the job's --timeout for activeDeadlineSeconds (default 5m)",
        )
        parser.add_argument("--successful-history", type=int, default=3, metavar="N")
        parser.add_argument("--failed-history", type=int, default=3, metavar="N")
        parser.add_argument(
            "--app", default="cronops", help="the app.kubernetes.io/name label (default cronops)"
        )
        parser.add_argument(
            "--python", default="python", help="the image's Python (default: python on PATH)"
        )
        parser.add_argument("--workdir", help="workingDir: where manage.py is (default: image's)")
        parser.add_argument("--requests", metavar="cpu=Q,memory=Q", help="resources.requests")
        parser.add_argument("--limits", metavar="cpu=Q,memory=Q", help="resources.limits")
        parser.add_argument(
            "--output-dir",
            metavar="DIR",
            help="write one file per CronJob and a kustomization.yaml here instead of printing",
        )

    def handle(self, *args, **options):
        try:
            export = kubernetes.ExportOptions(
                image=options["image"],
                env_secrets=tuple(options["env_secret"]),
                namespace=options["namespace"],
                service_account=options["service_account"],
                starting_deadline=_seconds("--starting-deadline", options["starting_deadline"]),
                deadline_margin=_seconds("--deadline-margin", options["deadline_margin"]),
                successful_history=options["successful_history"],
                failed_history=options["failed_history"],
                app=options["app"],
                python=options["python"],
                workdir=_workdir(options["workdir"]),
                requests=kubernetes.parse_resources(options["requests"], "--requests")
                if options["requests"]
                else {},
                limits=kubernetes.parse_resources(options["limits"], "--limits")
                if options["limits"]
                else {},
            )
            documents = kubernetes.export(
                export,
                databases=settings.DATABASES,
                time_zone=settings.TIME_ZONE,
                today=timezone.localdate(),
            )
            if options["output_dir"]:
                directory = Path(options["output_dir"])
                written = kubernetes_yaml.write_kustomize(documents, directory)
            else:
                self.stdout.write(kubernetes_yaml.yaml_stream(documents), ending="")
                return
        except (kubernetes.ExportError, conf.SettingError) as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from None
        self.stdout.write(
            self.style.SUCCESS(
                f"wrote {len(documents)} CronJob{'s' if len(documents) != 1 else ''} and "
                f"{kubernetes_yaml.KUSTOMIZATION} to {directory} ({len(written)} files)"
            )
        )
