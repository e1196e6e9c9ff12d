"""Placeholder until the auth module lands."""

from rest_framework.authentication import BaseAuthentication


class ServiceAuthentication(BaseAuthentication):
    def authenticate(self, request):
        return None

    def authenticate_header(self, request):
        return 'Bearer realm="memory-service"'
