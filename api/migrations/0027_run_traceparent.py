from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0026_run_trace"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="traceparent",
            field=models.CharField(blank=True, default="", max_length=55),
        ),
    ]
