"""Bearer JWT verification against the issuer's JWKS (D2).

Keys come from ``OIDC_JWKS_URL`` or from the issuer's discovery document; they are cached per source for
``OIDC_JWKS_CACHE_SECONDS`` and re-fetched when a token names an unknown ``kid`` (key rotation), but never more often
than once per ``OIDC_JWKS_MIN_REFRESH_SECONDS``: otherwise anyone could make us hammer the IdP by sending tokens with
made-up key ids. With no ``OIDC_ISSUER_URL`` and the dev IdP on, the dev IdP's key is used in-process.

Only asymmetric algorithms are ever accepted, whatever ``OIDC_ALGORITHMS`` says: with HMAC, the public key (which
anyone can fetch from the JWKS) would become a signing secret. Tokens never reach a log line.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt
import requests
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from apps.core.serializers import MAX_USER_ID_CHARS, json_value_problem

logger = logging.getLogger(__name__)

ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
_MAX_TOKEN_LENGTH = 16 * 1024
_MAX_DOCUMENT_BYTES = 1024 * 1024
_NEVER_ROLE_CLAIMS = frozenset({"scope", "scp"})  # OAuth scopes say what a client may ask for, not who a user is

# What a signed token may carry (issue 21.6). The issuer signs whatever its mappers put in a token, so its claims are
# input like any other: a user id ends up in PostgreSQL text columns, Redis keys and log lines, the claims reach the
# policies as input, the time claims are compared and turned into timers. The token's length (_MAX_TOKEN_LENGTH)
# bounds the total size.
MAX_ROLE_CHARS = 1024
# 1970 to the end of year 9999: what a timestamp converts to a datetime (and a float, and a timer) without overflow.
_TIME_CLAIMS = ("exp", "nbf", "iat")
_MAX_TIMESTAMP = 253_402_300_799

# Indirection so tests can move the clock instead of sleeping through the refresh interval.
_monotonic = time.monotonic


class TokenError(Exception):
    """Verification failed. The message is safe to return to the caller (it never contains the token)."""


@dataclass(frozen=True)
class VerifiedToken:
    user_id: str
    roles: tuple[str, ...]
    claims: dict[str, Any] = field(repr=False)


# --- Claims --------------------------------------------------------------------------------------------------------


def resolve_claim_path(claims: Any, path: str) -> list[Any]:
    """All values at a dotted claim path; ``*`` matches every key of an object (``resource_access.*.roles``).

    A key that itself contains dots (Auth0-style ``https://example.com/roles``) is matched literally as well,
    so namespaced claims work without an escape syntax.
    """
    segments = [segment for segment in path.strip().split(".")]
    if not path.strip() or any(not segment for segment in segments):
        return []
    return _resolve(claims, segments)


def _resolve(value: Any, segments: list[str]) -> list[Any]:
    if not segments:
        return [value]
    if not isinstance(value, Mapping):
        return []
    found: list[Any] = []
    if segments[0] == "*":
        for child in value.values():
            found.extend(_resolve(child, segments[1:]))
        return found
    for split in range(len(segments), 0, -1):
        key = ".".join(segments[:split])
        if key in value:
            found.extend(_resolve(value[key], segments[split:]))
    return found


def roles_from_claims(claims: Mapping[str, Any], paths: Iterable[str]) -> tuple[str, ...]:
    """The union of the role claims, in first-seen order. A string value is one role; lists contribute their
    string items; anything else is ignored rather than guessed at. ``scope`` is never a role source."""
    roles: dict[str, None] = {}
    for path in paths:
        if path.strip() in _NEVER_ROLE_CLAIMS:
            continue
        for value in resolve_claim_path(claims, path):
            items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
            for item in items:
                if isinstance(item, str) and item:
                    roles.setdefault(item, None)
    return tuple(roles)


def user_id_from_claims(claims: Mapping[str, Any], names: Iterable[str]) -> str | None:
    """The first configured claim holding a non-empty string (Keycloak's ``sub`` is a UUID, so
    ``preferred_username`` comes first by default)."""
    for name in names:
        value = claims.get(name.strip())
        if isinstance(value, str) and value.strip():
            return value
    return None


def _has_control_characters(text: str) -> bool:
    # C0, DEL and C1: never part of a name, and NUL is refused by PostgreSQL text columns.
    return any(ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F for char in text)


def claims_problem(claims: Mapping[str, Any]) -> str | None:
    """Why verified claims are unusable here, or None: every value JSON the policies can take (no integer beyond
    64 bits, no NaN or infinity, no lone surrogate or NUL, nested at most 32 levels), time claims numbers from 1970
    to the year 9999."""
    problem = json_value_problem(dict(claims))
    if problem:
        return problem
    for name in _TIME_CLAIMS:
        value = claims.get(name)
        if name in claims and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= _MAX_TIMESTAMP
        ):
            return f"{name} must be a timestamp"
    return None


def user_id_problem(user_id: str) -> str | None:
    if len(user_id) > MAX_USER_ID_CHARS:
        return f"is longer than {MAX_USER_ID_CHARS} characters"
    if _has_control_characters(user_id):
        return "contains control characters"
    return None


def roles_problem(roles: Iterable[str]) -> str | None:
    for role in roles:
        if len(role) > MAX_ROLE_CHARS or _has_control_characters(role):
            return f"roles must be at most {MAX_ROLE_CHARS} characters without control characters"
    return None


# --- Algorithms and keys -------------------------------------------------------------------------------------------


def allowed_algorithms() -> frozenset[str]:
    """The configured allow-list, minus anything symmetric or ``none`` even if an operator listed it."""
    configured = {name.strip() for name in settings.OIDC_ALGORITHMS}
    return frozenset(configured & ASYMMETRIC_ALGORITHMS)


def _key_fits(jwk: Mapping[str, Any], alg: str) -> bool:
    if jwk.get("use") not in (None, "sig"):
        return False
    if jwk.get("alg") not in (None, alg):
        return False
    kty = jwk.get("kty")
    if kty == "RSA":
        return alg in _RSA_ALGORITHMS
    if kty == "EC":
        return _EC_CURVES.get(alg) == jwk.get("crv")
    if kty == "OKP":
        return alg == "EdDSA" and jwk.get("crv") in ("Ed25519", "Ed448")
    return False  # "oct" and anything unknown: never a verification key here


class KeySet:
    """An immutable snapshot of one JWKS; prepared keys are memoized because building them is the costly part."""

    def __init__(self, jwks: Mapping[str, Any]) -> None:
        keys = jwks.get("keys") if isinstance(jwks, Mapping) else None
        if not isinstance(keys, list):
            raise TokenError("The identity provider's key set is malformed.")
        self.keys: tuple[dict[str, Any], ...] = tuple(key for key in keys if isinstance(key, dict))
        self._prepared: dict[tuple[int, str], jwt.PyJWK] = {}

    def kids(self) -> set[str]:
        return {key["kid"] for key in self.keys if isinstance(key.get("kid"), str)}

    def find(self, kid: str | None, alg: str) -> jwt.PyJWK | None:
        if kid is None:
            # Without a kid the choice is only unambiguous when exactly one key can verify this algorithm.
            candidates = [index for index, key in enumerate(self.keys) if _key_fits(key, alg)]
            if len(candidates) != 1:
                return None
        else:
            candidates = [
                index for index, key in enumerate(self.keys) if key.get("kid") == kid and _key_fits(key, alg)
            ]
        if not candidates:
            return None
        index = candidates[0]
        prepared = self._prepared.get((index, alg))
        if prepared is None:
            try:
                # Bind the key to the token's (already allow-listed) algorithm: PyJWK would otherwise default an
                # RSA key without "alg" to RS256 and refuse PS256/RS384 tokens signed with it.
                prepared = jwt.PyJWK(self.keys[index], algorithm=alg)
            except jwt.PyJWTError:
                return None
            self._prepared[(index, alg)] = prepared
        return prepared


class JwksCache:
    """Keys of one remote issuer. Thread-safe: lookups of known keys take no lock; a refresh runs under a lock so
    a burst of requests with a new kid causes one fetch, not one per thread."""

    def __init__(self, issuer: str, jwks_url: str = "") -> None:
        self.issuer = issuer
        self.configured_jwks_url = jwks_url
        self._jwks_url: str | None = jwks_url or None
        self._keyset: KeySet | None = None
        self._fetched_at: float | None = None
        self._last_attempt: float | None = None
        self._lock = threading.Lock()
        self.fetch_count = 0  # JWKS downloads; observable for operations and tests

    def get_key(self, kid: str | None, alg: str) -> jwt.PyJWK:
        keyset = self._keyset
        if keyset is not None and not self._expired():
            key = keyset.find(kid, alg)
            if key is not None:
                return key
        with self._lock:
            # Another thread may have refreshed while this one waited for the lock.
            keyset = self._keyset
            if keyset is not None and not self._expired():
                key = keyset.find(kid, alg)
                if key is not None:
                    return key
            if self._may_refresh():
                self._refresh()
            keyset = self._keyset
        if keyset is None:
            raise TokenError("The identity provider's keys are unavailable.")
        # A failed refresh keeps the previous keys: an IdP outage should not log everybody out.
        key = keyset.find(kid, alg)
        if key is None:
            raise TokenError("The token was signed by an unknown key.")
        return key

    def _expired(self) -> bool:
        return self._fetched_at is None or _monotonic() - self._fetched_at >= settings.OIDC_JWKS_CACHE_SECONDS

    def _may_refresh(self) -> bool:
        return self._last_attempt is None or _monotonic() - self._last_attempt >= settings.OIDC_JWKS_MIN_REFRESH_SECONDS

    def _refresh(self) -> None:
        self._last_attempt = _monotonic()
        try:
            if self._jwks_url is None:
                self._jwks_url = self._discover()
            self.fetch_count += 1
            keyset = KeySet(_get_json(self._jwks_url))
        except (requests.RequestException, ValueError, TokenError) as exc:
            logger.warning("JWKS refresh for issuer %s failed: %s", self.issuer, type(exc).__name__)
            if not self.configured_jwks_url:
                self._jwks_url = None  # the discovery document may have moved the keys; look again next time
            return
        self._keyset = keyset
        self._fetched_at = _monotonic()
        logger.info("JWKS for issuer %s loaded: %d keys", self.issuer, len(keyset.keys))

    def _discover(self) -> str:
        document = _get_json(self.issuer.rstrip("/") + "/.well-known/openid-configuration")
        jwks_uri = document.get("jwks_uri") if isinstance(document, dict) else None
        if not isinstance(jwks_uri, str) or not jwks_uri.startswith(("https://", "http://")):
            raise TokenError("The discovery document has no jwks_uri.")
        return jwks_uri


def _get_json(url: str) -> Any:
    response = requests.get(url, timeout=settings.OIDC_HTTP_TIMEOUT_SECONDS, headers={"Accept": "application/json"})
    response.raise_for_status()
    if len(response.content) > _MAX_DOCUMENT_BYTES:
        raise ValueError("document too large")
    return response.json()


class DevIdpKeys:
    """The dev IdP's own key, read in-process: no HTTP round trip to ourselves (which a single-threaded dev server
    could not even answer while it is busy verifying)."""

    _keysets: dict[str, KeySet] = {}  # by the dev key's kid; tiny, and it changes only with DATA_DIR

    def get_key(self, kid: str | None, alg: str) -> jwt.PyJWK:
        from apps.identity.dev_idp import keys

        signing = keys.signing_key()
        keyset = self._keysets.get(signing.kid)
        if keyset is None:
            keyset = self._keysets[signing.kid] = KeySet({"keys": [signing.public_jwk]})
        key = keyset.find(kid, alg)
        if key is None:
            raise TokenError("The token was signed by an unknown key.")
        return key


_caches: dict[tuple[str, str], JwksCache] = {}
_caches_lock = threading.Lock()


def jwks_cache(issuer: str, jwks_url: str = "") -> JwksCache:
    """The process-wide cache for one (issuer, JWKS URL) pair."""
    with _caches_lock:
        cache = _caches.get((issuer, jwks_url))
        if cache is None:
            cache = _caches[(issuer, jwks_url)] = JwksCache(issuer, jwks_url)
        return cache


def clear_key_caches() -> None:
    """Forget every cached key set and verified token (tests; a rotation otherwise waits for the refresh)."""
    with _caches_lock:
        _caches.clear()
    _verified.clear()


class _VerifiedTokens:
    """Tokens already verified in this process, by SHA-256 of the token, for at most VERIFIED_TOKEN_CACHE_SECONDS.

    Agents send the same token on every call; re-checking its RSA signature each time was the largest cost of a
    read after the query itself. An entry never outlives the token's own ``exp``, and the short bound keeps a
    signing-key removal or a settings change effective within seconds.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self._entries: OrderedDict[bytes, tuple[float, VerifiedToken]] = OrderedDict()
        self._lock = threading.Lock()
        self._max_entries = max_entries

    def get(self, digest: bytes) -> VerifiedToken | None:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if entry[0] <= time.time():
                del self._entries[digest]
                return None
            self._entries.move_to_end(digest)
            return entry[1]

    def put(self, digest: bytes, verified: VerifiedToken) -> None:
        exp = verified.claims.get("exp")
        until = time.time() + settings.VERIFIED_TOKEN_CACHE_SECONDS
        if isinstance(exp, (int, float)):
            until = min(until, float(exp))
        with self._lock:
            self._entries[digest] = (until, verified)
            self._entries.move_to_end(digest)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_verified = _VerifiedTokens()


