"""Encryption at rest (D4): the one place that seals and opens stored secrets (memory values, later conversation
entries and attachments).

Envelope, format version 1 (all lengths in bytes)::

    magic "MS" (2) | version 0x01 (1) | kid length n (1) | kid (n, ASCII) | nonce (12) | AES-256-GCM ciphertext+tag

The header (magic .. kid) travels in clear so the key ring can pick the key and ``rotate_encryption_key`` can find
rows not yet under the primary key without decrypting. Associated data = header + purpose + row id (each
length-prefixed), so the header cannot be edited and a ciphertext moved to another row or column does not open.
Readers reject versions they do not know instead of guessing.

Chunked stream, format version 2 (attachments: files too large to seal as one envelope)::

    magic "MS" (2) | version 0x02 (1) | kid length n (1) | kid (n) | chunk size (4, big-endian)
    then per chunk: nonce (12) | AES-256-GCM ciphertext (chunk size bytes; the final chunk 0..chunk size) + tag (16)

Every chunk is sealed on its own (so a stream is encrypted and decrypted in bounded memory), with associated data =
header + purpose + row id + chunk index (8) + final flag (1). Reordered or swapped chunks fail (index), a stream cut
at a chunk boundary fails (its last chunk was not sealed as final), bytes appended after the final chunk fail (that
chunk is then opened as non-final), and a stream moved to another row fails (row id). An empty plaintext is one
empty final chunk, so even a stream cut to its header does not open.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

logger = logging.getLogger(__name__)

MAGIC = b"MS"
FORMAT_V1 = 1
NONCE_BYTES = 12  # 96-bit nonces: GCM's native size, random per encryption
KEY_BYTES = 32  # AES-256
TAG_BYTES = 16
_KID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_SETTING = "MEMORY_ENCRYPTION_KEYS"


class DecryptionError(Exception):
    """The blob does not open: unknown key id, malformed envelope, or authentication failed (tampered, wrong row,
    wrong purpose, wrong key). Deliberately one type: callers cannot act differently on the cases. ``key_id`` is the
    key id the envelope names when it could be read (for operators: a key missing from the ring), ``reason`` one of
    ``unknown_key``, ``malformed``, ``unauthenticated``."""

    def __init__(self, message: str, *, key_id: str | None = None, reason: str = "malformed") -> None:
        super().__init__(message)
        self.key_id = key_id
        self.reason = reason


@dataclass(frozen=True)
class KeyRing:
    primary: str
    keys: dict[str, AESGCM]
    # kid -> a one-way fingerprint of the key bytes (key_fingerprint): lets hosts compare rings without sharing keys.
    fingerprints: dict[str, str] = field(default_factory=dict)
    # kid -> the key bytes, only for derive_key (never logged: repr=False).
    secrets: dict[str, bytes] = field(default_factory=dict, repr=False)

    def key(self, kid: str) -> AESGCM:
        try:
            return self.keys[kid]
        except KeyError:
            raise DecryptionError(f"unknown encryption key id {kid!r}", key_id=kid, reason="unknown_key") from None


def parse_keyring(raw: str) -> KeyRing:
    """``"kid:base64key,kid2:base64key"`` → KeyRing. Messages name the entry and kid, never key material."""
    entries = [item.strip() for item in raw.split(",") if item.strip()]
    if not entries:
        raise ImproperlyConfigured(f"{_SETTING} is empty: set it to 'kid:base64key[,kid2:base64key...]'")
    keys: dict[str, AESGCM] = {}
    fingerprints: dict[str, str] = {}
    secrets: dict[str, bytes] = {}
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
        fingerprints[kid] = key_fingerprint(key)
        secrets[kid] = key
        order.append(kid)
    return KeyRing(primary=order[0], keys=keys, fingerprints=fingerprints, secrets=secrets)


def key_fingerprint(key: bytes) -> str:
    """A key's public name for comparing rings across hosts (apps.encryption.key_rings): HMAC-SHA256 keyed by the key over a
    fixed label, 128 bits in hex. It tells two 256-bit random keys apart and reveals nothing usable about either."""
    import hashlib
    import hmac

    return hmac.new(key, b"memory-service key fingerprint v1", hashlib.sha256).hexdigest()[:32]


def derive_key(kid: str, purpose: str) -> bytes:
    """A 32-byte key for ``purpose`` (e.g. keyed hashes of search terms), derived by HKDF-SHA256 from the ring's key
    ``kid``: another purpose, or another key of the ring, gives an unrelated key, and the ring's key is never used
    for two jobs. Rotating the ring's key rotates every key derived from it."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    secret = keyring().secrets.get(kid)
    if secret is None:
        raise DecryptionError(f"unknown encryption key id {kid!r}", key_id=kid, reason="unknown_key")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose.encode()).derive(secret)


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
_cache: KeyRing | None = None


