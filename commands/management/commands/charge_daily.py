import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from commands.billing import charge_daily


class Command(BaseCommand):
    help = "Charge every active subscription once for the logical date (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--logical-date",
            help="the day being paid for, YYYY-MM-DD (default: today in TIME_ZONE)",
        )

    def handle(self, *args, logical_date=None, **options):
        if logical_date:
            try:
                day = dt.date.fromisoformat(logical_date)
            except ValueError as exc:
                raise CommandError(f"--logical-date: {exc}", returncode=2) from exc
        else:
            day = timezone.localdate()
        result = charge_daily(day)
        self.stdout.write(
            f"charge_daily {day}: charged {result.charged}, "
            f"already charged {result.already_charged}"
        )
