from django.db import migrations, models


class Migration(migrations.Migration):
    """--retries: each attempt at a slot is its own row of the history, numbered."""

    dependencies = [
        ("ops", "0007_effects_done_once"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="attempt",
            field=models.PositiveSmallIntegerField(db_default=1, default=1),
        ),
    ]
