"""Routes under /v1 owned by the core app."""

from django.urls import path

from apps.identity import views as auth_views

urlpatterns = [
    path("me", auth_views.me, name="me"),
]
