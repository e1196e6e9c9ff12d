"""An MCP client session against the live service over Streamable HTTP: initialize, tools/list, writes, reads,
searches, refusals as tool errors, and the 401 with its protected-resource metadata."""

from __future__ import annotations

import pytest

from tests.live_service import LiveService
from tests.mcp.conftest import D11_TOOLS, mcp_session, ok, refused, run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]


def test_a_session_lists_the_tools_writes_searches_and_is_refused(live_service: LiveService) -> None:
    async def session():
        async with mcp_session(live_service, "alice") as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            put = await client.call_tool(
                "put_memory", {"namespace": ["user", "alice", "mcp"], "key": "coffee", "value": {"likes": "flat white"}}
            )
            got = await client.call_tool("get_memory", {"namespace": ["user", "alice", "mcp"], "key": "coffee"})
            found = await client.call_tool("search_memories", {"namespace_prefix": ["user", "alice", "mcp"]})
            denied = await client.call_tool(
                "put_memory", {"namespace": ["user", "bob", "mcp"], "key": "coffee", "value": {"likes": "tea"}}
            )
            return client.server_info, listed, put, got, found, denied

    info, listed, put, got, found, denied = run(session)
    assert info.name == "memory-service"
    assert set(listed) >= D11_TOOLS
    written = ok(put)
    assert ok(got)["value"] == {"likes": "flat white"} and ok(got)["id"] == written["id"]
    assert [item["key"] for item in ok(found)["items"]] == ["coffee"]
    assert refused(denied, "forbidden")["reason"] == "access denied"
