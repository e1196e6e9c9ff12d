"""The dev IdP's RSA signing key: generated once into DATA_DIR and reused, so tokens survive restarts and every
worker process of one installation signs with (and trusts) the same key."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings
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
    return Path(settings.DATA_DIR) / "dev-idp" / "signing-key.pem"


def signing_key() -> SigningKey:
    """The key for the current DATA_DIR, loaded (or created) once per process."""
    path = key_path()
    key = _loaded.get(path)
    if key is None:
        with _lock:
            key = _loaded.get(path)
            if key is None:
                key = _loaded[path] = _describe(_load_or_create(path))
    return key


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


def _load_or_create(path: Path) -> rsa.RSAPrivateKey:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # Write a private temp file, then link it into place: several workers starting at once must all end up
        # with the one key that won, never with a half-written file or each with its own key.
        temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(pem)
            try:
                os.link(temp, path)
            except FileExistsError:
                pass
            except OSError:  # filesystems without hard links
                if not path.exists():
                    os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)
    private_key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(private_key, rsa.RSAPrivateKey):
        raise ValueError(f"{path} does not hold an RSA private key")
    return private_key