@receiver(setting_changed)
def _forget_verified_tokens(*, setting: str, **_: Any) -> None:
    if setting.startswith(("OIDC_", "DEV_IDP_", "VERIFIED_TOKEN")):
        _verified.clear()


def trusted_issuer() -> tuple[str, JwksCache | DevIdpKeys]:
    """The issuer tokens must name, and where its keys come from."""
    if settings.OIDC_ISSUER_URL:
        return settings.OIDC_ISSUER_URL, jwks_cache(settings.OIDC_ISSUER_URL, settings.OIDC_JWKS_URL)
    if settings.DEV_IDP_ENABLED:
        return settings.DEV_IDP_ISSUER, DevIdpKeys()
    raise TokenError("No identity provider is configured.")


# --- Verification --------------------------------------------------------------------------------------------------


def verify_token(token: str, *, check_audience: bool = True) -> VerifiedToken:
    """Verify signature, algorithm, issuer, lifetime and (when configured) audience; raise TokenError otherwise.

    ``check_audience=False`` is for the admin login, whose access token is issued to a different client.
    """
    if not token or len(token) > _MAX_TOKEN_LENGTH:
        raise TokenError("The access token is malformed.")
    digest = hashlib.sha256(token.encode()).digest() if check_audience else None
    if digest is not None and settings.VERIFIED_TOKEN_CACHE_SECONDS > 0:
        cached = _verified.get(digest)
        if cached is not None:
            return cached
    verified = _verify_uncached(token, check_audience=check_audience)
    if digest is not None and settings.VERIFIED_TOKEN_CACHE_SECONDS > 0:
        _verified.put(digest, verified)
    return verified


