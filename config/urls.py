"""URL map. The REST API lives under /v1; operations endpoints at the root (D9)."""

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from apps.core import views as core_views

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    path("readyz", core_views.readyz, name="readyz"),
    path("metrics", core_views.prometheus_metrics, name="metrics"),
    path("openapi.json", SpectacularJSONAPIView.as_view(), name="openapi"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi"), name="docs"),
    path("admin/", admin.site.urls),
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("dev-idp/", include("apps.core.auth.dev_idp.urls")),
    path("v1/", include("apps.core.urls")),
    path("v1/", include("apps.memories.urls")),
    path("v1/", include("apps.conversations.urls")),
    path("v1/", include("apps.sharing.urls")),
    path("v1/", include("apps.attachments.urls")),
    # Served by the ASGI consumer (apps.events.routing); listed here for OpenAPI and WSGI-only callers.
    path("v1/", include("apps.events.urls")),
    # Last: every unknown path is a JSON 404, with DEBUG on or off.
    re_path(r"^", core_views.handler404, name="unmatched"),
]

handler400 = "apps.core.views.handler400"
handler404 = "apps.core.views.handler404"
handler500 = "apps.core.views.handler500"
