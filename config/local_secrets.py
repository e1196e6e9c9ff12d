"""Secrets the embedded default keeps in the data directory when the environment does not set them (issue 32.2).

A host that generated its own SECRET_KEY or MEMORY_ENCRYPTION_KEYS next to a database other hosts use encrypts
values they cannot read and signs links they refuse, without a word. So a secret is generated only where the
database is this installation's own (the embedded PostgreSQL, or ``GENERATE_SECRETS=true``); next to an external
database a missing one stops the start with what to set. Wherever a secret comes from is recorded
(``SECRET_SOURCES``) and logged when a server process starts (apps.runtime.startup.log_secret_sources).
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.env import env_str

ENVIRONMENT = "environment"


def may_generate(setting: str, database_is_embedded: bool) -> bool:
    """``GENERATE_SECRETS``: auto (generate only for the embedded database), true, or false."""
    choice = setting.strip().lower()
    if choice == "auto":
        return database_is_embedded
    if choice in ("true", "1", "yes", "on"):
        return True
    if choice in ("false", "0", "no", "off"):
        return False
    raise ImproperlyConfigured(f"GENERATE_SECRETS must be auto, true or false, got {choice!r}")


def write_once(path: Path, content: str) -> None:
    """Create ``path`` (0600) with ``content`` unless it exists: written to a private temporary file and linked into
    place, so processes starting at once agree on one value and nobody reads a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        try:
            os.link(temp, path)  # fails if another process got there first; then its value wins
        except FileExistsError:
            pass
        except OSError:  # filesystems without hard links
            if not path.exists():
                os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def resolve(
    name: str, path: Path, make: Callable[[], str], *, generate: bool, sources: dict[str, str], hint: str
) -> str:
    """The secret ``name``: from the environment, else from ``path``, else generated into ``path`` if ``generate``;
    otherwise ImproperlyConfigured. ``sources[name]`` records which ("environment", "file <path>", "generated
    <path>")."""
    value = env_str(name, "")
    if value:
        sources[name] = ENVIRONMENT
        return value
    if path.exists():
        sources[name] = f"file {path}"
        return path.read_text().strip()
    if not generate:
        raise ImproperlyConfigured(
            f"{name} is not set and DATABASE_URL names a database this installation did not start: a {name} "
            f"generated here would differ from every other host's ({hint}). Set {name} to the value the other hosts "
            "use (the same on every host: README \"Several hosts\"), or GENERATE_SECRETS=true if this host is the "
            "only one."
        )
    write_once(path, make())
    sources[name] = f"generated {path}"
    return path.read_text().strip()


def new_secret_key() -> str:
    return secrets.token_urlsafe(48)


def new_encryption_keys() -> str:
    return f"local-{secrets.token_hex(4)}:{base64.b64encode(secrets.token_bytes(32)).decode()}\n"