def keyring() -> KeyRing:
    """The parsed key ring, cached until the setting changes (Django's setting_changed signal: override_settings and
    the tests' settings fixture send it). Not re-read on every call: Django's settings object runs Python code on
    each attribute read, which made looking the setting up a fifth of the cost of opening a small value (issue 12)."""
    global _cache
    cached = _cache
    if cached is not None:
        return cached
    ring = parse_keyring(getattr(settings, _SETTING, "") or "")
    with _cache_lock:
        _cache = ring
    return ring


def _invalidate(*, setting: str, **_: Any) -> None:
    global _cache
    if setting == _SETTING:
        with _cache_lock:
            _cache = None


setting_changed.connect(_invalidate, dispatch_uid="apps.encryption.crypto.invalidate")


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
            f"ciphertext does not authenticate (key {kid!r}, purpose {purpose!r}): tampered or bound to another row",
            key_id=kid,
            reason="unauthenticated",
        ) from None


def encrypt_json(obj: Any, *, purpose: str, row_id: str) -> bytes:
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return encrypt(data, purpose=purpose, row_id=row_id)


def decrypt_json(blob: bytes, *, purpose: str, row_id: str) -> Any:
    return json.loads(decrypt(blob, purpose=purpose, row_id=row_id))


# --- Reading stored values: a row that does not open never takes a page down ------------------------------------

UNDECRYPTABLE_MARKER = "undecryptable"


class _Undecryptable:
    """The value of a stored envelope that does not open (see ``decrypt_for_read``): one singleton, falsy."""

    _instance: _Undecryptable | None = None

    def __new__(cls) -> _Undecryptable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "UNDECRYPTABLE"


UNDECRYPTABLE: Any = _Undecryptable()


def decrypt_for_read(
    blob: bytes | memoryview, *, purpose: str, row_id: Any, decode: Callable[[bytes], Any] = json.loads
) -> Any:
    """What every read path calls to open a stored value for its caller: ``decode(plaintext)``, or ``UNDECRYPTABLE``
    when the envelope does not open (its key id is not in the ring after a botched rotation, or the row is damaged).

    One undecryptable row must not take a whole page down: lists show the item with its metadata and the
    documented marker instead of its value, single-item reads answer ``errors.undecryptable()``. The failure is
    reported here, once, for operators (``report_undecryptable``)."""
    row = str(row_id)
    try:
        return decode(decrypt(bytes(blob), purpose=purpose, row_id=row))
    except DecryptionError as exc:
        report_undecryptable(exc, purpose=purpose, row_id=row)
        return UNDECRYPTABLE


def report_undecryptable(exc: DecryptionError, *, purpose: str, row_id: Any) -> None:
    """A log line naming the row and key id (never content or key material), and the ``undecryptable_values_total``
    metric by column and key id (the row id stays out of the metric's labels: one series per row would be
    unbounded)."""
    from apps.core import metrics

    kid = exc.key_id if exc.key_id is not None and _KID_RE.match(exc.key_id) else None
    logger.error(
        "stored value cannot be decrypted",
        extra={"purpose": purpose, "row_id": str(row_id), "key_id": kid, "reason": exc.reason},
    )
    metrics.UNDECRYPTABLE_VALUES.labels(purpose, kid or "-").inc()


