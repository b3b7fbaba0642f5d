import django.core.validators
from django.db import migrations, models


def pro_gets_more(apps, schema_editor):
    """Free keeps the field's default (8 tool hosts); pro may list 64."""
    apps.get_model("api", "Plan").objects.filter(name="pro").update(max_tool_hosts=64)


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0017_run_usage_details"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="max_tool_hosts",
            field=models.PositiveIntegerField(default=8, validators=[django.core.validators.MaxValueValidator(1000)]),
        ),
        migrations.RunPython(pro_gets_more, migrations.RunPython.noop),
    ]
