from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("api", "0012_plan_kv_shares")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="idempotency_digest",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