def key_id_of(blob: bytes) -> str:
    """The key id an envelope was sealed with (no key needed); DecryptionError when it is not an envelope."""
    return _split(blob)[1]


def header_for(kid: str) -> bytes:
    """The clear header every envelope sealed with ``kid`` starts with (lets SQL select rows by key id)."""
    return _header(kid)


def stored_key_ids() -> set[str]:
    """The key ids the envelopes stored in every registered column are sealed with, read from their clear headers
    in SQL (no key needed, nothing decrypted): one DISTINCT scan per column, each reading only the first bytes of
    a value. ``/readyz`` compares them with the ring (apps.core.readiness)."""
    from django.apps import apps
    from django.db import connection

    prefix = MAGIC + bytes((FORMAT_V1,))
    found: set[str] = set()
    with connection.cursor() as cursor:
        for spec in encrypted_fields():
            model = apps.get_model(spec.model_label)
            table = connection.ops.quote_name(model._meta.db_table)
            column = connection.ops.quote_name(model._meta.get_field(spec.field).column)
            # The header's first 4 + 255 bytes at most, sliced before anything else reads the value (a large value
            # is stored out of line; a slice does not fetch all of it). Byte 3 is the key id's length.
            cursor.execute(
                f"SELECT DISTINCT substring(h FROM 5 FOR get_byte(h, 3)) "  # noqa: S608 - quoted registered names
                f"FROM (SELECT substring({column} FROM 1 FOR 259) AS h FROM {table} WHERE {column} IS NOT NULL) s "
                f"WHERE length(h) > 4 AND substring(h FROM 1 FOR 3) = %s",
                [prefix],
            )
            found.update(bytes(kid).decode("ascii", "replace") for (kid,) in cursor.fetchall())
    return found


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


@dataclass
class BlobRotation:
    """What one pass of a blob rotator did (see ``register_blob_rotator``)."""

    rotated: int = 0
    already_primary: int = 0
    failed: int = 0
    skipped: int = 0  # locked by a live request (e.g. being deleted): left for the next run
    failed_examples: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BlobRotator:
    """Encrypted files outside the database (attachment blobs): ``count()`` how many sealed streams exist;
    ``rotate(primary, progress, dry_run)`` re-seals every one not under ``primary`` (or only counts them with
    ``dry_run``), calling ``progress(1)`` per stream examined. Registered by the app that owns the files, so
    ``rotate_encryption_key`` covers them without importing it."""

    label: str
    count: Callable[[], int]
    rotate: Callable[[str, Callable[[int], object], bool], BlobRotation]


_blob_rotators: dict[str, BlobRotator] = {}


def register_blob_rotator(rotator: BlobRotator) -> None:
    _blob_rotators[rotator.label] = rotator


def unregister_blob_rotator(label: str) -> None:
    _blob_rotators.pop(label, None)


def blob_rotators() -> list[BlobRotator]:
    return list(_blob_rotators.values())


# --- Chunked streams (format version 2) -------------------------------------------------------------------------

FORMAT_STREAM = 2
# Plaintext per chunk. Each AES-GCM call has a fixed cost (context set-up): 64 KiB chunks seal at 484 MB/s, 256 KiB at
# 690, 1 MiB at 708. More important on the download path: `cryptography` holds the GIL while it decrypts, and
# between two calls the GIL goes to the event loop thread writing the response, so every chunk costs a handoff
# (up to the 1 ms switch interval). bench/attachments.py-style download of 50 MB on this machine: 341-366 MB/s with
# 256 KiB chunks, 647-724 MB/s with 1 MiB. The chunk size is in each stream's header: older blobs still open.
STREAM_CHUNK_BYTES = 1024 * 1024
_MAX_STREAM_CHUNK_BYTES = 16 * 1024 * 1024


