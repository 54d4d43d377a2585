"""The example's Django task, scheduled in crontab.d (10-billing.cron) like a command.

cron runs `run_job summarise-charges` at 03:15: once charge_daily has succeeded for the day
(--after), run_job claims the slot and enqueues this task on django-tasks-db's database backend
(--enqueue), in the transaction that records the slot done; `manage.py db_worker` runs it.
"""

import datetime as dt

from django.db.models import Count, Sum

try:
    from django.tasks import task  # Django 6.0+
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from .models import DailyCharge


@task
def summarise_charges(logical_date: str) -> dict:
    """The logical date's charges, counted and summed (its result, kept by the backend)."""
    day = dt.date.fromisoformat(logical_date)
    totals = DailyCharge.objects.filter(charge_date=day).aggregate(
        charges=Count("id"), amount=Sum("amount")
    )
    summary = {
        "date": logical_date,
        "charges": totals["charges"],
        "amount": f"{totals['amount'] or 0:.2f}",
    }
    print(f"charges of {logical_date}: {summary['charges']}, {summary['amount']} in all")
    return summary
