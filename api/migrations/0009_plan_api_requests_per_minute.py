from django.db import migrations, models


def pro_gets_more(apps, schema_editor):
    """Free keeps the field's default (600 a minute); pro gets ten times that."""
    apps.get_model("api", "Plan").objects.filter(name="pro").update(api_requests_per_minute=6000)


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0008_tenant_closed"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="api_requests_per_minute",
            field=models.PositiveIntegerField(blank=True, default=600, null=True),
        ),
        migrations.RunPython(pro_gets_more, migrations.RunPython.noop),
    ]
