from django.urls import path

from apps.events.views import EventStreamView

urlpatterns = [path("events", EventStreamView.as_view(), name="events")]
