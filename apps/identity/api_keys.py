"""API keys (D2): issuing, hashing, constant-time lookup, and seeding from the API_KEYS setting.

Keys are looked up by their non-secret prefix and then compared by SHA-256 hash with ``hmac.compare_digest``, so
neither the database index nor the comparison leaks how much of a guessed key was right. A plain hash (not a slow
password hash) is right here: issued keys carry 256 random bits, and every request pays for the check.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from apps.identity.models import ApiKey

logger = logging.getLogger(__name__)

KEY_PREFIX = "msk_"
PREFIX_LENGTH = 12
MAX_KEY_LENGTH = 512
_LAST_USED_RESOLUTION = timedelta(minutes=1)  # at most one write per key and minute, not one per request


@dataclass(frozen=True)
class IssuedKey:
    record: ApiKey
    key: str  # the plaintext key: show it once, never store or log it


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    """The lookup prefix. Short keys (seeded dev keys like "key1") reveal at most half of themselves."""
    return key[: min(PREFIX_LENGTH, len(key) // 2)]


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_key(client: str) -> IssuedKey:
    client = client.strip()
    if not client:
        raise ValueError("client name must not be empty")
    key = generate_key()
    record = ApiKey.objects.create(client=client, prefix=key_prefix(key), key_hash=hash_key(key))
    return IssuedKey(record=record, key=key)


def revoke(record: ApiKey) -> bool:
    """Revoke once; revoking a revoked key keeps its original revocation time."""
    return bool(ApiKey.objects.filter(pk=record.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()))


def configured_keys() -> list[tuple[str, str]]:
    """(client, key) pairs from API_KEYS ("client1:key1,client2:key2"); malformed entries are skipped, loudly."""
    pairs = []
    for index, entry in enumerate(settings.API_KEYS.split(",")):
        if not entry.strip():
            continue
        client, sep, key = entry.strip().partition(":")
        if not sep or not client.strip() or not key.strip() or len(key.strip()) > MAX_KEY_LENGTH:
            # The entry holds a secret: name its position, never its text.
            logger.warning("API_KEYS entry #%d is not 'client:key'; ignored", index + 1)
            continue
        pairs.append((client.strip(), key.strip()))
    return pairs


def seed_from_settings(using: str | None = None) -> int:
    """Create a row for every API_KEYS key not stored yet (idempotent). A key revoked by an operator stays revoked:
    its hash exists, so it is not re-created."""
    created = 0
    manager = ApiKey.objects.db_manager(using)
    for client, key in configured_keys():
        _, was_created = manager.get_or_create(
            key_hash=hash_key(key), defaults={"client": client, "prefix": key_prefix(key)}
        )
        if was_created:
            created += 1
            if len(key) < 16:
                logger.warning("API key of client %s from API_KEYS is shorter than 16 characters", client)
    return created


def authenticate_key(presented: str) -> str | None:
    """The client name for a valid, unrevoked key; None otherwise."""
    if not presented or len(presented) > MAX_KEY_LENGTH:
        return None
    digest = hash_key(presented)
    record = _find(presented, digest)
    if record is None:
        record = _seed_on_demand(digest)
    if record is None or record.revoked_at is not None:
        return None
    now = timezone.now()
    if record.last_used_at is None or now - record.last_used_at >= _LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=record.pk).update(last_used_at=now)
    return record.client


def _find(presented: str, digest: str) -> ApiKey | None:
    found = None
    for record in ApiKey.objects.filter(prefix=key_prefix(presented)):
        # No early exit: the loop's duration must not depend on which candidate matched.
        if hmac.compare_digest(record.key_hash, digest):
            found = record
    return found


def _seed_on_demand(digest: str) -> ApiKey | None:
    """A configured key that is not in the table yet (added to API_KEYS after the last migrate, or a test database
    flushed since): store it now. Seeding only ever happens for a key that was presented and configured."""
    for client, key in configured_keys():
        if hmac.compare_digest(hash_key(key), digest):
            # get_or_create absorbs the race of two requests seeding the same key (unique key_hash).
            record, _ = ApiKey.objects.get_or_create(
                key_hash=digest, defaults={"client": client, "prefix": key_prefix(key)}
            )
            return record
    return None
