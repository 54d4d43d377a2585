from django.apps import AppConfig


class CommandsConfig(AppConfig):
    name = "commands"
    verbose_name = "billing example"
    default_auto_field = "django.db.models.BigAutoField"
