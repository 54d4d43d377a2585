from django.db import migrations, models


class Migration(migrations.Migration):
    """The holder's heartbeat interval on its claim: staleness is judged by the holder's own
    OPS_HEARTBEAT_SECONDS. Claims written before have none and are judged as before."""

    dependencies = [
        ("ops", "0004_outcome_taken_over"),
    ]

    operations = [
        migrations.AddField(
            model_name="slotclaim",
            name="heartbeat_interval",
            field=models.FloatField(
                blank=True, help_text="the holder's heartbeat interval, seconds", null=True
            ),
        ),
    ]
