import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


def pro_gets_more(apps, schema_editor):
    """Free keeps the fields' defaults (8 children a run, 2 levels); pro may go further."""
    apps.get_model("api", "Plan").objects.filter(name="pro").update(max_children_per_run=64, max_spawn_depth=4)


class Migration(migrations.Migration):
    """Run trees: ``symphony.spawn`` records a child run with its parent, depth and entry, and
    the plan bounds children per run and the depth of a tree."""

    dependencies = [
        ("api", "0019_plan_cached_token_price_ratio"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="max_children_per_run",
            field=models.PositiveIntegerField(default=8, validators=[django.core.validators.MaxValueValidator(1000)]),
        ),
        migrations.AddField(
            model_name="plan",
            name="max_spawn_depth",
            field=models.PositiveIntegerField(default=2, validators=[django.core.validators.MaxValueValidator(16)]),
        ),
        migrations.AddField(
            model_name="run",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="children",
                to="api.run",
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="depth",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="run",
            name="entry",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.RunPython(pro_gets_more, migrations.RunPython.noop),
    ]
