"""Mounted at /dev-idp/ by config.urls. The routes always exist; the views answer 404 unless DEV_IDP_ENABLED, so the
setting can be decided per environment (and per test) without touching the URL map."""

from django.urls import path

from apps.identity.dev_idp import views

app_name = "dev_idp"

urlpatterns = [
    path(".well-known/openid-configuration", views.openid_configuration, name="openid-configuration"),
    path("jwks", views.jwks, name="jwks"),
    path("token", views.token, name="token"),
]
