import django.core.validators
from django.db import migrations, models


def pro_gets_more(apps, schema_editor):
    """Free keeps the field's default (1024 MiB a run); pro may ask for the sandbox's 4096."""
    apps.get_model("api", "Plan").objects.filter(name="pro").update(max_memory_mb=4096)


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0014_stream_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="max_memory_mb",
            field=models.PositiveIntegerField(
                default=1024,
                validators=[
                    django.core.validators.MinValueValidator(64),
                    django.core.validators.MaxValueValidator(4096),
                ],
            ),
        ),
        migrations.RunPython(pro_gets_more, migrations.RunPython.noop),
    ]
