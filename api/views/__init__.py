"""Thin DRF views, one module per domain: validate with serializers, call api/services, shape
responses. api/urls.py routes to the modules directly:

- ``auth``: sign-up, sign-in, the session's identity and tenant, password and email changes
- ``team``: create and close tenants, members, invitations, audit log
- ``keys``: API keys
- ``programs``: programs and their versions
- ``runs``: runs (the event stream is api/run_events_view.py)
- ``run_trace``: a run's trace (where its time went), as JSON or Chrome trace events
- ``usage``: quota, usage, invoices
- ``kv``: the tenant's KV files
- ``staff``: staff-only views of workers, tenants and KV files
"""
