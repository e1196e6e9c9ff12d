from django.urls import path

from apps.attachments import views

urlpatterns = [
    path("attachments", views.AttachmentsView.as_view(), name="attachments"),
    path(
        "attachments/download/<str:token>/<str:filename>",
        views.SignedDownloadView.as_view(),
        name="attachments-signed-download",
    ),
    path("attachments/<str:id>", views.AttachmentView.as_view(), name="attachment"),
    path("attachments/<str:id>/download-url", views.DownloadUrlView.as_view(), name="attachment-download-url"),
    path("admin/attachments", views.AdminAttachmentsView.as_view(), name="admin-attachments"),
    path("admin/attachments/<str:id>", views.AdminAttachmentView.as_view(), name="admin-attachment"),
]
