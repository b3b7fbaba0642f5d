"""The tenant's API keys: list, mint (secret shown once), revoke."""

from __future__ import annotations

from rest_framework import mixins, status
from rest_framework.response import Response

from api.models import ApiKey
from api.serializers.keys import ApiKeySerializer
from api.services import keys
from api.tenancy import TenantScopedViewSet
from api.views._shared import _console_user, _verified_user


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = ApiKey.objects.order_by("-created_at")
    serializer_class = ApiKeySerializer

    def get_queryset(self):
        return keys.manageable_keys(self.request.user, self.tenant).order_by("-created_at")

    def create(self, request):
        _verified_user(request)
        data = ApiKeySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = keys.create_key(
            _console_user(request),
            self.tenant,
            data.validated_data["name"],
            data.validated_data["scopes"],
            data.validated_data.get("expires_at"),
        )
        body = {**ApiKeySerializer(issued.key).data, "secret": issued.secret}
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        keys.revoke_by(_console_user(request), self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
