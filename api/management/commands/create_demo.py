"""Create the demo admin user (idempotent). Used by ``make up``.

The password comes from ``SYMPHONY_ADMIN_PASSWORD`` or is generated once and kept in
``var/admin-credentials.txt`` (mode 0600) so later ``make up`` runs print the same one.
"""

from __future__ import annotations

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the demo admin user and print its credentials."

    def handle(self, *args: object, **options: object) -> None:
        creds_path = settings.VAR_DIR / "admin-credentials.txt"
        username = os.environ.get("SYMPHONY_ADMIN_USER", "admin")
        password = os.environ.get("SYMPHONY_ADMIN_PASSWORD")
        if not password and creds_path.exists():
            password = dict(line.split(": ", 1) for line in creds_path.read_text().splitlines() if ": " in line).get(
                "Admin password"
            )
        password = password or secrets.token_urlsafe(12)
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(username=username, defaults={"email": f"{username}@localhost"})
        user.is_staff = True
        user.is_superuser = True
        user.set_password(password)
        user.save()
        creds_path.parent.mkdir(parents=True, exist_ok=True)
        # The first line is what to type in the console's and Django admin's sign-in forms.
        creds_path.write_text(
            f"Sign in as: {username} (or {user.email})\nAdmin user: {username}\nAdmin password: {password}\n"
        )
        creds_path.chmod(0o600)
        verb = "created" if created else "updated"
        self.stdout.write(f"demo: admin user '{username}' {verb}; credentials in {creds_path}")
        self._demo_tenant(settings.VAR_DIR / "demo-api-key.txt")

    def _demo_tenant(self, key_path) -> None:
        """Tenant "demo" owned by demo@example.com with one API key kept in ``key_path`` (0600);
        a key file whose key no longer verifies is replaced."""
        from api.models import Membership, Tenant
        from api.services.keys import issue_key, verify_key
        from api.tenancy import KEY_SCOPES

        user, _ = get_user_model().objects.get_or_create(
            username="demo@example.com", defaults={"email": "demo@example.com"}
        )
        tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
        Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": "owner"})
        if key_path.exists() and verify_key(key_path.read_text().strip()) is not None:
            self.stdout.write(f"demo: tenant 'demo' ready; API key in {key_path}")
            return
        secret = issue_key(tenant, "demo", list(KEY_SCOPES), user).secret
        key_path.write_text(secret + "\n")
        key_path.chmod(0o600)
        self.stdout.write(f"demo: tenant 'demo' ready; new API key in {key_path}")
