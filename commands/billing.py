"""The billing example from the seeds: charge each active subscription once per logical date."""

import datetime as dt
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F

from .models import DailyCharge, Subscription


@dataclass
class ChargeResult:
    charged: int = 0
    already_charged: int = 0


def charge_daily(logical_date: dt.date) -> ChargeResult:
    result = ChargeResult()
    for sub in Subscription.objects.filter(active=True).order_by("id"):
        try:
            with transaction.atomic():
                # The charge row goes first: if it already exists the unique constraint
                # fails the transaction before the balance is touched.
                DailyCharge.objects.create(
                    subscription=sub, charge_date=logical_date, amount=sub.price
                )
                Subscription.objects.filter(pk=sub.pk).update(balance=F("balance") - sub.price)
        except IntegrityError:
            result.already_charged += 1
        else:
            result.charged += 1
    return result
