from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone

from ops import schema
from ops.models import JobRun
from ops.run.output import settle


class Command(BaseCommand):
    help = "Print the most recent runs (the run history), newest first."
    requires_system_checks = []  # reading the history must work while the config is broken

    def add_arguments(self, parser):
        parser.add_argument("--job", help="only this job")
        parser.add_argument("--limit", type=int, default=20)

    def handle(self, *args, job=None, limit=20, **options):
        try:
            self._print(job, limit)
        except DatabaseError as exc:  # one line, as job_status says it (exit 2)
            raise CommandError(
                f"cannot read the run history: {schema.database_error_line(exc)}", returncode=2
            ) from None
        except BrokenPipeError:
            # `job_history | head`: the reader has what it wanted. Drop what is still buffered
            # (the flush at exit would fail again, with a traceback) and end quietly.
            settle()

    def _print(self, job, limit):
        runs = JobRun.objects.all()
        if job:
            runs = runs.filter(job=job)
        rows = list(runs[:limit])
        # The job and slot columns are as wide as their longest value (a wall-clock slot key,
        # "2026-10-25 02:30+02:00", is 22 characters), never less than before.
        job_width = max([16, *(len(run.job) for run in rows)])
        slot_width = max([16, *(len(run.slot) for run in rows)])
        how_width = max([10, *(len(run.started_how) for run in rows)])  # started by
        self.stdout.write(
            f"{'started':<19}  {'job':<{job_width}} {'slot':<{slot_width}} {'outcome':<10} "
            f"{'exit':>4} {'secs':>6}  {'started by':<{how_width}}  note"
        )
        for run in rows:
            started = timezone.localtime(run.started_at).strftime("%Y-%m-%d %H:%M:%S")
            note = run.note
            if run.task_result_id:  # an enqueued task: its own status (ops/run/tasks.py)
                from ops.run.tasks import status_of

                note = f"{note} (task {status_of(run)})"
            exit_code = "" if run.exit_code is None else run.exit_code
            secs = "" if run.duration is None else f"{run.duration:.2f}"
            self.stdout.write(
                f"{started:<19}  {run.job:<{job_width}} {run.slot:<{slot_width}} "
                f"{run.outcome:<10} {exit_code!s:>4} {secs:>6}  {run.started_how:<{how_width}}  "
                f"{note}".rstrip()
            )
        self.stdout.write(f"{len(rows)} runs shown")
