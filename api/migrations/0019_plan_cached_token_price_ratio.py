from decimal import Decimal

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    """Plans price cached prompt tokens (prefix cache, stored KV files) as a fraction of a prefill
    token; the usage row's ``cached_tokens`` becomes a billed counter (no schema change there)."""

    dependencies = [
        ("api", "0018_plan_max_tool_hosts"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="cached_token_price_ratio",
            field=models.DecimalField(
                decimal_places=4,
                default=Decimal("0.1"),
                max_digits=5,
                validators=[
                    django.core.validators.MinValueValidator(Decimal("0")),
                    django.core.validators.MaxValueValidator(Decimal("1")),
                ],
            ),
        ),
    ]
