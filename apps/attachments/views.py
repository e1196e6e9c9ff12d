"""HTTP endpoints of attachments. Thin: parse, call a service or selector, shape the response; the download
responses (streamed, 304, 302) are built here because they are HTTP, not storage."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from urllib.parse import quote

from django.conf import settings
from django.http import HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.http.request import UnreadablePostError
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ParseError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.attachments import responses, selectors, serializers, services, signing, storage
from apps.attachments.models import Attachment
from apps.attachments.upload import FILE_FIELD, AttachmentUploadHandler
from apps.core import audit, errors, pagination
from apps.core.requests import page_params, path_uuid, user_id_param
from apps.core.serializers import USER_ID_SCHEMA, ErrorSerializer, cursor_parameter, error_responses, limit_parameter
from apps.core.shapes import page_of
from apps.encryption import crypto
from apps.identity.permissions import IsAuditor, RoleChecked

logger = logging.getLogger(__name__)

# Served as downloads, never rendered inline: a browser would run their scripts on our origin (D7).
ACTIVE_TYPES = frozenset(
    {
        "text/html",
        "application/xhtml+xml",
        "image/svg+xml",
        "text/xml",
        "application/xml",
        "text/javascript",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "text/ecmascript",
        "application/pdf",
        "application/x-shockwave-flash",
        "text/css",
    }
)

# Headroom for the multipart framing around a file of exactly ATTACHMENT_MAX_BYTES: a Content-Length beyond the
# limit plus this is refused before a byte is read; anything smaller is counted while streaming.
MULTIPART_OVERHEAD_BYTES = 64 * 1024

_ID_PARAM = OpenApiParameter("id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="Attachment id")
# What every download (download_response) answers besides its errors.
_DOWNLOAD_RESPONSES = {
    (200, "*/*"): OpenApiResponse(OpenApiTypes.BINARY, description="The file, streamed, with ETag = its sha256"),
    302: OpenApiResponse(description="Redirect to a presigned object-store URL"),
    304: OpenApiResponse(
        description="Not modified (If-None-Match matched the ETag); with the 200's ETag and Cache-Control"
    ),
    500: OpenApiResponse(
        ErrorSerializer,
        description="code undecryptable: the file does not decrypt with the service's keys; code blob_missing: the "
        "attachment exists but its stored file is not in the service's storage (storage not shared by every host, "
        "a lost volume). Neither is fixed by retrying",
    ),
}


class _AnyAccept(BaseContentNegotiation):
    """Downloads answer with the file's own type whatever Accept says; errors are still the JSON error body."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def is_active_type(content_type: str) -> bool:
    return content_type in ACTIVE_TYPES or content_type.endswith("+xml")


def _etag_matches(header: str | None, sha256: str) -> bool:
    if not header:
        return False
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*":
            return True
        if candidate.startswith("W/"):
            candidate = candidate[2:]
        if candidate.strip('"') == sha256:
            return True
    return False


# Plaintext is handed to the server in pieces of about this size: each one crosses from the WSGI thread to the
# event loop (a2wsgi), which costs far more than joining a few chunks (measured: bench/attachments.py). a2wsgi queues
# up to 10 pieces per response, so this also bounds a download's memory (about 10 MiB while the client is slow).
RESPONSE_PIECE_BYTES = 1024 * 1024


def _stream(blob: storage.BlobReader, attachment: Attachment) -> Iterator[bytes]:
    """The plaintext in pieces of about RESPONSE_PIECE_BYTES. ``download_response`` opens the first piece before it
    answers, so a blob whose key is missing or whose start is damaged is a 500 ``undecryptable``; a later chunk that
    fails authentication ends the response early (its headers are already sent): the client sees a body shorter
    than Content-Length, never bytes that did not authenticate."""
    try:
        if attachment.encrypted:
            yield from crypto.open_reader(
                blob.read, purpose=services.BLOB_PURPOSE, row_id=str(attachment.id), piece_bytes=RESPONSE_PIECE_BYTES
            )
        else:
            yield from storage.iter_blob(blob)
    except crypto.DecryptionError as exc:
        crypto.report_undecryptable(exc, purpose=services.BLOB_PURPOSE, row_id=attachment.id)
        raise
    finally:
        blob.close()


