"""Thin DRF views, one module per domain: validate with serializers, call api/services, shape
responses. api/urls.py routes to the modules directly:

- ``auth``: sign-up, sign-in, the session's identity and tenant, password and email changes
- ``team``: create and close tenants, members, invitations, audit log
- ``keys``: API keys
- ``programs``: programs and their versions
- ``runs``: runs (their event stream is ``run_events``)
- ``run_trace``: a run's trace (where its time went), as JSON or Chrome trace events
- ``usage``: quota, usage, invoices
- ``kv``: the tenant's KV files
- ``staff``: staff-only views of workers, tenants and KV files

Async Django views (not DRF; served by the ASGI app, routed by api/urls.py and api/openai_urls.py):

- ``run_events``: a run's Server-Sent Events (``GET /api/v1/runs/<id>/events``)
- ``openai``: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` and OpenAI's error
  envelope on every other ``/v1/`` path
- ``responses``: ``/v1/responses`` (OpenAI's Responses API)
"""
