"""Signed download tokens (Authentication 4, D7): a time-limited capability to download one attachment without
credentials. ``base64url(payload) "." base64url(HMAC-SHA256(payload))``, the payload being the attachment id (16
bytes), the expiry in unix seconds (8), and who signed it: the user id and the API-key client id (empty: none), each
UTF-8 after its length (2 bytes). The HMAC key is ATTACHMENT_SIGNING_KEY or, when unset, derived from SECRET_KEY for
this one purpose. Verified in constant time; anything that does not verify, or has expired, is refused (403).

The signer is in the token so that the download checks, when it happens, that the signer may still read the
attachment (issue 28 item 8: a member removed from the conversation kept a working link until it expired)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
import time
import uuid

from django.conf import settings

from apps.core import errors

_PURPOSE = b"memory-service/attachments/download-token/v2"  # v1 tokens named no signer: refused
# A token is a URL path segment: its length is bounded, and so is what it may name.
MAX_TOKEN_CHARS = 2048
_FIXED = 16 + 8


def _key() -> bytes:
    secret = settings.ATTACHMENT_SIGNING_KEY or settings.SECRET_KEY
    return hmac.new(secret.encode("utf-8"), _PURPOSE, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# Who signed a token: (user id, API-key client id or None).
Signer = tuple[str, str | None]


def _field(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


def make_token(attachment_id: uuid.UUID, expires_in: int, *, signer: Signer) -> str:
    user_id, client_id = signer
    payload = (
        uuid.UUID(str(attachment_id)).bytes + struct.pack(">Q", int(time.time()) + expires_in)
        + _field(user_id) + _field(client_id or "")
    )  # fmt: skip
    return f"{_b64(payload)}.{_b64(hmac.new(_key(), payload, hashlib.sha256).digest())}"


def verify_token(token: str) -> tuple[uuid.UUID, Signer]:
    """The attachment id the token grants and who signed it; 403 when it is malformed, forged, tampered with or
    expired."""
    denied = errors.forbidden("The download link is invalid or has expired.")
    encoded_payload, dot, encoded_mac = token.partition(".")
    if not dot or len(token) > MAX_TOKEN_CHARS:
        raise denied
    try:
        payload = _unb64(encoded_payload)
        mac = _unb64(encoded_mac)
    except (binascii.Error, ValueError):
        raise denied from None
    expected = hmac.new(_key(), payload, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected) or len(payload) < _FIXED + 4:
        raise denied
    (expires_at,) = struct.unpack(">Q", payload[16:_FIXED])
    if time.time() >= expires_at:
        raise denied
    fields, offset = [], _FIXED
    for _ in range(2):
        (size,) = struct.unpack(">H", payload[offset : offset + 2])
        fields.append(payload[offset + 2 : offset + 2 + size].decode("utf-8"))
        offset += 2 + size
    user_id, client_id = fields
    return uuid.UUID(bytes=payload[:16]), (user_id, client_id or None)