def cached_verification(token: str) -> VerifiedToken | None:
    """What ``verify_token`` verified for ``token`` moments ago (within VERIFIED_TOKEN_CACHE_SECONDS, never past its
    ``exp``), else None. No I/O and no signature check: an event loop may call it, where ``verify_token`` (which may
    fetch the issuer's keys) must run in a thread."""
    if not token or len(token) > _MAX_TOKEN_LENGTH or settings.VERIFIED_TOKEN_CACHE_SECONDS <= 0:
        return None
    return _verified.get(hashlib.sha256(token.encode()).digest())


def _verify_uncached(token: str, *, check_audience: bool) -> VerifiedToken:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise TokenError("The access token is malformed.") from None
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in allowed_algorithms():
        raise TokenError("The token's signing algorithm is not accepted.")
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise TokenError("The access token is malformed.")

    issuer, key_source = trusted_issuer()
    key = key_source.get_key(kid, alg)
    checked = check_audience and settings.OIDC_AUDIENCE_CHECK
    audience: Sequence[str] = [a for a in settings.OIDC_AUDIENCE if a] if checked else []
    base = issuer.rstrip("/")
    try:
        claims = jwt.decode(
            token,
            key=key,
            algorithms=[alg],
            # "https://idp/realm" and "https://idp/realm/" name the same issuer; anything else does not.
            issuer=(base, base + "/"),
            audience=list(audience) or None,
            leeway=settings.OIDC_LEEWAY_SECONDS,
            options={"require": ["exp", "iss"], "verify_aud": bool(audience)},
        )
    except jwt.ExpiredSignatureError:
        raise TokenError("The access token has expired.") from None
    except jwt.ImmatureSignatureError:
        raise TokenError("The access token is not valid yet.") from None
    except jwt.InvalidIssuerError:
        raise TokenError("The access token was issued by an untrusted issuer.") from None
    except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as exc:
        if isinstance(exc, jwt.InvalidAudienceError) or exc.claim == "aud":
            raise TokenError("The access token is not meant for this service.") from None
        raise TokenError(f"The access token lacks the {exc.claim!r} claim.") from None
    except jwt.PyJWTError:
        raise TokenError("The access token's signature or claims are invalid.") from None

    # Only now, with the signature checked: until then the claims are anybody's text.
    problem = claims_problem(claims)
    if problem:
        raise TokenError(f"The access token's claims are malformed: {problem}.")
    user_id = user_id_from_claims(claims, settings.OIDC_USER_ID_CLAIMS)
    if user_id is None:
        raise TokenError("The access token names no user.")
    problem = user_id_problem(user_id)
    if problem:
        raise TokenError(f"The access token's user id {problem}.")
    roles = roles_from_claims(claims, settings.OIDC_ROLE_CLAIMS)
    problem = roles_problem(roles)
    if problem:
        raise TokenError(f"The access token's {problem}.")
    return VerifiedToken(user_id=user_id, roles=roles, claims=claims)
