"""An MCP client session against the live service over Streamable HTTP (the SDK's own client): initialize,
tools/list, writes, reads, searches, refusals as tool errors carrying D1's code, the answers' parity with REST, and
the 401 with its protected-resource metadata."""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

import pytest
import requests
from django.conf import settings
from jsonschema.validators import Draft202012Validator
from mcp.shared.exceptions import MCPError

from tests.conftest import TEST_API_KEY
from tests.live_service import LiveService
from tests.mcp.conftest import D11_TOOLS, credentials, mcp_session, ok, refused, run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]

READ_ONLY = {"get_memory", "search_memories", "list_namespaces", "list_memory_events", "list_conversations",
             "list_entries", "search_conversations"}  # fmt: skip
DESTRUCTIVE = {"put_memory", "delete_memory"}


def rest(live_service: LiveService, user: str, method: str, path: str, body=None, api_key: str | None = None):
    return live_service.request(method, path, json=body, headers=credentials(live_service, user, api_key))


def test_a_session_initializes_lists_writes_searches_and_is_refused(live_service: LiveService) -> None:
    namespace = ["user", "alice", "mcp-session"]

    async def session():
        async with mcp_session(live_service, "alice") as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            put = await client.call_tool("put_memory", {"namespace": namespace, "key": "coffee", "value": {"likes": "flat white"}})
            got = await client.call_tool("get_memory", {"namespace": namespace, "key": "coffee"})
            found = await client.call_tool("search_memories", {"namespace_prefix": namespace})
            denied = await client.call_tool(
                "put_memory", {"namespace": ["user", "bob", "mcp-session"], "key": "coffee", "value": {"likes": "tea"}}
            )
            return client.server_info, client.protocol_version, listed, put, got, found, denied

    info, version, listed, put, got, found, denied = run(session)
    assert info.name == "memory-service" and version == "2025-11-25"
    assert set(listed) == D11_TOOLS
    written = ok(put)
    assert ok(got)["value"] == {"likes": "flat white"} and ok(got)["id"] == written["id"]
    assert [item["key"] for item in ok(found)["items"]] == ["coffee"]
    assert refused(denied, "forbidden")["reason"] == "access denied"
    # ... and the refused write wrote nothing.
    assert rest(live_service, "bob", "GET", "/v1/memories?" + urlencode({"ns": ["user", "bob", "mcp-session"], "key": "coffee"}, doseq=True))[0] == 404  # fmt: skip


def test_every_tool_declares_its_schemas_and_hints(live_service: LiveService) -> None:
    async def listing():
        async with mcp_session(live_service, "bob") as client:
            return (await client.list_tools()).tools

    for tool in run(listing):
        Draft202012Validator.check_schema(tool.input_schema)
        Draft202012Validator.check_schema(tool.output_schema)
        assert tool.input_schema["type"] == "object" and tool.input_schema["additionalProperties"] is False, tool.name
        assert tool.output_schema["type"] == "object", tool.name
        assert tool.description and tool.annotations.title
        assert tool.annotations.read_only_hint is (tool.name in READ_ONLY), tool.name
        assert tool.annotations.open_world_hint is False
        if tool.name not in READ_ONLY:
            assert tool.annotations.destructive_hint is (tool.name in DESTRUCTIVE), tool.name


def test_the_input_schemas_are_the_rest_api_s(live_service: LiveService) -> None:
    """A tool over a REST body takes what its OpenAPI schema states, limits included (the depth in force too)."""

    async def listing():
        async with mcp_session(live_service, "bob") as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = run(listing)
    components = requests.get(f"{live_service.base_url}/openapi.json", timeout=30).json()["components"]["schemas"]
    put_body = components["MemoryWriteRequest"]
    assert tools["put_memory"].input_schema["required"] == put_body["required"]
    assert tools["put_memory"].input_schema["properties"]["namespace"] == put_body["properties"]["namespace"]
    assert tools["put_memory"].input_schema["properties"]["key"] == put_body["properties"]["key"]
    search_body = components["MemorySearchRequest"]
    assert set(tools["search_memories"].input_schema["properties"]) == set(search_body["properties"])
    assert tools["search_memories"].input_schema["properties"]["limit"] == search_body["properties"]["limit"]
    assert tools["list_entries"].input_schema["properties"]["limit"]["maximum"] == 200


