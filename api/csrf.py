"""CSRF for the routes that sign a browser in.

DRF checks Django's CSRF token only for requests its SessionAuthentication authenticated, so
an anonymous POST to sign-in or sign-up would pass without one: any page could sign a visitor's
browser into an account of the attacker's choosing (login CSRF), and what they then did in the
console (uploads, keys) would land in that account. These views require the token whoever is
asking, the way the console already sends it (``GET /auth/csrf`` first)."""

from __future__ import annotations

from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission


class CsrfTokenRequired(BasePermission):
    """Django's CSRF check on every unsafe request, signed in or not; a failure is DRF's 403
    ``permission_denied`` ("CSRF Failed: ...") in the API's error envelope."""

    def has_permission(self, request, view) -> bool:
        SessionAuthentication().enforce_csrf(request)
        return True
