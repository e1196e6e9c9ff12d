"""Signed download tokens (Authentication 4, D7): a time-limited capability to download one attachment without
credentials. ``base64url(attachment id (16) | expiry unix seconds (8)) "." base64url(HMAC-SHA256)``; the HMAC key
is ATTACHMENT_SIGNING_KEY or, when unset, derived from SECRET_KEY for this one purpose. Verified in constant time;
anything that does not verify, or has expired, is refused (403)."""

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

_PURPOSE = b"memory-service/attachments/download-token/v1"


def _key() -> bytes:
    secret = settings.ATTACHMENT_SIGNING_KEY or settings.SECRET_KEY
    return hmac.new(secret.encode("utf-8"), _PURPOSE, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_token(attachment_id: uuid.UUID, expires_in: int) -> str:
    payload = uuid.UUID(str(attachment_id)).bytes + struct.pack(">Q", int(time.time()) + expires_in)
    return f"{_b64(payload)}.{_b64(hmac.new(_key(), payload, hashlib.sha256).digest())}"


def verify_token(token: str) -> uuid.UUID:
    """The attachment id the token grants; 403 when it is malformed, forged, tampered with or expired."""
    denied = errors.forbidden("The download link is invalid or has expired.")
    encoded_payload, dot, encoded_mac = token.partition(".")
    if not dot or len(token) > 200:
        raise denied
    try:
        payload = _unb64(encoded_payload)
        mac = _unb64(encoded_mac)
    except (binascii.Error, ValueError):
        raise denied from None
    expected = hmac.new(_key(), payload, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected) or len(payload) != 24:
        raise denied
    (expires_at,) = struct.unpack(">Q", payload[16:])
    if time.time() >= expires_at:
        raise denied
    return uuid.UUID(bytes=payload[:16])