def test_modern_clients_are_served_too(live_service: LiveService) -> None:
    """The SDK's default mode probes server/discover (the 2026-07-28 per-request envelope) before any handshake."""

    async def session():
        async with mcp_session(live_service, "bob", mode="auto") as client:
            put = await client.call_tool("put_memory", {"namespace": ["user", "bob", "modern"], "key": "k", "value": {"n": 1}})
            got = await client.call_tool("get_memory", {"namespace": ["user", "bob", "modern"], "key": "k"})
            return client.protocol_version, put, got

    version, put, got = run(session)
    assert version == "2026-07-28"
    assert ok(got)["value"] == {"n": 1} and ok(got)["id"] == ok(put)["id"]


def test_bad_arguments_are_tool_errors_naming_the_argument(live_service: LiveService) -> None:
    async def calls():
        async with mcp_session(live_service, "bob") as client:
            results = [
                await client.call_tool("get_memory", {"namespace": ["user", "bob"], "key": ""}),
                await client.call_tool("get_memory", {"namespace": ["user", "bob"], "key": "k", "colour": "red"}),
                await client.call_tool("put_memory", {"namespace": ["user", "bob"], "key": "k", "value": "not an object"}),
                await client.call_tool("search_memories", {"namespace_prefix": ["user"], "limit": 101}),
                await client.call_tool("list_entries", {"conversation_id": "not-a-uuid"}),
                await client.call_tool("search_conversations", {"query": "x", "after_cursor": "!!"}),
                await client.call_tool("append_entry", {"conversation_id": str(uuid.uuid4()), "text": "a\x00b"}),
                await client.call_tool("list_memory_events", {"kinds": ["add", "renamed"]}),
                await client.call_tool("get_memory", {}),
            ]
            try:
                await client.call_tool("no_such_tool", {})
            except MCPError as exc:
                unknown = exc
            else:
                unknown = None
            return results, unknown

    results, unknown = run(calls)
    fields = [refused(result, "validation_error")["details"]["fields"] for result in results]
    assert list(fields[0]) == ["key"]
    assert fields[1] == {"colour": "unknown field"}
    assert list(fields[2]) == ["value"]
    assert list(fields[3]) == ["limit"]
    assert list(fields[4]) == ["conversation_id"]
    assert list(fields[5]) == ["after_cursor"]
    assert list(fields[6]) == ["text"]
    assert list(fields[7]) == ["kinds.1"]
    assert set(fields[8]) == {"namespace", "key"}
    # A tool that does not exist is not an argument: the protocol's error (MCP spec).
    assert unknown is not None and unknown.error.code == -32602


def test_policies_and_access_apply_to_every_tool(live_service: LiveService) -> None:
    """bob, through MCP, can neither write, read, delete nor find what lives under ["user", "alice"], nor write to
    alice's conversation, and the refusals carry the same D1 code REST answers."""
    alice_ns = ["user", "alice", "private"]
    status, _ = rest(live_service, "alice", "PUT", "/v1/memories", {"namespace": alice_ns, "key": "diary", "value": {"t": "x"}})
    assert status == 200
    conversation = rest(live_service, "alice", "POST", "/v1/conversations", {"title": "alice's private"})[1]

    async def calls():
        async with mcp_session(live_service, "bob") as client:
            return [
                await client.call_tool("put_memory", {"namespace": ["user", "alice"], "key": "k", "value": {"x": 1}}),
                await client.call_tool("get_memory", {"namespace": alice_ns, "key": "diary"}),
                await client.call_tool("delete_memory", {"namespace": alice_ns, "key": "diary"}),
                await client.call_tool("search_memories", {"namespace_prefix": ["user", "alice"]}),
                await client.call_tool("list_namespaces", {"namespace_prefix": ["user"]}),
                await client.call_tool("list_memory_events", {"namespace_prefix": ["user", "alice"]}),
                await client.call_tool("append_entry", {"conversation_id": conversation["id"], "text": "hi alice"}),
                await client.call_tool("list_entries", {"conversation_id": conversation["id"]}),
            ]

    put, get, delete, search, namespaces, events, append, entries = run(calls)
    for result in (put, get, delete):
        assert refused(result, "forbidden")["reason"] == "access denied"
    assert ok(search)["items"] == []
    assert all(namespace[:2] == ["user", "bob"] for namespace in ok(namespaces)["namespaces"])
    assert ok(events)["events"] == []
    rest_append = rest(live_service, "bob", "POST", f"/v1/conversations/{conversation['id']}/entries",
                       {"content": [{"role": "USER", "text": "hi alice"}]})  # fmt: skip
    rest_entries = rest(live_service, "bob", "GET", f"/v1/conversations/{conversation['id']}/entries")
    assert refused(append, rest_append[1]["code"]) and rest_append[0] in (403, 404)
    assert refused(entries, rest_entries[1]["code"]) and rest_entries[0] in (403, 404)
    # alice's memory is still there, and her conversation has no entry.
    address = urlencode({"ns": alice_ns, "key": "diary"}, doseq=True)
    assert rest(live_service, "alice", "GET", f"/v1/memories?{address}")[0] == 200
    assert rest(live_service, "alice", "GET", f"/v1/conversations/{conversation['id']}/entries")[1]["data"] == []


