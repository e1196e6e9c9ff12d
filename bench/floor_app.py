"""The framework floor for /healthz (bench only, never routed by the service): one minimal DRF view on the service's
own stack (gunicorn + uvicorn workers + the service's a2wsgi bridge, apps.runtime.wsgi_bridge + Django + DRF, same WSGI
threads and GIL switch interval as config/asgi.py) with no middleware, no authentication and no database.

Served by bench/memories.py with the service's gunicorn flags: ``gunicorn --chdir bench floor_app:application``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Served with --chdir bench: the project's own packages (apps.runtime.wsgi_bridge) are one level up.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-floor-only",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[],
    # The bridge reads each request's body limit from the service's middleware module, which imports
    # django.contrib.auth's: installed, but no middleware runs.
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"],
    USE_TZ=True,
    # Read by the service's HTTP protocol (apps/runtime/http_server.py, set in config/gunicorn.conf.py): the same values.
    REQUEST_HEADER_TIMEOUT_SECONDS=float(os.environ.get("REQUEST_HEADER_TIMEOUT_SECONDS", "10")),
    REQUEST_BODY_TIMEOUT_SECONDS=float(os.environ.get("REQUEST_BODY_TIMEOUT_SECONDS", "60")),
    REQUEST_BODY_MIN_BYTES_PER_SECOND=int(os.environ.get("REQUEST_BODY_MIN_BYTES_PER_SECOND", "8192")),
    REQUEST_BODY_MAX_SECONDS=float(os.environ.get("REQUEST_BODY_MAX_SECONDS", "1800")),
    REQUEST_MAX_HEADER_BYTES=int(os.environ.get("REQUEST_MAX_HEADER_BYTES", str(64 * 1024))),
    REQUEST_MAX_BODY_BYTES=int(os.environ.get("REQUEST_MAX_BODY_BYTES", str(2 * 1024 * 1024))),
    REST_FRAMEWORK={
        "DEFAULT_AUTHENTICATION_CLASSES": [],
        "DEFAULT_PERMISSION_CLASSES": [],
        "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
        "UNAUTHENTICATED_USER": None,
    },
)

import django  # noqa: E402

django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.views import APIView  # noqa: E402

from apps.runtime.wsgi_bridge import CoalescingWSGIMiddleware, acknowledge_lifespan  # noqa: E402


class Ok(APIView):
    def get(self, request):
        return Response({"status": "ok"})


urlpatterns = [path("healthz", Ok.as_view()), path("readyz", Ok.as_view())]

sys.setswitchinterval(int(os.environ.get("GIL_SWITCH_INTERVAL_MS", "1")) / 1000)
_wsgi = CoalescingWSGIMiddleware(get_wsgi_application(), workers=int(os.environ.get("WSGI_THREADS", "16")))


async def application(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        await acknowledge_lifespan(receive, send)
        return
    await _wsgi(scope, receive, send)
