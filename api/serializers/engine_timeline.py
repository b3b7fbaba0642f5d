"""``GET /staff/workers/<name>/timeline``: the shape of its answer (for the OpenAPI schema; the
timeline itself is read by api/services/engine_timeline.py)."""

from __future__ import annotations

from rest_framework import serializers


class EngineForwardSerializer(serializers.Serializer):
    start = serializers.FloatField(help_text="when the forward started (Unix time, seconds)")
    duration_s = serializers.FloatField()
    batch_size = serializers.IntegerField(help_text="sequences in the forward")
    prompt_tokens = serializers.IntegerField(help_text="prompt (prefill) tokens computed")
    decode_tokens = serializers.IntegerField(help_text="decode steps (one new token each)")
    sessions = serializers.IntegerField(help_text="runs with a call in the forward")
    accounts = serializers.IntegerField(help_text="accounts with a call in the forward")
    tokens_per_account = serializers.DictField(child=serializers.IntegerField(), help_text="tokens by account")


class EngineTimelineSerializer(serializers.Serializer):
    worker = serializers.CharField()
    capacity = serializers.IntegerField(help_text="forwards the worker keeps (older ones are dropped)")
    recorded = serializers.IntegerField(help_text="forwards run since the worker started")
    forwards = EngineForwardSerializer(many=True, help_text="oldest first")
