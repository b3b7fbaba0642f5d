import django.core.validators
from django.db import migrations, models

#: Free: a tenth of a worker's device pool pinned, a tenth of its host tier, 100 named files.
#: Pro: two fifths of each and 10,000 files. Several tenants at their share still leave the
#: device pool to everyone's prefills; unpinned files are spilled for them whoever owns them.
SHARES = {
    "free": {"kv_pinned_device_share": 0.1, "kv_host_share": 0.1, "max_kv_files": 100},
    "pro": {"kv_pinned_device_share": 0.4, "kv_host_share": 0.4, "max_kv_files": 10_000},
}


def seed_shares(apps, schema_editor):
    plan = apps.get_model("api", "Plan")
    for name, fields in SHARES.items():
        plan.objects.filter(name=name).update(**fields)


def share_field():
    return models.FloatField(
        blank=True,
        null=True,
        validators=[django.core.validators.MinValueValidator(0.0), django.core.validators.MaxValueValidator(1.0)],
    )


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0011_quota_notice"),
    ]

    operations = [
        migrations.AddField(model_name="plan", name="kv_pinned_device_share", field=share_field()),
        migrations.AddField(model_name="plan", name="kv_host_share", field=share_field()),
        migrations.AddField(
            model_name="plan", name="max_kv_files", field=models.PositiveIntegerField(blank=True, null=True)
        ),
        migrations.RunPython(seed_shares, migrations.RunPython.noop),
    ]
