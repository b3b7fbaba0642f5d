from django.db import migrations, models


def mark_run_rows(apps, schema_editor):
    """Rows linked to a run are run usage; the storage meter's rows have no run."""
    apps.get_model("api", "UsageRecord").objects.filter(run__isnull=False).update(from_run=True)


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0009_plan_api_requests_per_minute"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagerecord",
            name="from_run",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(mark_run_rows, migrations.RunPython.noop),
    ]
