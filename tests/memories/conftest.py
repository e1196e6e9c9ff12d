"""Helpers shared by the memory-store tests: HTTP shortcuts, error assertions and custom policy directories."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.utils import timezone

from apps.memories import config
from apps.memories.models import Memory, MemoryEvent

MEMORIES = "/v1/memories"
SEARCH = "/v1/memories/search"
NAMESPACES = "/v1/memories/namespaces"
EVENTS = "/v1/memories/events"

ISO_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
WRITE_FIELDS = {"id", "namespace", "key", "attributes", "created_at", "expires_at"}
READ_FIELDS = WRITE_FIELDS | {"value"}
SEARCH_FIELDS = {"id", "namespace", "key", "value", "attributes", "score", "created_at"}
EVENT_FIELDS = {"id", "namespace", "key", "kind", "occurred_at", "value", "attributes"}
DENIED = {"code": "forbidden", "reason": "access denied"}


def url(path: str, **params: Any) -> str:
    """``path?...`` with list values repeated once per item (ns, prefix, suffix, kinds)."""
    params = {name: value for name, value in params.items() if value is not None}
    return f"{path}?{urlencode(params, doseq=True)}" if params else path


def put(client, namespace: Any, key: Any, value: Any, **extra: Any):
    return client.put(MEMORIES, {"namespace": namespace, "key": key, "value": value, **extra}, format="json")


def put_ok(client, namespace: list[str], key: str, value: dict | None = None, **extra: Any) -> dict:
    response = put(client, namespace, key, {"v": key} if value is None else value, **extra)
    assert response.status_code == 200, response.content
    return response.json()


def get(client, namespace: list[str], key: str):
    return client.get(url(MEMORIES, ns=namespace, key=key))


def delete(client, namespace: list[str], key: str):
    return client.delete(url(MEMORIES, ns=namespace, key=key))


def search(client, prefix: list[str], **body: Any):
    return client.post(SEARCH, {"namespace_prefix": prefix, **body}, format="json")


def semantic_items(client, query: str, prefix: Any, **extra: Any) -> list[dict]:
    """A search by meaning only (``search_type`` semantic): what the tests of the vectors' side check."""
    body = {"namespace_prefix": list(prefix), "query": query, "search_type": "semantic", **extra}
    response = client.post(SEARCH, body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["items"]


def search_items(client, prefix: list[str], **body: Any) -> list[dict]:
    response = search(client, prefix, **body)
    assert response.status_code == 200, response.content
    return response.json()["items"]


def search_keys(client, prefix: list[str], **body: Any) -> list[str]:
    return sorted(item["key"] for item in search_items(client, prefix, **body))


def namespaces(client, **params: Any) -> list[list[str]]:
    response = client.get(url(NAMESPACES, **params))
    assert response.status_code == 200, response.content
    assert set(response.json()) == {"namespaces"}
    return response.json()["namespaces"]


def events(client, **params: Any) -> dict:
    response = client.get(url(EVENTS, **params))
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"events", "after_cursor"}
    return body


def event_kinds(client, **params: Any) -> list[tuple[str, str]]:
    return [(event["kind"], event["key"]) for event in events(client, **params)["events"]]


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code
    assert isinstance(body["error"], str) and body["error"]
    assert body["requestId"] == response["X-Request-ID"]
    return body


def assert_validation_error(response, *fields: str) -> dict:
    """A D1 400 whose details.fields names exactly ``fields`` (when given); an item of a list field may be named
    with its position (``ns.1`` for ``ns``)."""
    body = assert_error(response, 400, "validation_error")
    assert set(body) == {"code", "error", "requestId", "details"}
    reported = body["details"]["fields"]
    assert isinstance(reported, dict) and reported
    if fields:
        roots = {name if name in fields else re.split(r"[.\[]", name)[0] for name in reported}
        assert roots == set(fields), body["details"]
    return body


def assert_denied(response) -> dict:
    body = assert_error(response, 403, "forbidden")
    assert body["reason"] == "access denied"
    assert set(body) == {"code", "error", "requestId", "reason"}
    return body


def prepared_statements() -> list[str]:
    """The statements PostgreSQL keeps prepared on this thread's connection (the one the test client uses)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def counts() -> tuple[int, int]:
    return Memory.objects.count(), MemoryEvent.objects.count()


def expire_now(namespace: list[str], key: str, ago: timedelta = timedelta(milliseconds=1)) -> datetime:
    """Move the active version's expires_at just into the past (instead of sleeping until it passes)."""
    expires_at = timezone.now() - ago
    updated = Memory.objects.filter(namespace=namespace, key=key, state="active").update(expires_at=expires_at)
    assert updated == 1
    return expires_at


@pytest.fixture(autouse=True)
def _fresh_settings_cache() -> Iterator[None]:
    """The namespace max depth is cached in-process; no test may see another's ServiceSettings row."""
    config.clear_cache()
    yield
    config.clear_cache()


@pytest.fixture
def alice(client_for):
    """alice: roles user + admin."""
    return client_for("alice")


@pytest.fixture
def bob(client_for):
    return client_for("bob")


@pytest.fixture(params=["exact", "hnsw"])
def plan(request, settings):
    """Run a test under both ANN plans: small scopes are ranked exactly; threshold 0 forces the HNSW walk."""
    settings.MEMORY_VECTOR_EXACT_SCAN_THRESHOLD = 2000 if request.param == "exact" else 0
    return request.param


@pytest.fixture
def charlie(client_for):
    return client_for("charlie")


@pytest.fixture
def bob_http(live_service, mint_token) -> tuple[str, dict[str, str]]:
    """(base url, headers) for bob against the live service (tests/live_service.py)."""
    return live_service.base_url, {"Authorization": f"Bearer {mint_token('bob')}"}


@pytest.fixture
def policy_dir(settings, tmp_path: Path) -> Callable[..., Path]:
    """``policy_dir(authz=..., attributes=..., filter=...)`` writes the given Rego files (others fall back to the
    built-ins) and points SERVICE_POLICY_DIR at them; the engine is rebuilt because its config key changes."""

    def write(**files: str) -> Path:
        for name, text in files.items():
            (tmp_path / f"{name}.rego").write_text(textwrap.dedent(text), encoding="utf-8")
        settings.SERVICE_POLICY_DIR = str(tmp_path)
        return tmp_path

    return write


# Copies the typed fields of the value into the attributes (for filter tests); namespace/sub as the built-in.
COPY_ATTRIBUTES_REGO = """
    package memories.attributes

    import rego.v1

    base := {"namespace": input.namespace[0], "sub": input.namespace[1]} if count(input.namespace) >= 2
    base := {} if count(input.namespace) < 2

    copied := {name: v | some name in ["n", "at", "team", "tag", "flag"]; v := input.value[name]}

    attributes := object.union(base, copied)
"""
