from django.db import models


class Subscription(models.Model):
    customer = models.CharField(max_length=100)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    balance = models.DecimalField(max_digits=12, decimal_places=2, default=0)
    active = models.BooleanField(default=True)

    def __str__(self):
        return self.customer


class DailyCharge(models.Model):
    """At most one charge per subscription and day: the database refuses a second one."""

    subscription = models.ForeignKey(Subscription, on_delete=models.PROTECT)
    charge_date = models.DateField()
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "charge_date"], name="one_charge_per_subscription_day"
            )
        ]

    def __str__(self):
        return f"{self.subscription} {self.charge_date} {self.amount}"