def _stream_header(kid: str, chunk_size: int) -> bytes:
    encoded = kid.encode("ascii")
    return MAGIC + bytes((FORMAT_STREAM, len(encoded))) + encoded + struct.pack(">I", chunk_size)


def _chunk_aad(prefix: bytes, index: int, final: bool) -> bytes:
    return prefix + struct.pack(">QB", index, 1 if final else 0)


def stream_overhead(plaintext_size: int, *, chunk_size: int = STREAM_CHUNK_BYTES, kid: str | None = None) -> int:
    """Bytes a sealed stream adds to ``plaintext_size`` (header plus nonce and tag per chunk)."""
    kid = kid if kid is not None else primary_key_id()
    chunks = max(1, -(-plaintext_size // chunk_size))
    return len(_stream_header(kid, chunk_size)) + chunks * (NONCE_BYTES + TAG_BYTES)


class _ChunkedStream:
    """The chunk loop the sealer and the opener share: input of any piece sizes is cut into fixed-size frames, and
    the newest frame is held back until a byte after it arrives, because only then is it known not to be the final
    one (which is sealed, and so opened, differently). Frames are processed where they lie in the caller's buffer;
    bytes are only copied to complete a frame split across two pieces, or to hold back part of a mutable buffer (an
    immutable ``bytes`` piece is held by reference)."""

    def __init__(self) -> None:
        self._frame_size = 0
        self._held: bytes | bytearray | memoryview = b""
        self._index = 0
        self._finished = False

    def _process(self, frame: bytes | bytearray | memoryview, final: bool) -> bytes | bytearray:
        raise NotImplementedError

    def _frames(self, data: bytes | bytearray | memoryview, immutable: bool | None = None) -> list[bytes | bytearray]:
        """Process every frame of ``held + data`` known not to be final; hold back the rest. ``immutable``: whether
        ``data`` may be held by reference (default: when it is ``bytes``)."""
        if immutable is None:
            immutable = isinstance(data, bytes)
        size = self._frame_size
        view = memoryview(data)
        held = self._held
        out: list[bytes | bytearray] = []
        if view and held and len(held) < size:
            take = min(size - len(held), len(view))
            if not isinstance(held, bytearray):
                held = bytearray(held)
            held += view[:take]
            view = view[take:]
        if view and held:  # the held frame is full and more follows: not the last one
            out.append(self._process(held, final=False))
            held = b""
        while len(view) > size:
            out.append(self._process(view[:size], final=False))
            view = view[size:]
        if view:
            held = view if immutable else bytes(view)
        self._held = held
        return out

    def _final(self) -> bytes | bytearray:
        self._finished = True
        held, self._held = self._held, b""
        return self._process(held, final=True)


class StreamSealer(_ChunkedStream):
    """Encrypts a stream of any length in fixed-size chunks under the primary key, bound to ``purpose`` and
    ``row_id``. ``update`` returns the sealed pieces ready so far (the header first), ``finish`` the last ones;
    memory stays within one chunk whatever the stream's size, and input is sliced, not copied, where it can be."""

    def __init__(self, *, purpose: str, row_id: str, chunk_size: int = STREAM_CHUNK_BYTES) -> None:
        super().__init__()
        if not 1 <= chunk_size <= _MAX_STREAM_CHUNK_BYTES:
            raise ValueError("chunk_size out of range")
        ring = keyring()
        self._key = ring.keys[ring.primary]
        self.key_id = ring.primary
        self.chunk_size = self._frame_size = chunk_size
        self._header = _stream_header(ring.primary, chunk_size)
        self._prefix = _aad(self._header, purpose, str(row_id))
        self._started = False

    def _process(self, frame, final: bool) -> bytearray:
        # nonce | ciphertext | tag written into one buffer: no concatenation copy per chunk.
        nonce = os.urandom(NONCE_BYTES)
        sealed = bytearray(NONCE_BYTES + len(frame) + TAG_BYTES)
        sealed[:NONCE_BYTES] = nonce
        self._key.encrypt_into(
            nonce, frame, _chunk_aad(self._prefix, self._index, final), memoryview(sealed)[NONCE_BYTES:]
        )
        self._index += 1
        return sealed

    def update(self, data: bytes) -> list[bytes | bytearray]:
        if self._finished:
            raise ValueError("stream already finished")
        out: list[bytes | bytearray] = []
        if not self._started:
            out.append(self._header)
            self._started = True
        out += self._frames(data)
        return out

    def finish(self) -> list[bytes | bytearray]:
        out = self.update(b"")
        out.append(self._final())
        return out


_MAX_STREAM_HEADER = 4 + 255 + 4


class StreamOpener(_ChunkedStream):
    """Decrypts a stream sealed by ``StreamSealer`` for the same purpose and row id, fed in pieces of any size.
    ``update`` returns the plaintext chunks authenticated so far; ``finish`` opens the final chunk (and so checks the
    stream was not cut short). Any failure is a DecryptionError; no plaintext leaves before its chunk authenticated."""

    def __init__(self, *, purpose: str, row_id: str) -> None:
        super().__init__()
        self._purpose = purpose
        self._row_id = str(row_id)
        self._head = b""
        self._key: AESGCM | None = None
        self._prefix = b""
        self.key_id: str | None = None
        self.header_size: int | None = None
        self.sealed_chunk_size: int | None = None

    def _parse_header(self, buffer: bytes) -> int | None:
        """The header's length once ``buffer`` holds all of it (and the key, prefix and frame size are set)."""
        if len(buffer) < 4:
            return None
        if buffer[:2] != MAGIC:
            raise DecryptionError("not an encrypted stream")
        if buffer[2] != FORMAT_STREAM:
            raise DecryptionError(f"unsupported stream version {buffer[2]}")
        kid_len = buffer[3]
        end = 4 + kid_len + 4
        if len(buffer) < end:
            return None
        if kid_len == 0:
            raise DecryptionError("malformed key id in stream")
        try:
            kid = buffer[4 : 4 + kid_len].decode("ascii")
        except UnicodeDecodeError:
            raise DecryptionError("malformed key id in stream") from None
        (chunk_size,) = struct.unpack(">I", buffer[4 + kid_len : end])
        if not 1 <= chunk_size <= _MAX_STREAM_CHUNK_BYTES:
            raise DecryptionError("malformed chunk size in stream")
        self.key_id = kid
        self._key = keyring().key(kid)
        self._prefix = _aad(buffer[:end], self._purpose, self._row_id)
        self.header_size = end
        self.sealed_chunk_size = self._frame_size = NONCE_BYTES + chunk_size + TAG_BYTES
        return end

    def _process(self, frame, final: bool) -> bytes:
        assert self._key is not None
        if final and len(frame) < NONCE_BYTES + TAG_BYTES:
            raise DecryptionError("truncated stream: the final chunk is missing", key_id=self.key_id)
        try:
            plain = self._key.decrypt(
                frame[:NONCE_BYTES], frame[NONCE_BYTES:], _chunk_aad(self._prefix, self._index, final)
            )
        except InvalidTag:
            raise DecryptionError(
                f"stream chunk {self._index} does not authenticate: tampered, reordered, truncated or another row's",
                key_id=self.key_id,
                reason="unauthenticated",
            ) from None
        self._index += 1
        return plain

    def update(self, data: bytes) -> list[bytes]:
        if self._finished:
            raise DecryptionError("data after the end of the stream")
        if self._key is None:
            # Only the header's bytes are copied (at most _MAX_STREAM_HEADER), however large the first piece.
            view = memoryview(data)
            probe = self._head + bytes(view[:_MAX_STREAM_HEADER])
            end = self._parse_header(probe)
            if end is None:
                self._head = probe
                return []
            immutable = isinstance(data, bytes)
            data = view[end - len(self._head) :]
            self._head = b""
            return self._frames(data, immutable)
        return self._frames(data)

    def finish(self) -> list[bytes]:
        if self._finished:
            return []
        if self._key is None:
            self._finished = True
            raise DecryptionError("truncated stream header")
        return [self._final()]


def seal_stream(
    pieces: Iterable[bytes], *, purpose: str, row_id: str, chunk_size: int = STREAM_CHUNK_BYTES
) -> Iterator[bytes]:
    """The sealed stream of ``pieces``, piece by piece (tests, tools)."""
    sealer = StreamSealer(purpose=purpose, row_id=row_id, chunk_size=chunk_size)
    for piece in pieces:
        yield from sealer.update(piece)
    yield from sealer.finish()


def open_stream(pieces: Iterable[bytes], *, purpose: str, row_id: str) -> Iterator[bytes]:
    """Plaintext of a sealed stream, chunk by chunk as each authenticates; raises DecryptionError (possibly after
    yielding earlier chunks) when the stream was tampered with, reordered, truncated or bound to another row."""
    opener = StreamOpener(purpose=purpose, row_id=row_id)
    for piece in pieces:
        yield from opener.update(piece)
    yield from opener.finish()


def open_reader(
    read: Callable[[int], bytes], *, purpose: str, row_id: str, piece_bytes: int = 1024 * 1024
) -> Iterator[bytes]:
    """Plaintext of a sealed stream read through ``read(n)`` (a file's or an S3 body's ``read``), in pieces of about
    ``piece_bytes``. Reads are sized to end on chunk boundaries, so no chunk is reassembled from two reads (no copy
    besides decryption and joining the chunks of one read into one piece). Same failures as ``open_stream``."""
    opener = StreamOpener(purpose=purpose, row_id=row_id)
    fed = 0
    size = _MAX_STREAM_HEADER
    while True:
        data = read(size)
        if not data:
            break
        fed += len(data)
        plain = opener.update(data)
        if plain:
            yield plain[0] if len(plain) == 1 else b"".join(plain)
        if opener.sealed_chunk_size is not None and opener.header_size is not None:
            sealed = opener.sealed_chunk_size
            per_read = max(1, -(-piece_bytes // (sealed - NONCE_BYTES - TAG_BYTES))) * sealed
            size = per_read - (fed - opener.header_size) % sealed
    yield from opener.finish()


def stream_key_id(prefix: bytes) -> str:
    """The key id a sealed stream starts with (its first ``MAX_STREAM_HEADER`` bytes are enough; no key needed)."""
    opener = StreamOpener(purpose="-", row_id="-")
    view = bytes(prefix[:_MAX_STREAM_HEADER])
    if opener._parse_header(view) is None:
        raise DecryptionError("truncated stream header")
    assert opener.key_id is not None
    return opener.key_id


MAX_STREAM_HEADER = _MAX_STREAM_HEADER


def reseal_reader(read: Callable[[int], bytes], *, purpose: str, row_id: str) -> Iterator[bytes | bytearray]:
    """The stream read through ``read(n)`` sealed again under the primary key (key rotation), chunk by chunk: no
    plaintext is kept beyond one piece. A DecryptionError leaves the caller to discard what it wrote."""
    sealer = StreamSealer(purpose=purpose, row_id=row_id)
    for plain in open_reader(read, purpose=purpose, row_id=row_id):
        yield from sealer.update(plain)
    yield from sealer.finish()


def is_sealed_stream(prefix: bytes) -> bool:
    """Whether bytes start like a v2 stream (the storage layer uses it to tell encrypted blobs from plain ones)."""
    return len(prefix) >= 3 and prefix[:2] == MAGIC and prefix[2] == FORMAT_STREAM