# Cached by the caller only, revalidated every time (access can be revoked); a 304 repeats it (RFC 9110 15.4.5).
DOWNLOAD_CACHE_CONTROL = "private, no-cache"


def _opened_stream(blob: storage.BlobReader, attachment: Attachment) -> Iterator[bytes]:
    """``_stream`` with its first piece already read and authenticated (before any header is sent)."""
    pieces = _stream(blob, attachment)
    try:
        first = next(pieces, None)
    except crypto.DecryptionError:
        raise errors.undecryptable("The attachment") from None
    return itertools.chain(() if first is None else (first,), pieces)


def _missing_blob(attachment: Attachment) -> errors.ApiError:
    """The blob of an attachment this request found is not in storage. Blobs are removed only after their row's
    delete commits, so a row that is gone now was deleted while this request ran: 404. A row that is still there lost
    its blob (storage not shared between hosts or processes, a lost volume, a bucket emptied by hand): the server's
    fault, and retrying does not bring the file back, so 500 ``blob_missing`` (README "Several hosts"), logged."""
    if not selectors.still_stored(attachment.id):
        return errors.not_found("Attachment not found.")
    logger.error(
        "attachment blob missing from storage",
        extra={"attachment_id": str(attachment.id), "blob": attachment.storage_name, "storage": settings.ATTACHMENT_STORAGE},
    )
    return errors.blob_missing("The attachment")

def _check_opens(blob: storage.BlobReader, attachment: Attachment) -> None:
    """What a GET checks before its headers go out, for a HEAD: the first piece read and authenticated (one piece,
    not the blob), so both answer alike, 500 ``undecryptable`` included; the blob is closed either way."""
    pieces = _stream(blob, attachment)
    try:
        next(pieces, None)
    except crypto.DecryptionError:
        raise errors.undecryptable("The attachment") from None
    finally:
        pieces.close()


def download_response(request: Request, attachment: Attachment) -> HttpResponse:
    etag = f'"{attachment.sha256}"'
    active = is_active_type(attachment.content_type)
    if _etag_matches(request.META.get("HTTP_IF_NONE_MATCH"), attachment.sha256):
        response = HttpResponse(status=304)
        del response["Content-Type"]
        response["ETag"] = etag
        response["Cache-Control"] = DOWNLOAD_CACHE_CONTROL
        response["X-Content-Type-Options"] = "nosniff"
        return response
    disposition = content_disposition_header(active, attachment.filename)
    if settings.ATTACHMENT_S3_DIRECT_DOWNLOAD and not attachment.encrypted and storage.is_s3():
        url = storage.presigned_url(
            attachment.storage_name,
            content_type=attachment.content_type,
            disposition=disposition,
            expires_in=settings.ATTACHMENT_DOWNLOAD_URL_EXPIRES_IN,
        )
        response = HttpResponseRedirect(url)
        response["Cache-Control"] = "no-store"
        return response
    try:
        blob = storage.open_blob(attachment.storage_name)
    except storage.BlobMissing:
        raise _missing_blob(attachment) from None
    if request.method == "HEAD":
        # The headers of the download and no body: the server would drop a streamed body anyway, but only after
        # this thread had read (and decrypted) every byte of it. Only what the GET checks first is done.
        if attachment.encrypted:
            _check_opens(blob, attachment)
        else:
            blob.close()
        response = HttpResponse(b"", content_type=attachment.content_type)
    else:
        response = StreamingHttpResponse(_opened_stream(blob, attachment), content_type=attachment.content_type)
    response["Content-Length"] = str(attachment.size)
    response["ETag"] = etag
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = disposition
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    response["Cache-Control"] = DOWNLOAD_CACHE_CONTROL
    return response


