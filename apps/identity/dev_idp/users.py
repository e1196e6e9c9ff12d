"""The dev IdP's users: alice (admin), bob and charlie by default, or the ones in the JSON file DEV_IDP_USERS.

The file is either an object ``{"alice": {"password": "...", "roles": ["user", "admin"]}}`` or a list
``[{"username": "alice", "password": "...", "roles": [...]}]``. It is re-read when it changes.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class DevUser:
    username: str
    password: str
    roles: tuple[str, ...]


DEFAULT_USERS: dict[str, DevUser] = {
    "alice": DevUser("alice", "alice", ("user", "admin")),
    "bob": DevUser("bob", "bob", ("user",)),
    "charlie": DevUser("charlie", "charlie", ("user",)),
}

_lock = threading.Lock()
_file_cache: dict[str, tuple[float, dict[str, DevUser]]] = {}


def load_users() -> dict[str, DevUser]:
    path = settings.DEV_IDP_USERS
    if not path:
        return DEFAULT_USERS
    try:
        mtime = Path(path).stat().st_mtime
    except OSError as exc:
        raise ImproperlyConfigured(f"DEV_IDP_USERS: cannot read {path}: {exc.strerror}") from None
    with _lock:
        cached = _file_cache.get(path)
        if cached is None or cached[0] != mtime:
            cached = _file_cache[path] = (mtime, _parse(path, json.loads(Path(path).read_text(encoding="utf-8"))))
        return cached[1]


def _parse(path: str, document: Any) -> dict[str, DevUser]:
    if isinstance(document, dict):
        entries = [{"username": name, **(spec if isinstance(spec, dict) else {})} for name, spec in document.items()]
    elif isinstance(document, list):
        entries = document
    else:
        raise ImproperlyConfigured(f"DEV_IDP_USERS: {path} must hold a JSON object or list")
    users: dict[str, DevUser] = {}
    for entry in entries:
        username = entry.get("username") if isinstance(entry, dict) else None
        password = entry.get("password") if isinstance(entry, dict) else None
        roles = entry.get("roles", []) if isinstance(entry, dict) else None
        if not isinstance(username, str) or not username or not isinstance(password, str) or not password:
            raise ImproperlyConfigured(f"DEV_IDP_USERS: every user in {path} needs a username and a password")
        if not isinstance(roles, list) or not all(isinstance(role, str) for role in roles):
            raise ImproperlyConfigured(f"DEV_IDP_USERS: roles of {username!r} must be a list of strings")
        users[username] = DevUser(username, password, tuple(roles))
    return users
