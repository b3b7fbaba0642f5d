"""OpenAPI descriptions of the API's authentication schemes (loaded from ApiConfig.ready)."""

from drf_spectacular.authentication import SessionScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "sk_<prefix>_<secret>"}


class ConsoleSessionScheme(SessionScheme):
    """The console's session cookie, as DRF's own session scheme (``cookieAuth``): the class
    only changes where its database read is counted (api/session_authentication.py)."""

    target_class = "api.session_authentication.ConsoleSessionAuthentication"
