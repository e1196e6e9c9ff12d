from rest_framework.routers import SimpleRouter

from apps.conversations import views

router = SimpleRouter(trailing_slash=False)
router.register("conversations", views.ConversationViewSet, basename="conversations")
router.register("admin/conversations", views.AdminConversationViewSet, basename="admin-conversations")

urlpatterns = router.urls
