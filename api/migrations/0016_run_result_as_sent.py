from django.db import migrations

import api.fields


class Migration(migrations.Migration):
    """A run's result in a ``json`` column (kept as written) instead of ``jsonb`` (keys sorted)."""

    dependencies = [
        ("api", "0015_plan_max_memory_mb"),
    ]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="result",
            field=api.fields.JSONAsSentField(blank=True, null=True),
        ),
    ]
