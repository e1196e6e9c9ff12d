from rest_framework.routers import SimpleRouter

from apps.sharing import views

router = SimpleRouter(trailing_slash=False)
router.register(
    r"conversations/(?P<conversationId>[^/]+)/memberships", views.MembershipViewSet, basename="conversation-memberships"
)
router.register(
    r"admin/conversations/(?P<conversationId>[^/]+)/memberships",
    views.AdminMembershipViewSet,
    basename="admin-conversation-memberships",
)
router.register("ownership-transfers", views.OwnershipTransferViewSet, basename="ownership-transfers")

urlpatterns = router.urls
