"""URL map. The REST API lives under /v1; operations endpoints at the root (D9)."""

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from apps.attachments import urls as attachments_urls
from apps.conversations import urls as conversations_urls
from apps.core import views as core_views
from apps.identity import urls as identity_urls
from apps.memories import urls as memories_urls
from apps.runtime import views as runtime_views
from apps.sharing import urls as sharing_urls

# The whole API under one resolver, tried first. Django tries the root's patterns in order, and each include whose
# prefix does not match (admin/, oidc/, dev-idp/) or whose patterns all fail (one include per app under v1/)
# raises and catches a Resolver404: resolving /v1/memories/events took 39 us that way, 12 us this way (issue 12).
# Nothing else starts with v1/ and the order within is the apps' order as before, so every path resolves as before.
API_V1 = [
    *identity_urls.urlpatterns,
    *memories_urls.urlpatterns,
    *conversations_urls.urlpatterns,
    *sharing_urls.urlpatterns,
    *attachments_urls.urlpatterns,
    # /v1/events is no URL here: config.asgi routes it to the Channels consumer (apps.events.routing), and
    # apps.events.schema describes it in the OpenAPI schema.
]

urlpatterns = [
    path("v1/", include(API_V1)),
    path("healthz", runtime_views.healthz, name="healthz"),
    path("readyz", runtime_views.readyz, name="readyz"),
    path("metrics", runtime_views.prometheus_metrics, name="metrics"),
    path("openapi.json", SpectacularJSONAPIView.as_view(), name="openapi"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi"), name="docs"),
    path("admin/", admin.site.urls),
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("dev-idp/", include("apps.identity.dev_idp.urls")),
    # Last: every unknown path is a JSON 404, with DEBUG on or off.
    re_path(r"^", core_views.handler404, name="unmatched"),
]

handler400 = "apps.core.views.handler400"
handler404 = "apps.core.views.handler404"
handler500 = "apps.core.views.handler500"
