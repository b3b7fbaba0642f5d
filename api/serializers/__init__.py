"""Request validation and response shapes, one module per domain beside its views (api/views/);
no business logic (that lives in api/services). Import a serializer from its domain's module:

- ``auth``, ``team``, ``keys``, ``programs``, ``runs``, ``run_trace``, ``kv``, ``tool_hosts``,
  ``staff_tenants``:
  the REST API under ``/api/v1/``
- ``openai``: ``/v1/chat/completions`` and ``/v1/completions``
- ``responses``: ``/v1/responses``, built on ``openai``'s message and tool serializers

A serializer's class name is its OpenAPI component's name (frontend/openapi/schema.yml): moving
one between modules changes nothing there, renaming it does.
"""
