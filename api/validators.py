"""Validators shared by the REST and OpenAI serializers."""

from __future__ import annotations

from rest_framework import serializers

NUL = "\x00"


def contains_nul(value: object) -> bool:
    """Whether a JSON value has U+0000 in any string, keys included."""
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, dict):
        return any(contains_nul(k) or contains_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(contains_nul(v) for v in value)
    return False


def reject_nul(value: object) -> object:
    """A serializer validator: PostgreSQL's ``jsonb`` and ``text`` cannot store U+0000, so a
    request carrying one is refused here with a 400 instead of failing at the database."""
    if contains_nul(value):
        raise serializers.ValidationError("NUL characters (U+0000) are not allowed in strings.")
    return value


def replace_nul(value: object) -> object:
    """The same JSON value with every U+0000 (in strings and keys) replaced by U+FFFD.

    For what a program produced (its result, error and output): refusing those would lose the
    run's outcome, so they are stored with the replacement character, as invalid UTF-8 is."""
    if isinstance(value, str):
        return value.replace(NUL, "\ufffd")
    if isinstance(value, dict):
        return {replace_nul(k): replace_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [replace_nul(v) for v in value]
    return value
