"""``GET /runs/<id>/trace``: its query and the shape of its answer (for the OpenAPI schema;
the tree itself is built by api/services/run_traces.py)."""

from __future__ import annotations

from rest_framework import serializers

#: ``?format=``: the tree as JSON, or the Chrome trace-event format (Perfetto, chrome://tracing).
TRACE_FORMATS = ("json", "chrome")


class RunTraceQuerySerializer(serializers.Serializer):
    format = serializers.ChoiceField(
        choices=TRACE_FORMATS,
        default="json",
        help_text="`json` (default): the span tree; `chrome`: Chrome trace-event JSON that Perfetto opens.",
    )


class RunTraceSpanSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    parent = serializers.IntegerField(allow_null=True, help_text="the enclosing span's id; null for the run")
    name = serializers.CharField(help_text="`run`, `queued`, `execute`, `sandbox.start`, a system call's name, ...")
    kind = serializers.CharField(
        help_text="`run`, `control`, `sandbox`, `worker`, `syscall`, `io`, `wait`, `kv_move` or `child`"
    )
    start_s = serializers.FloatField(help_text="seconds since the run was created")
    end_s = serializers.FloatField()
    duration_s = serializers.FloatField(help_text="end - start; for an aggregated span, its spans' summed time")
    attrs = serializers.DictField(help_text="queue_wait_s, batch_size, batch_tokens, bytes, warm, count, ...")


class RunTraceSerializer(serializers.Serializer):
    run = serializers.UUIDField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    complete = serializers.BooleanField(help_text="false until the run's executor recorded its spans (at its end)")
    worker_tracing = serializers.ChoiceField(
        choices=("on", "off"),
        allow_null=True,
        help_text="`off`: the worker ran with tracing off (`--trace off`): no worker spans, only the control"
        " plane's marks and the session's bounds; null until the worker's part is recorded",
    )
    spans_kept = serializers.IntegerField(help_text="worker spans kept one by one; later ones are per-second buckets")
    dropped = serializers.IntegerField(help_text="worker spans past the bucket bound, only counted")
    children_left_out = serializers.IntegerField()
    spans = RunTraceSpanSerializer(many=True)
