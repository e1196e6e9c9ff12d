"""The dev IdP's RSA signing key: DEV_IDP_SIGNING_KEY_FILE, or generated once into DATA_DIR and reused, so tokens
survive restarts and every worker process of one installation signs with (and trusts) the same key. Instances that
accept each other's dev tokens share one key file and one DEV_IDP_ISSUER (README "Several hosts")."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from jwt.algorithms import RSAAlgorithm

ALGORITHM = "RS256"

_lock = threading.Lock()
_loaded: dict[Path, SigningKey] = {}


@dataclass(frozen=True)
class SigningKey:
    private_key: rsa.RSAPrivateKey
    kid: str
    public_jwk: dict[str, Any]


def key_path() -> Path:
    """DEV_IDP_SIGNING_KEY_FILE, or the data directory's own key."""
    configured = getattr(settings, "DEV_IDP_SIGNING_KEY_FILE", "")
    return Path(configured) if configured else Path(settings.DATA_DIR) / "dev-idp" / "signing-key.pem"


def signing_key() -> SigningKey:
    """The key for the current DEV_IDP_SIGNING_KEY_FILE / DATA_DIR, loaded (or created) once per process."""
    path = key_path()
    key = _loaded.get(path)
    if key is None:
        with _lock:
            key = _loaded.get(path)
            if key is None:
                key = _loaded[path] = _describe(_load_or_create(path))
    return key


def check_available() -> None:
    """Raise ImproperlyConfigured when the key is missing and may not be generated here (issue 32.4: a second
    instance that made its own key would refuse every token of the first). Web start-up calls it."""
    path = key_path()
    if not path.exists() and not settings.SECRETS_MAY_BE_GENERATED:
        raise ImproperlyConfigured(
            f"The dev IdP's signing key {path} does not exist and DATABASE_URL names a database this installation "
            "did not start: a key generated here would differ from the other instances', which would refuse its "
            "tokens (and it theirs). Set DEV_IDP_SIGNING_KEY_FILE to a copy of their key (and DEV_IDP_ISSUER to "
            "their issuer), or GENERATE_SECRETS=true if this instance is the only one."
        )


def public_jwks() -> dict[str, Any]:
    return {"keys": [signing_key().public_jwk]}


def sign(claims: dict[str, Any]) -> str:
    key = signing_key()
    return jwt.encode(claims, key.private_key, algorithm=ALGORITHM, headers={"kid": key.kid, "typ": "JWT"})


def _describe(private_key: rsa.RSAPrivateKey) -> SigningKey:
    jwk = RSAAlgorithm.to_jwk(private_key.public_key(), as_dict=True)
    # RFC 7638 thumbprint: a kid that changes exactly when the key does.
    canonical = json.dumps({"e": jwk["e"], "kty": "RSA", "n": jwk["n"]}, separators=(",", ":"), sort_keys=True)
    kid = base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()
    public_jwk = {"kty": "RSA", "n": jwk["n"], "e": jwk["e"], "kid": kid, "alg": ALGORITHM, "use": "sig"}
    return SigningKey(private_key=private_key, kid=kid, public_jwk=public_jwk)


def create(path: Path) -> None:
    """Write a new key to ``path`` unless one is there (several workers starting at once end up with the one key that
    won, never with a half-written file or each with its own)."""
    from config.local_secrets import write_once

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_once(path, pem.decode("ascii"))


def _load_or_create(path: Path) -> rsa.RSAPrivateKey:
    if not path.exists():
        check_available()
        create(path)
    private_key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(private_key, rsa.RSAPrivateKey):
        raise ValueError(f"{path} does not hold an RSA private key")
    return private_key


def main(argv: list[str]) -> int:
    """``python -m apps.identity.dev_idp.keys create PATH``: a signing key for DEV_IDP_SIGNING_KEY_FILE, made once and
    copied to every instance (production never generates one)."""
    if len(argv) != 3 or argv[1] != "create":
        print("usage: python -m apps.identity.dev_idp.keys create PATH", file=sys.stderr)
        return 2
    path = Path(argv[2])
    if path.exists():
        print(f"{path} exists; left as it is", file=sys.stderr)
        return 1
    create(path)
    print(f"dev IdP signing key written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
