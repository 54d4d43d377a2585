from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone

from ops import schema
from ops.run.retention import prune_runs
from ops.schedule.durations import parse_duration


class Command(BaseCommand):
    help = (
        "Delete run history, slot claims and effects done once (ops.once) older than DURATION "
        "(each job's latest run and latest success are kept, its first and latest succeeded "
        "claims, and running claims)."
    )
    requires_system_checks = []  # it checks what it needs; a broken .env mode must not block it

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="DURATION",
            help="age of the runs and slot claims to delete: 90d, 12h, 30m, 45s",
        )
        parser.add_argument(
            "--job", metavar="NAME", help="only this job's runs (a shorter retention for it)"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted, delete nothing"
        )

    def handle(self, *args, older_than, dry_run=False, job=None, verbosity=1, **options):
        try:
            seconds = parse_duration(older_than)
        except ValueError as exc:
            raise CommandError(f"--older-than: {exc}", returncode=2) from None
        try:
            result = prune_runs(now=timezone.now(), older_than=seconds, dry_run=dry_run, job=job)
        except DatabaseError as exc:
            # cronops' tables missing is a configuration error (exit 2); any other database
            # error, as before, exit 1.
            explained = schema.explained(exc)
            raise CommandError(
                f"cannot prune the run history: {explained or schema.first_line(exc)}",
                returncode=2 if explained else 1,
            ) from None
        cutoff = timezone.localtime(result.cutoff).strftime("%Y-%m-%d %H:%M %Z")
        if verbosity > 1:
            jobs = set(result.per_job) | set(result.claims_per_job) | set(result.effects_per_job)
            for job in sorted(jobs):
                runs, claims = result.per_job.get(job, 0), result.claims_per_job.get(job, 0)
                effects = result.effects_per_job.get(job, 0)
                self.stdout.write(
                    f"{job}: {runs:,} runs, {claims:,} slot claims, {effects:,} effects done once"
                )
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(
            f"prune_runs: {verb} {result.deleted:,} runs started before {cutoff} "
            f"({len(result.per_job)} jobs; each job's latest run and latest success kept) "
            f"and {result.claims_deleted:,} slot claims of slots before it (each job's first "
            "and latest succeeded claims and running claims kept) and "
            f"{result.effects_deleted:,} effects done once (ops.once) marked before it"
        )