def test_answers_are_the_rest_api_s_json(live_service: LiveService) -> None:
    """Each read tool's structuredContent is the body its REST twin answers, field for field."""
    namespace = ["user", "charlie", "parity"]
    for key in ("a", "b"):
        rest(live_service, "charlie", "PUT", "/v1/memories", {"namespace": namespace, "key": key, "value": {"k": key}})
    # A conversation search finds index text (no background indexer runs here): one entry given its own.
    indexed = rest(live_service, "charlie", "POST", f"/v1/conversations/{uuid.uuid4()}/entries",
                   {"content": [{"role": "USER", "text": "parity notes"}], "indexedContent": "hello parity"})  # fmt: skip
    assert indexed[0] == 201, indexed

    async def calls():
        async with mcp_session(live_service, "charlie") as client:
            created = ok(await client.call_tool("create_conversation", {"title": "parity", "metadata": {"p": 1}}))
            appended = [
                ok(await client.call_tool("append_entry", {"conversation_id": created["id"], "text": text, "role": role}))
                for text, role in (("hello", "USER"), ("hi there", "AI"))
            ]
            return created, appended, [
                await client.call_tool("get_memory", {"namespace": namespace, "key": "a"}),
                await client.call_tool("search_memories", {"namespace_prefix": namespace, "limit": 5}),
                await client.call_tool("list_namespaces", {"namespace_prefix": ["user", "charlie"], "max_depth": 3}),
                await client.call_tool("list_memory_events", {"namespace_prefix": namespace, "kinds": ["add"]}),
                await client.call_tool("list_conversations", {"limit": 5}),
                await client.call_tool("list_entries", {"conversation_id": created["id"], "limit": 1}),
                await client.call_tool("search_conversations", {"query": "hello", "search_type": "fulltext"}),
                await client.call_tool("search_memories", {"namespace_prefix": namespace, "query": "k", "limit": 3}),
            ]

    created, appended, results = run(calls)
    get, search, namespaces, events, conversations, entries, found, semantic = map(ok, results)
    assert created["title"] == "parity" and created["metadata"] == {"p": 1} and created["accessLevel"] == "owner"
    assert [entry["content"] for entry in appended] == [[{"role": "USER", "text": "hello"}], [{"role": "AI", "text": "hi there"}]]

    def body(method: str, path: str, payload=None):
        status, answer = rest(live_service, "charlie", method, path, payload)
        assert status == 200, answer
        return answer

    assert get == body("GET", "/v1/memories?" + urlencode({"ns": namespace, "key": "a"}, doseq=True))
    assert search == body("POST", "/v1/memories/search", {"namespace_prefix": namespace, "limit": 5})
    assert namespaces == body("GET", "/v1/memories/namespaces?" + urlencode({"prefix": ["user", "charlie"], "max_depth": 3}, doseq=True))
    assert events == body("GET", "/v1/memories/events?" + urlencode({"ns": namespace, "kinds": "add"}, doseq=True))
    assert [event["key"] for event in events["events"]] == ["a", "b"]
    assert conversations == body("GET", "/v1/conversations?limit=5")
    assert entries == body("GET", f"/v1/conversations/{created['id']}/entries?limit=1")
    assert entries["data"] == [appended[0]] and entries["afterCursor"]
    assert found == body("POST", "/v1/conversations/search", {"query": "hello", "searchType": "fulltext"})
    assert [result["entryId"] for result in found["data"]] == [indexed[1]["id"]]
    # By meaning: nothing is embedded here (no worker runs), but the path is REST's, answer for answer.
    assert semantic == body("POST", "/v1/memories/search", {"namespace_prefix": namespace, "query": "k", "limit": 3})

    async def next_page():
        async with mcp_session(live_service, "charlie") as client:
            return ok(await client.call_tool("list_entries", {"conversation_id": created["id"], "after_cursor": entries["afterCursor"]}))

    assert run(next_page)["data"] == [appended[1]]


