from decimal import Decimal

import django.core.validators
from django.db import migrations, models


def pro_streams_more(apps, schema_editor):
    """Free keeps the field's default (16 MiB a run); pro may stream 64 MiB a run."""
    apps.get_model("api", "Plan").objects.filter(name="pro").update(stream_bytes_per_run=64 * 1024 * 1024)


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0013_run_idempotency_digest"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="max_concurrent_streams",
            field=models.PositiveIntegerField(
                blank=True, null=True, validators=[django.core.validators.MinValueValidator(1)]
            ),
        ),
        migrations.AddField(
            model_name="plan",
            name="stream_bytes_per_run",
            field=models.BigIntegerField(
                blank=True,
                default=16777216,
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.AddField(
            model_name="plan",
            name="streamed_gib_price",
            field=models.DecimalField(decimal_places=4, default=Decimal("0.10"), max_digits=10),
        ),
        migrations.AddField(
            model_name="usagerecord",
            name="streamed_bytes",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunPython(pro_streams_more, migrations.RunPython.noop),
    ]