class AttachmentsView(APIView):
    parser_classes = [MultiPartParser]
    rate_kinds = {"post": "uploads"}  # apps.limits.throttling

    @extend_schema(
        tags=["attachments"],
        summary="Upload a file",
        description="multipart/form-data with one part `file`. `expiresIn` (query or form field): an ISO-8601 "
        "duration (PT90S, PT30M, PT1H, P1D) or whole seconds, default 1 h, at most ATTACHMENT_MAX_EXPIRES_IN. "
        "Larger than ATTACHMENT_MAX_BYTES: 413. Unreferenced attachments are removed once expired; an entry "
        "referencing one (`{\"attachmentId\": ...}`) keeps it.",
        parameters=[OpenApiParameter("expiresIn", serializers.expires_in_schema())],
        request={
            "multipart/form-data": {
                "type": "object",
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "expiresIn": serializers.expires_in_schema(),
                },
                "required": ["file"],
            }
        },
        responses={
            201: responses.AttachmentResponse,
            **error_responses(400, 401, 413, 415),
            408: OpenApiResponse(
                ErrorSerializer,
                description="upload_timeout: the upload outlived ATTACHMENT_UPLOAD_TIMEOUT_SECONDS and was removed",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        query_expires = request.query_params.get("expiresIn")
        # An empty value is no value (the schema's pattern admits it); the query's wins over the form field's, and
        # both are validated.
        expires_in = serializers.parse_expires_in(query_expires) if query_expires else None
        length = request.META.get("CONTENT_LENGTH") or "0"
        try:
            too_big = int(length) > settings.ATTACHMENT_MAX_BYTES + MULTIPART_OVERHEAD_BYTES
        except ValueError:
            raise errors.validation_error({"Content-Length": "must be an integer"}) from None
        if too_big:
            raise errors.payload_too_large(f"The file exceeds the upload limit of {settings.ATTACHMENT_MAX_BYTES} bytes.")
        handler = AttachmentUploadHandler(request.user, request._request)
        request._request.upload_handlers = [handler]
        try:
            files = request.FILES
            form_expires = request.data.get("expiresIn")
            if handler.finished is None or FILE_FIELD not in files:
                raise errors.validation_error({FILE_FIELD: "a file part named 'file' is required"})
            form_expires_in = serializers.parse_expires_in(form_expires) if form_expires else None
            if expires_in is None:
                expires_in = form_expires_in or serializers.parse_expires_in(None)
            attachment = handler.finished.upload.complete(expires_in)
        except ParseError:
            handler.abort()
            raise errors.validation_error({"body": "malformed multipart body"}, "Malformed multipart body.") from None
        except UnreadablePostError:
            handler.abort()
            raise errors.validation_error({"body": "the upload was interrupted"}, "Upload interrupted.") from None
        except BaseException:
            handler.abort()
            raise
        return Response(selectors.attachment_response(attachment), status=201)


class AttachmentView(APIView):
    content_negotiation_class = _AnyAccept

    @extend_schema(
        tags=["attachments"],
        summary="Download a file",
        description="Streams the content with Content-Type, Content-Length, ETag (the sha256), "
        "X-Content-Type-Options: nosniff, and Content-Disposition: attachment for active types (HTML, SVG, ...). "
        "If-None-Match with the ETag: 304. With S3 storage and ATTACHMENT_S3_DIRECT_DOWNLOAD, a file not encrypted "
        "by the service: 302 to a presigned URL. Readable by the uploader and by whoever may read an entry "
        "referencing it: the conversation's readers, and for a context entry (private to its API-key client) only "
        "readers calling through that client. Admins and auditors have no bypass here (403 like anyone else); "
        "they read through GET /v1/admin/attachments/{id}, which is audit-logged.",
        parameters=[_ID_PARAM],
        responses={**_DOWNLOAD_RESPONSES, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> HttpResponse:
        attachment = selectors.readable_attachment(request.user, path_uuid(id, "id"))
        return download_response(request, attachment)

    @extend_schema(
        tags=["attachments"],
        summary="Delete a file",
        description="The uploader or an admin (an admin deleting someone else's file is audit-logged). Entries "
        "referencing it keep their attachmentId; downloads then 404.",
        parameters=[_ID_PARAM],
        responses={204: None, **error_responses(400, 401, 403, 404)},
    )
    def delete(self, request: Request, id: str) -> Response:
        services.delete_attachment(request.user, path_uuid(id, "id"))
        return Response(status=204)


class DownloadUrlView(APIView):
    @extend_schema(
        tags=["attachments"],
        summary="Get a signed download URL",
        description="A time-limited URL (ATTACHMENT_DOWNLOAD_URL_EXPIRES_IN, default 300 s) that downloads the file "
        "without an Authorization header. Same access as the download.",
        parameters=[_ID_PARAM],
        responses={200: responses.DownloadUrlResponse, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> Response:
        attachment = selectors.readable_attachment(request.user, path_uuid(id, "id"))
        expires_in = settings.ATTACHMENT_DOWNLOAD_URL_EXPIRES_IN
        token = signing.make_token(attachment.id, expires_in, signer=(request.user.user_id, request.user.client_id))
        url = f"/v1/attachments/download/{token}/{quote(attachment.filename, safe='')}"
        return Response(responses.DownloadUrlResponse.render(url=url, expires_in=expires_in))


class SignedDownloadView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    content_negotiation_class = _AnyAccept

    @extend_schema(
        tags=["attachments"],
        summary="Download through a signed URL",
        description="No Authorization: the signed, time-limited token authorizes the call (403 when it is invalid, "
        "tampered with or expired, or when whoever signed it can no longer read the file, e.g. a member removed from "
        "the conversation since; 404 when the file is gone). The filename segment is cosmetic.",
        parameters=[
            OpenApiParameter("token", str, OpenApiParameter.PATH),
            OpenApiParameter("filename", str, OpenApiParameter.PATH),
        ],
        responses={**_DOWNLOAD_RESPONSES, **error_responses(403, 404)},
    )
    def get(self, request: Request, token: str, filename: str) -> HttpResponse:
        attachment_id, signer = signing.verify_token(token)
        return download_response(request, selectors.readable_by_signer(signer, attachment_id))


class AdminAttachmentsView(RoleChecked, APIView):
    permission_classes = [IsAuditor]

    @extend_schema(
        tags=["admin"],
        summary="List all attachments",
        description="Auditor or admin role; newest first; audit-logged. Each item's `href` is the user download, "
        "which applies the user rules to admins too; staff read the bytes with GET /v1/admin/attachments/{id}.",
        parameters=[
            OpenApiParameter("userId", USER_ID_SCHEMA, description="Uploader filter"),
            cursor_parameter(),
            limit_parameter(serializers.ADMIN_ATTACHMENTS_LIMIT),
        ],
        responses={200: page_of(responses.AdminAttachmentResponse), **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        user_id = user_id_param(request.query_params.get("userId"), "userId")
        cursor, limit = page_params(request, serializers.ADMIN_ATTACHMENTS_LIMIT)
        if cursor is not None:
            pagination.decode_cursor(cursor, selectors.ADMIN_CURSOR)
        self.authorize(request)
        audit.record(
            request.user,
            "admin.attachments.list",
            params={"userId": user_id, "limit": limit, "afterCursor": cursor is not None},
        )
        return Response(selectors.admin_list(user_id=user_id, cursor=cursor, limit=limit))


class AdminAttachmentView(RoleChecked, APIView):
    permission_classes = [IsAuditor]
    content_negotiation_class = _AnyAccept

    @extend_schema(
        tags=["admin"],
        summary="Download any attachment (auditor or admin role)",
        description="The admins' and auditors' way to read a file they may not read as users (the user endpoints "
        "give them no bypass). Audit-logged (who, which attachment, the request id; never the bytes). Any ready "
        "attachment the admin list shows, expired ones awaiting the sweep included. The response is the "
        "download's: Content-Type, Content-Length, ETag, nosniff, Content-Disposition: attachment for active types; "
        "If-None-Match with the ETag: 304; 302 to a presigned URL in S3 direct-download mode.",
        parameters=[_ID_PARAM],
        responses={**_DOWNLOAD_RESPONSES, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, id: str) -> HttpResponse:
        attachment_id = path_uuid(id, "id")
        self.authorize(request)
        audit.record(request.user, "admin.attachments.get", target_id=str(attachment_id))
        return download_response(request, selectors.admin_get(attachment_id))