def test_list_entries_from_either_end(live_service: LiveService) -> None:
    """D11 over MCP: tail=true is the newest page (oldest first within it), its beforeCursor passed as before_cursor
    walks back, and every page is the body GET .../entries answers for the same cursor, beforeCursor included (the
    tool's declared outputSchema holds it). More than one mode, or a cursor of the other direction, is the REST
    list's 400 as a tool error naming the arguments."""
    conversation_id = str(uuid.uuid4())
    for n in range(5):
        status, _ = rest(live_service, "charlie", "POST", f"/v1/conversations/{conversation_id}/entries",
                         {"content": [{"role": "USER", "text": f"entry {n}"}]})  # fmt: skip
        assert status == 201

    def texts(page: dict) -> list[str]:
        return [entry["content"][0]["text"] for entry in page["data"]]

    async def calls():
        async with mcp_session(live_service, "charlie") as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            newest = ok(await client.call_tool("list_entries", {"conversation_id": conversation_id, "tail": True, "limit": 2}))
            before = ok(await client.call_tool(
                "list_entries", {"conversation_id": conversation_id, "before_cursor": newest["beforeCursor"], "limit": 2}
            ))
            first = ok(await client.call_tool(
                "list_entries", {"conversation_id": conversation_id, "before_cursor": before["beforeCursor"], "limit": 2}
            ))
            refusals = [
                await client.call_tool("list_entries", {"conversation_id": conversation_id, "tail": True,
                                                        "after_cursor": before["afterCursor"]}),
                await client.call_tool("list_entries", {"conversation_id": conversation_id,
                                                        "after_cursor": before["afterCursor"],
                                                        "before_cursor": before["beforeCursor"]}),
                await client.call_tool("list_entries", {"conversation_id": conversation_id,
                                                        "before_cursor": before["afterCursor"]}),
                await client.call_tool("list_entries", {"conversation_id": conversation_id,
                                                        "after_cursor": before["beforeCursor"]}),
            ]
            return listed["list_entries"], newest, before, first, refusals

    tool, newest, before, first, refusals = run(calls)
    assert {"tail", "before_cursor", "after_cursor"} <= set(tool.input_schema["properties"])
    assert tool.input_schema["properties"]["tail"]["type"] == "boolean"
    validator = Draft202012Validator(tool.output_schema)
    for page in (newest, before, first):
        validator.validate(page)
    assert "beforeCursor" in tool.output_schema["required"]

    assert texts(newest) == ["entry 3", "entry 4"] and newest["afterCursor"] is None and newest["beforeCursor"]
    assert texts(before) == ["entry 1", "entry 2"] and before["afterCursor"] and before["beforeCursor"]
    assert texts(first) == ["entry 0"] and first["beforeCursor"] is None and first["afterCursor"]

    def body(query: str) -> dict:
        status, answer = rest(live_service, "charlie", "GET", f"/v1/conversations/{conversation_id}/entries?{query}")
        assert status == 200, answer
        return answer

    assert newest == body("tail=true&limit=2")
    assert before == body(urlencode({"beforeCursor": newest["beforeCursor"], "limit": 2}))
    assert first == body(urlencode({"beforeCursor": before["beforeCursor"], "limit": 2}))

    fields = [refused(result, "validation_error")["details"]["fields"] for result in refusals]
    assert set(fields[0]) == {"tail", "after_cursor"}
    assert set(fields[1]) == {"after_cursor", "before_cursor"}
    assert "mutually exclusive" in fields[0]["tail"]
    # A cursor handed in for the other direction: the REST list's 400, named as the tool's argument.
    assert list(fields[2]) == ["before_cursor"]
    assert list(fields[3]) == ["after_cursor"]
    rest_status, rest_body = rest(live_service, "charlie", "GET", f"/v1/conversations/{conversation_id}/entries?"
                                  + urlencode({"beforeCursor": before["afterCursor"]}))  # fmt: skip
    assert rest_status == 400 and list(rest_body["details"]["fields"]) == ["beforeCursor"]


