"""The free plan's device pages per run within what one account may take of the smallest pool
the stack ships with (181 pages of SmolLM2-135M in float32 under ``make up``: ceiling 135): 256
promised more than any run could get (gpu_worker/resource_model.py). 128 pages hold 16,384
tokens, twice the default model's context."""

from django.db import migrations


def fit(apps, schema_editor):
    apps.get_model("api", "Plan").objects.filter(name="free", max_device_pages_per_run=256).update(
        max_device_pages_per_run=128
    )


def unfit(apps, schema_editor):
    apps.get_model("api", "Plan").objects.filter(name="free", max_device_pages_per_run=128).update(
        max_device_pages_per_run=256
    )


class Migration(migrations.Migration):
    dependencies = [("api", "0023_unverified_email")]

    operations = [migrations.RunPython(fit, unfit)]
