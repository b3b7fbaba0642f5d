"""A tenant's tokens per month, kept by a trigger on the usage rows (``api.models.MonthlyTokens``).

The trigger is the only writer: on every insert, update and delete of ``api_usagerecord`` it
moves the row's ``prefill_tokens + decode_tokens`` into (and out of) the counter of the row's
tenant and UTC month, in the same transaction. A delete only decrements an existing counter,
never creates one: when a tenant is deleted its counters may go before its usage rows, and a
counter created then would point at a tenant about to be gone. Existing rows are summed once.
"""

import django.db.models.deletion
from django.db import migrations, models

TRIGGER = """
CREATE FUNCTION api_monthly_tokens_apply() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    old_tokens bigint;
    new_tokens bigint;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        old_tokens := OLD.prefill_tokens + OLD.decode_tokens;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        new_tokens := NEW.prefill_tokens + NEW.decode_tokens;
    END IF;
    IF TG_OP = 'UPDATE' AND old_tokens = new_tokens AND OLD.tenant_id = NEW.tenant_id
            AND date_trunc('month', OLD.created_at AT TIME ZONE 'UTC')
                = date_trunc('month', NEW.created_at AT TIME ZONE 'UTC') THEN
        RETURN NEW;  -- a run's deletion nulls its usage row's run: nothing to move
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND old_tokens <> 0 THEN
        UPDATE api_monthlytokens SET tokens = tokens - old_tokens
         WHERE tenant_id = OLD.tenant_id
           AND month = date_trunc('month', OLD.created_at AT TIME ZONE 'UTC')::date;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND new_tokens <> 0 THEN
        INSERT INTO api_monthlytokens (tenant_id, month, tokens)
        VALUES (NEW.tenant_id, date_trunc('month', NEW.created_at AT TIME ZONE 'UTC')::date, new_tokens)
        ON CONFLICT (tenant_id, month) DO UPDATE SET tokens = api_monthlytokens.tokens + EXCLUDED.tokens;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER api_usagerecord_monthly_tokens
AFTER INSERT OR UPDATE OR DELETE ON api_usagerecord
FOR EACH ROW EXECUTE FUNCTION api_monthly_tokens_apply();
INSERT INTO api_monthlytokens (tenant_id, month, tokens)
SELECT tenant_id, date_trunc('month', created_at AT TIME ZONE 'UTC')::date, SUM(prefill_tokens + decode_tokens)
  FROM api_usagerecord
 GROUP BY 1, 2
HAVING SUM(prefill_tokens + decode_tokens) <> 0;
"""

DROP_TRIGGER = """
DROP TRIGGER IF EXISTS api_usagerecord_monthly_tokens ON api_usagerecord;
DROP FUNCTION IF EXISTS api_monthly_tokens_apply();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0027_run_traceparent"),
    ]

    operations = [
        migrations.CreateModel(
            name="MonthlyTokens",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("month", models.DateField()),
                ("tokens", models.BigIntegerField(default=0)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="monthly_tokens", to="api.tenant"
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("tenant", "month"), name="monthly_tokens_per_tenant")],
            },
        ),
        migrations.RunSQL(TRIGGER, DROP_TRIGGER),
    ]
