"""The MCP server (apps.mcp) against the live service (tests.live_service: gunicorn + uvicorn workers, the production
stack), driven by the official ``mcp`` SDK's own client over Streamable HTTP and over stdio.

The service commits what these tests write; the tables are flushed once after each module (as tests/clients does),
so a test scopes what it asserts to what it made itself (its own namespaces, titles and ids)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.live_service import LiveService

T = TypeVar("T")

D11_TOOLS = {
    "put_memory",
    "get_memory",
    "delete_memory",
    "search_memories",
    "list_namespaces",
    "list_memory_events",
    "list_conversations",
    "create_conversation",
    "list_entries",
    "append_entry",
    "search_conversations",
}


_tokens: dict[tuple[str, str], str] = {}


def user_token(live_service: LiveService, user: str) -> str:
    """An access token of the live service's dev IdP, one per user for the session."""
    key = (live_service.base_url, user)
    if key not in _tokens:
        _tokens[key] = live_service.token(user)
    return _tokens[key]


def credentials(live_service: LiveService, user: str, api_key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {user_token(live_service, user)}"}
    if api_key is not None:
        headers["X-API-Key"] = api_key
    return headers


@asynccontextmanager
async def mcp_session(live_service: LiveService, user: str, *, mode: str = "legacy", api_key: str | None = None):
    """An SDK ``Client`` connected to the live service's /mcp as ``user`` (``mode="legacy"``: the initialize
    handshake; ``"auto"``: the 2026-07-28 discover probe)."""
    async with httpx2.AsyncClient(headers=credentials(live_service, user, api_key), timeout=30) as http:
        transport = streamable_http_client(f"{live_service.base_url}/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


def run(coroutine: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(coroutine())


def structured(result: types.CallToolResult) -> dict[str, Any]:
    """A tool result's structuredContent, checked against its text content (the same JSON, D11)."""
    assert len(result.content) == 1 and result.content[0].type == "text", result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def ok(result: types.CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    return structured(result)


def refused(result: types.CallToolResult, code: str) -> dict[str, Any]:
    """A tool error carrying D1's body with ``code``."""
    assert result.is_error, result.content
    body = structured(result)
    assert body["code"] == code, body
    assert isinstance(body["error"], str) and body["error"] and body["requestId"], body
    return body
