from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "ops"
    verbose_name = "Cron operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .checkgate import register_checks

        register_checks()
