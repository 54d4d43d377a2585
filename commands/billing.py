"""The billing example from the seeds: charge each active subscription once per logical date."""

import datetime as dt
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F

from ops import once
from ops.claims import current_claim

from .models import DailyCharge, Subscription


@dataclass
class ChargeResult:
    charged: int = 0
    already_charged: int = 0


def charge_daily(logical_date: dt.date) -> ChargeResult:
    result = ChargeResult()
    # Under run_job each charge is also marked with ops.once, beside DailyCharge (README,
    # "Exactly once"): the guard for an effect that has no unique row of its own. A run by
    # hand outside run_job (`manage.py charge_daily`) has no slot: DailyCharge alone.
    in_a_run = current_claim() is not None
    for sub in Subscription.objects.filter(active=True).order_by("id"):
        try:
            with transaction.atomic():
                if in_a_run and not once(f"charge subscription {sub.pk}"):
                    result.already_charged += 1  # this slot's earlier run charged it
                    continue
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
