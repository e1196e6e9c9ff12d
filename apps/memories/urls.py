from django.urls import path

from apps.memories import views

urlpatterns = [
    path("memories", views.MemoriesView.as_view(), name="memories"),
    path("memories/search", views.MemorySearchView.as_view(), name="memories-search"),
    path("memories/namespaces", views.NamespacesView.as_view(), name="memories-namespaces"),
    path("memories/events", views.MemoryEventsView.as_view(), name="memories-events"),
]
