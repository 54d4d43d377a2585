from django.contrib import admin

from .models import DailyCharge, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ["customer", "price", "balance", "active"]


@admin.register(DailyCharge)
class DailyChargeAdmin(admin.ModelAdmin):
    list_display = ["subscription", "charge_date", "amount", "created_at"]
    list_filter = ["charge_date"]
