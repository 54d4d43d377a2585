import time

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Sleep for a few seconds (shows the lock in `make demo`)."

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=3.0)

    def handle(self, *args, seconds, **options):
        self.stdout.write(f"sleeping {seconds:g}s")
        time.sleep(seconds)
        self.stdout.write("awake")
