"""``memory-service-mcp`` (clients/python, memory_service.mcp_stdio): the SDK's stdio client spawns it against the live
service; it forwards every listing and call to the service's /mcp with the credentials from its environment."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from django.conf import settings
from mcp import Client, StdioServerParameters

from tests.conftest import TEST_API_KEY
from tests.live_service import LiveService
from tests.mcp.conftest import D11_TOOLS, ok, refused, run, user_token

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]

CLIENT_SOURCES = Path(settings.BASE_DIR) / "clients" / "python" / "src"


def proxy(env: dict[str, str]) -> StdioServerParameters:
    """The entry point of this checkout's client package, as a desktop client would launch it."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "memory_service.mcp_stdio"],
        env={"PYTHONPATH": str(CLIENT_SOURCES), **env},
    )


def test_the_stdio_server_forwards_to_the_service(live_service: LiveService) -> None:
    env = {"MEMORY_SERVICE_URL": live_service.base_url, "MEMORY_SERVICE_TOKEN": user_token(live_service, "bob")}
    namespace = ["user", "bob", "stdio"]

    async def session():
        async with Client(proxy(env), mode="legacy") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            put = await client.call_tool("put_memory", {"namespace": namespace, "key": "k", "value": {"via": "stdio"}})
            got = await client.call_tool("get_memory", {"namespace": namespace, "key": "k"})
            found = await client.call_tool("search_memories", {"namespace_prefix": namespace})
            denied = await client.call_tool("put_memory", {"namespace": ["user", "alice"], "key": "k", "value": {}})
            return client.server_info, names, put, got, found, denied

    info, names, put, got, found, denied = run(session)
    assert info.name == "memory-service"
    assert names == D11_TOOLS
    assert ok(got)["value"] == {"via": "stdio"} and ok(got)["id"] == ok(put)["id"]
    assert [item["key"] for item in ok(found)["items"]] == ["k"]
    assert refused(denied, "forbidden")["reason"] == "access denied"
    # What it wrote, it wrote as bob, on the service.
    status, body = live_service.request(
        "GET", "/v1/memories?ns=user&ns=bob&ns=stdio&key=k", headers={"Authorization": f"Bearer {user_token(live_service, 'bob')}"}
    )
    assert status == 200 and body["value"] == {"via": "stdio"}


def test_the_stdio_server_fetches_its_own_tokens_and_sends_the_api_key(live_service: LiveService) -> None:
    env = {
        "MEMORY_SERVICE_URL": f"{live_service.base_url}/mcp",
        "MEMORY_SERVICE_TOKEN_URL": f"{live_service.base_url}/dev-idp/token",
        "MEMORY_SERVICE_CLIENT_ID": settings.DEV_IDP_CLIENT_ID,
        "MEMORY_SERVICE_CLIENT_SECRET": settings.DEV_IDP_CLIENT_SECRET,
        "MEMORY_SERVICE_USERNAME": "charlie",
        "MEMORY_SERVICE_PASSWORD": "charlie",
        "MEMORY_SERVICE_API_KEY": TEST_API_KEY,
    }

    async def session():
        async with Client(proxy(env), mode="legacy") as client:
            created = ok(await client.call_tool("create_conversation", {"title": "stdio notes"}))
            entry = await client.call_tool("append_entry", {"conversation_id": created["id"], "text": "ctx", "channel": "context"})
            return created, entry

    created, entry = run(session)
    assert created["ownerUserId"] == "charlie"
    assert ok(entry)["channel"] == "context"  # only an API-key client may write one


def test_without_configuration_it_says_what_is_missing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "memory_service.mcp_stdio"],
        env={"PYTHONPATH": str(CLIENT_SOURCES), "MEMORY_SERVICE_URL": "http://127.0.0.1:9"},
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 2
    assert "MEMORY_SERVICE_TOKEN" in result.stderr and result.stdout == ""


def test_the_console_script_is_the_entry_point() -> None:
    pyproject = tomllib.loads((CLIENT_SOURCES.parent / "pyproject.toml").read_text())
    target = pyproject["project"]["scripts"]["memory-service-mcp"]
    module, _, function = target.partition(":")
    assert module == "memory_service.mcp_stdio"
    assert callable(getattr(importlib.import_module(module), function))
    assert pyproject["project"]["optional-dependencies"]["mcp"] == ["mcp>=2.3,<3"]
