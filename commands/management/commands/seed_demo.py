from decimal import Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from commands.models import Subscription

DEMO = [("alice", "9.90"), ("bob", "19.90"), ("carol", "4.50")]


class Command(BaseCommand):
    help = (
        "Create the demo subscriptions for `make demo` (does nothing when they exist); "
        "--history also replaces the run history with 90 made-up days (the jobs page's demo)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--history",
            action="store_true",
            help="replace the run history with 90 made-up days of the crontab.d jobs",
        )

    def handle(self, *args, history=False, **options):
        created = 0
        for customer, price in DEMO:
            _, new = Subscription.objects.get_or_create(
                customer=customer, defaults={"price": Decimal(price), "balance": Decimal("100")}
            )
            created += new
        self.stdout.write(f"demo subscriptions: {created} created, {len(DEMO) - created} existed")
        if history:
            from commands.demo_history import seed_history
            from ops.schedule.crontabd import load_schedule

            count = seed_history(
                load_schedule(), now=timezone.now(), tz=ZoneInfo(settings.TIME_ZONE)
            )
            self.stdout.write(f"demo history: {count:,} runs written (the old history deleted)")