def test_deletes_and_conversation_writes(live_service: LiveService) -> None:
    namespace = ["user", "bob", "deleting"]

    async def calls():
        async with mcp_session(live_service, "bob") as client:
            await client.call_tool("put_memory", {"namespace": namespace, "key": "k", "value": {"x": 1}, "ttl_seconds": 60})
            deleted = await client.call_tool("delete_memory", {"namespace": namespace, "key": "k"})
            again = await client.call_tool("delete_memory", {"namespace": namespace, "key": "k"})
            gone = await client.call_tool("get_memory", {"namespace": namespace, "key": "k"})
            conversation_id = str(uuid.uuid4())
            first = await client.call_tool("append_entry", {"conversation_id": conversation_id, "text": "first words"})
            duplicate = await client.call_tool("create_conversation", {"conversation_id": conversation_id})
            context = await client.call_tool("append_entry", {"conversation_id": conversation_id, "text": "t", "channel": "context"})
            return conversation_id, deleted, again, gone, first, duplicate, context

    conversation_id, deleted, again, gone, first, duplicate, context = run(calls)
    assert ok(deleted) == ok(again) == {"namespace": namespace, "key": "k", "deleted": True}
    refused(gone, "not_found")
    # An unknown id creates the conversation (REST's append), titled from the first words.
    assert ok(first)["conversationId"] == conversation_id
    assert rest(live_service, "bob", "GET", f"/v1/conversations/{conversation_id}")[1]["title"] == "first words"
    refused(duplicate, "conflict")
    # A context entry needs an API-key client: with one, it is that client's.
    refused(context, "forbidden")

    async def with_key():
        async with mcp_session(live_service, "bob", api_key=TEST_API_KEY) as client:
            written = await client.call_tool("append_entry", {"conversation_id": conversation_id, "text": "t", "channel": "context"})
            listed = await client.call_tool("list_entries", {"conversation_id": conversation_id, "channel": "context"})
            return written, listed

    written, listed = run(with_key)
    assert ok(written)["channel"] == "context" and [entry["id"] for entry in ok(listed)["data"]] == [ok(written)["id"]]


def mcp_post(live_service: LiveService, body, headers: dict[str, str] | None = None) -> requests.Response:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json", **(headers or {})}
    return requests.post(f"{live_service.base_url}/mcp", json=body, headers=headers, timeout=30)


LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def test_without_credentials_401_names_the_protected_resource_metadata(live_service: LiveService) -> None:
    metadata_url = f"{live_service.base_url}/.well-known/oauth-protected-resource/mcp"
    bad_token = {"Authorization": "Bearer not-a-token"}
    key_alone = {"X-API-Key": TEST_API_KEY}
    for headers, invalid_token in (({}, False), (bad_token, True), (key_alone, False)):
        response = mcp_post(live_service, LIST_TOOLS, headers)
        assert response.status_code == 401, response.text
        assert response.json()["code"] == "unauthenticated" and response.json()["requestId"]
        challenge = response.headers["WWW-Authenticate"]
        assert challenge.startswith("Bearer ") and f'resource_metadata="{metadata_url}"' in challenge
        assert ('error="invalid_token"' in challenge) is invalid_token
    # The SDK's client is refused too: its session never opens.

    async def anonymous():
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient() as http, Client(streamable_http_client(f"{live_service.base_url}/mcp", http_client=http), mode="legacy"):
            pass

    with pytest.raises(BaseException) as raised:
        run(anonymous)
    leaves = [raised.value]
    while isinstance(leaves[0], BaseExceptionGroup):
        leaves = list(leaves[0].exceptions)
    assert [type(leaf) for leaf in leaves] == [MCPError], leaves

    for url in (metadata_url, f"{live_service.base_url}/.well-known/oauth-protected-resource"):
        response = requests.get(url, timeout=10)
        assert response.status_code == 200
        assert response.json() == {
            "resource": f"{live_service.base_url}/mcp",
            "authorization_servers": [settings.DEV_IDP_ISSUER],
            "bearer_methods_supported": ["header"],
            "resource_name": "Memory Service",
        }
        assert response.headers["Access-Control-Allow-Origin"] == "*"


def test_http_edges(live_service: LiveService) -> None:
    alice = credentials(live_service, "alice")
    for method in ("GET", "DELETE", "PUT"):
        response = requests.request(method, f"{live_service.base_url}/mcp", headers=alice, timeout=10)
        assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"
        assert response.headers["Allow"] == "POST"
    too_big = mcp_post(live_service, {"pad": "x" * settings.REQUEST_MAX_BODY_BYTES}, alice)
    assert too_big.status_code == 413 and too_big.json()["code"] == "payload_too_large"
    # One request id per HTTP request: the caller's, echoed, and the one a tool error names.
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "get_memory", "arguments": {"namespace": ["user", "alice"], "key": "absent"}}}  # fmt: skip
    response = mcp_post(live_service, call, {**alice, "X-Request-ID": "mcp-probe-1"})
    assert response.status_code == 200 and response.headers["X-Request-ID"] == "mcp-probe-1"
    result = response.json()["result"]
    assert result["isError"] is True
    assert result["structuredContent"] == {
        "code": "not_found", "error": "No active memory at that namespace and key.", "requestId": "mcp-probe-1"
    }
