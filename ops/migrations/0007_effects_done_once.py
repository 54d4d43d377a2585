from django.db import migrations, models


class Migration(migrations.Migration):
    """`ops.once(key)`'s table: one row per (job, slot, key), written in the job's own
    transaction with the effect it marks, so a run that redoes the slot does not redo it."""

    dependencies = [
        ("ops", "0006_pauses_and_run_now"),
    ]

    operations = [
        migrations.CreateModel(
            name="Effect",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job", models.CharField(max_length=100)),
                ("slot", models.CharField(max_length=32)),
                ("key", models.CharField(max_length=200)),
                ("run_id", models.BigIntegerField(blank=True, null=True)),
                ("version", models.PositiveIntegerField(blank=True, null=True)),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "effect done once",
                "verbose_name_plural": "effects done once",
                "indexes": [
                    models.Index(fields=["job", "created_at"], name="ops_effect_job_created")
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("job", "slot", "key"), name="ops_effect_once")
                ],
            },
        ),
    ]
