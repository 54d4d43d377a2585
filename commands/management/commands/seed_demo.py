from decimal import Decimal

from django.core.management.base import BaseCommand

from commands.models import Subscription

DEMO = [("alice", "9.90"), ("bob", "19.90"), ("carol", "4.50")]


class Command(BaseCommand):
    help = "Create the demo subscriptions for `make demo` (does nothing when they exist)."

    def handle(self, *args, **options):
        created = 0
        for customer, price in DEMO:
            _, new = Subscription.objects.get_or_create(
                customer=customer, defaults={"price": Decimal(price), "balance": Decimal("100")}
            )
            created += new
        self.stdout.write(f"demo subscriptions: {created} created, {len(DEMO) - created} existed")
