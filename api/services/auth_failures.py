"""Service-wide counts of refused credentials for ``/metrics`` (api/services/shared_counters.py).

The per-address throttles (api/authentication.py, DRF's ``auth`` scope) stop a single guesser;
these totals let an alert see guessing spread over many addresses.
"""

from __future__ import annotations

from api.services import shared_counters

#: reason -> what it counts.
REASONS = {
    "bad_api_key": "a bearer key that is wrong, malformed, revoked or expired (401)",
    "throttled_api_key": "a bearer key refused because its address sent too many wrong ones (429)",
    "bad_login": "a console sign-in with a wrong email or password (401)",
    "bad_reset_link": "a password-reset link that is malformed, used or expired (400)",
}
_PREFIX = "auth_failures:"


def record(reason: str) -> None:
    """Count one refusal (never fails the request it is counted for)."""
    if reason not in REASONS:
        raise ValueError(f"unknown auth failure reason {reason!r}")
    shared_counters.increment(_PREFIX + reason)


def totals() -> dict[str, int]:
    """Every reason's count so far (0 for those never seen)."""
    found = shared_counters.read(_PREFIX + reason for reason in REASONS)
    return {reason: found[_PREFIX + reason] for reason in REASONS}
