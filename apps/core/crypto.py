"""Encryption at rest (D4): the one place that seals and opens stored secrets (memory values, later conversation
entries and attachments).

Envelope, format version 1 (all lengths in bytes)::

    magic "MS" (2) | version 0x01 (1) | kid length n (1) | kid (n, ASCII) | nonce (12) | AES-256-GCM ciphertext+tag

The header (magic .. kid) travels in clear so the key ring can pick the key and ``rotate_encryption_key`` can find
rows not yet under the primary key without decrypting. Associated data = header + purpose + row id (each
length-prefixed), so the header cannot be edited and a ciphertext moved to another row or column does not open.
A later format (e.g. chunked streams for attachments) gets a new version byte; readers reject versions they do
not know instead of guessing.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import struct
import threading
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

MAGIC = b"MS"
FORMAT_V1 = 1
NONCE_BYTES = 12  # 96-bit nonces: GCM's native size, random per encryption
KEY_BYTES = 32  # AES-256
TAG_BYTES = 16
_KID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_SETTING = "MEMORY_ENCRYPTION_KEYS"


class DecryptionError(Exception):
    """The blob does not open: unknown key id, malformed envelope, or authentication failed (tampered, wrong row,
    wrong purpose, wrong key). Deliberately one type: callers cannot act differently on the cases."""


@dataclass(frozen=True)
class KeyRing:
    primary: str
    keys: dict[str, AESGCM]

    def key(self, kid: str) -> AESGCM:
        try:
            return self.keys[kid]
        except KeyError:
            raise DecryptionError(f"unknown encryption key id {kid!r}") from None


def parse_keyring(raw: str) -> KeyRing:
    """``"kid:base64key,kid2:base64key"`` → KeyRing. Messages name the entry and kid, never key material."""
    entries = [item.strip() for item in raw.split(",") if item.strip()]
    if not entries:
        raise ImproperlyConfigured(f"{_SETTING} is empty: set it to 'kid:base64key[,kid2:base64key...]'")
    keys: dict[str, AESGCM] = {}
    order: list[str] = []
    for position, entry in enumerate(entries, start=1):
        kid, sep, encoded = entry.partition(":")
        kid = kid.strip()
        where = f"{_SETTING} entry #{position}"
        if not sep:
            raise ImproperlyConfigured(f"{where} must look like 'kid:base64key' (no ':' found)")
        if not _KID_RE.match(kid):
            raise ImproperlyConfigured(f"{where}: key id must be 1-64 characters of A-Z a-z 0-9 . _ -")
        if kid in keys:
            raise ImproperlyConfigured(f"{where}: key id {kid!r} appears twice")
        key = _decode_key(encoded.strip())
        if key is None:
            raise ImproperlyConfigured(f"{where} (kid {kid!r}): the key is not valid base64")
        if len(key) != KEY_BYTES:
            raise ImproperlyConfigured(
                f"{where} (kid {kid!r}): the key decodes to {len(key)} bytes; AES-256 needs exactly {KEY_BYTES}"
            )
        keys[kid] = AESGCM(key)
        order.append(kid)
    return KeyRing(primary=order[0], keys=keys)


def _decode_key(encoded: str) -> bytes | None:
    # Operators paste keys from `openssl rand -base64 32` or from url-safe generators; accept both alphabets and a
    # missing padding, but nothing else (validate=True rejects stray characters instead of silently dropping them).
    normalized = encoded.replace("-", "+").replace("_", "/")
    normalized += "=" * (-len(normalized) % 4)
    try:
        return base64.b64decode(normalized, validate=True)
    except (binascii.Error, ValueError):
        return None


_cache_lock = threading.Lock()
_cache: tuple[str, KeyRing] | None = None


def keyring() -> KeyRing:
    """The parsed key ring, re-parsed whenever the setting's value differs from the cached one (override_settings
    in tests, a changed environment in a long-lived shell)."""
    global _cache
    raw = getattr(settings, _SETTING, "") or ""
    cached = _cache
    if cached is not None and cached[0] == raw:
        return cached[1]
    ring = parse_keyring(raw)
    with _cache_lock:
        _cache = (raw, ring)
    return ring


def _invalidate(*, setting: str, **_: Any) -> None:
    global _cache
    if setting == _SETTING:
        with _cache_lock:
            _cache = None


setting_changed.connect(_invalidate, dispatch_uid="apps.core.crypto.invalidate")


def check_configuration() -> None:
    """Parse the key ring now (start-up / readiness), so a malformed key stops the service before the first write."""
    keyring()


def primary_key_id() -> str:
    return keyring().primary


def _header(kid: str) -> bytes:
    encoded = kid.encode("ascii")
    return MAGIC + bytes((FORMAT_V1, len(encoded))) + encoded


def _aad(header: bytes, purpose: str, row_id: str) -> bytes:
    # Length prefixes keep (purpose "a", row "bc") distinct from (purpose "ab", row "c").
    if not purpose:
        raise ValueError("purpose must be a non-empty string")
    purpose_bytes = purpose.encode("utf-8")
    row_bytes = str(row_id).encode("utf-8")
    return (
        header + struct.pack(">I", len(purpose_bytes)) + purpose_bytes + struct.pack(">I", len(row_bytes)) + row_bytes
    )


def _split(blob: bytes) -> tuple[bytes, str, bytes, bytes]:
    """blob → (header, kid, nonce, ciphertext+tag); DecryptionError when it is not a v1 envelope."""
    blob = bytes(blob)  # bytea columns come back as memoryview
    if len(blob) < 4 or blob[:2] != MAGIC:
        raise DecryptionError("not an encrypted envelope")
    version, kid_len = blob[2], blob[3]
    if version != FORMAT_V1:
        raise DecryptionError(f"unsupported envelope version {version}")
    body_start = 4 + kid_len
    if kid_len == 0 or len(blob) < body_start + NONCE_BYTES + TAG_BYTES:
        raise DecryptionError("truncated envelope")
    try:
        kid = blob[4:body_start].decode("ascii")
    except UnicodeDecodeError:
        raise DecryptionError("malformed key id in envelope") from None
    return blob[:body_start], kid, blob[body_start : body_start + NONCE_BYTES], blob[body_start + NONCE_BYTES :]


def encrypt(plaintext: bytes, *, purpose: str, row_id: str) -> bytes:
    """Seal ``plaintext`` under the primary key, bound to ``purpose`` (e.g. "memory.value") and ``row_id``."""
    ring = keyring()
    header = _header(ring.primary)
    nonce = os.urandom(NONCE_BYTES)
    return header + nonce + ring.keys[ring.primary].encrypt(nonce, bytes(plaintext), _aad(header, purpose, row_id))


def decrypt(blob: bytes, *, purpose: str, row_id: str) -> bytes:
    """Open an envelope sealed by ``encrypt`` for the same purpose and row id, under any key of the ring."""
    header, kid, nonce, sealed = _split(blob)
    key = keyring().key(kid)
    try:
        return key.decrypt(nonce, sealed, _aad(header, purpose, row_id))
    except InvalidTag:
        raise DecryptionError(
            f"ciphertext does not authenticate (key {kid!r}, purpose {purpose!r}): tampered or bound to another row"
        ) from None


def encrypt_json(obj: Any, *, purpose: str, row_id: str) -> bytes:
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return encrypt(data, purpose=purpose, row_id=row_id)


def decrypt_json(blob: bytes, *, purpose: str, row_id: str) -> Any:
    return json.loads(decrypt(blob, purpose=purpose, row_id=row_id))


def key_id_of(blob: bytes) -> str:
    """The key id an envelope was sealed with (no key needed); DecryptionError when it is not an envelope."""
    return _split(blob)[1]


def header_for(kid: str) -> bytes:
    """The clear header every envelope sealed with ``kid`` starts with (lets SQL select rows by key id)."""
    return _header(kid)


# --- Registry of encrypted columns (for rotate_encryption_key) --------------------------------------------------


@dataclass(frozen=True)
class EncryptedField:
    model_label: str  # "app_label.ModelName"
    field: str
    purpose: str
    # "pk", a field name, or several joined by "," (the row id is then their values joined by "/", e.g. an entry's
    # "conversation_id,pk" binds its content to both).
    row_id_field: str = "pk"


def row_id_of(row: Any, spec: EncryptedField) -> str:
    """The row id a registered column's envelopes are bound to."""
    return "/".join(str(row.pk if name == "pk" else getattr(row, name)) for name in spec.row_id_field.split(","))


_registry: dict[tuple[str, str], EncryptedField] = {}


def register_encrypted_field(model_label: str, field: str, purpose: str, row_id_field: str = "pk") -> None:
    """Declare a bytea column holding envelopes. Call from AppConfig.ready(); repeated calls are harmless."""
    _registry[(model_label, field)] = EncryptedField(model_label, field, purpose, row_id_field)


def unregister_encrypted_field(model_label: str, field: str) -> None:
    _registry.pop((model_label, field), None)


def encrypted_fields() -> list[EncryptedField]:
    return list(_registry.values())
