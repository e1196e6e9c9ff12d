"""The sharp parts of apps.mcp on their own: OpenAPI to JSON Schema, and how a tool call's failures become tool
errors (the request-level checks first, a database outage, an unexpected exception)."""

from __future__ import annotations

import json

import psycopg
import pytest
from jsonschema.validators import Draft202012Validator

from apps.core import errors
from apps.core.serializers import StrictSerializer
from apps.identity.principal import Principal
from apps.mcp import schema, server, tools
from apps.memories.openapi import DEPTH_MARKER

BOB = Principal(user_id="bob", client_id=None, roles=("user",))


def test_openapi_nullable_becomes_a_null_alternative() -> None:
    converted = schema._json_schema(
        {
            "type": "object",
            "properties": {
                "plain": {"type": "string", "nullable": True, "readOnly": True},
                "choice": {"anyOf": [{"type": "string"}, {"type": "number"}], "nullable": True, "description": "d"},
                "enum": {"enum": ["a", "b"], "type": "string", "nullable": True, "x-spec-enum-id": "1"},
                "ref": {"$ref": "#/components/schemas/Item"},
                "depth": {"type": "array", DEPTH_MARKER: True},
            },
        },
        {"Item": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}}},
    )
    assert converted["properties"] == {
        "plain": {"type": ["string", "null"]},
        "choice": {"description": "d", "anyOf": [{"anyOf": [{"type": "string"}, {"type": "number"}]}, {"type": "null"}]},
        "enum": {"anyOf": [{"enum": ["a", "b"], "type": "string"}, {"type": "null"}]},
        "ref": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}},
        "depth": {"type": "array", DEPTH_MARKER: True},
    }
    validator = Draft202012Validator(converted)
    assert validator.is_valid({"plain": None, "choice": None, "enum": None})
    assert not validator.is_valid({"enum": "c"})
    assert schema.with_namespace_depth(converted, 3)["properties"]["depth"] == {"type": "array", "maxItems": 3}


def test_every_tool_schema_is_self_contained_json_schema() -> None:
    for tool in tools.TOOLS.values():
        for document in (tool.input_schema(5), tool.output_schema()):
            Draft202012Validator.check_schema(document)
            text = json.dumps(document)
            assert "$ref" not in text and "nullable" not in text and DEPTH_MARKER not in text, tool.name
    assert tools.TOOLS["put_memory"].input_schema(5)["properties"]["namespace"]["maxItems"] == 5


class _NoArguments(StrictSerializer):
    pass


@pytest.fixture(autouse=True)
def _no_rate_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """These units run without a database; the limiter reads per-user overrides from it (the test of the real
    limiter below puts it back)."""
    monkeypatch.setattr(server, "check_rate", lambda principal, kind=None: None)


def _tool(handler) -> tools.Tool:
    return tools.Tool("probe", "Probe", "A test tool.", _NoArguments, tools.DeleteMemoryResult, handler, read_only=True)


def _body(result) -> dict:
    assert result.is_error
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def test_the_request_checks_run_before_the_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def over_the_rate(principal: Principal, tool: tools.Tool) -> None:
        raise errors.ApiError(429, "Too many requests.", headers={"Retry-After": "7"})

    monkeypatch.setattr(server, "check_request", over_the_rate)
    result = server.run_tool(BOB, _tool(lambda principal, data: ran.append("handler") or {}), {})
    assert _body(result)["code"] == "rate_limited" and result.meta == {"retryAfter": 7}
    assert ran == []


def test_a_database_outage_is_a_retryable_tool_error() -> None:
    def down(principal: Principal, data: dict) -> dict:
        raise psycopg.OperationalError("connection refused")

    result = server.run_tool(BOB, _tool(down), {})
    assert _body(result)["code"] == "unavailable" and result.meta == {"retryAfter": 2}


def test_an_unexpected_exception_is_an_internal_error_that_tells_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def broken(principal: Principal, data: dict) -> dict:
        raise KeyError("secret detail")

    result = server.run_tool(BOB, _tool(broken), {})
    body = _body(result)
    assert body["code"] == "internal_error" and "secret" not in result.content[0].text
    assert any(record.message == "unhandled error in MCP tool" for record in caplog.records)


def test_arguments_must_be_an_object() -> None:
    result = server.run_tool(BOB, _tool(lambda principal, data: {}), ["not", "an", "object"])
    assert _body(result)["details"]["fields"] == {"arguments": "must be an object"}


def test_the_tools_follow_their_rest_twins() -> None:
    """A REST body field or selector option added later reaches the tool, or this fails: search_memories takes the
    search body's serializer as its arguments and passes on what it handles (D11's `queries` is handled once the
    body has it); list_entries passes its selector every page option: a Window of limit, after, before and tail
    (D11), from the arguments limit, after_cursor, before_cursor and tail. The selector's ``key`` filter (the
    checkpointer's lookup) is no tool argument: D11 names none."""
    import dataclasses
    import inspect

    from apps.conversations import selectors as conversation_selectors
    from apps.core import pagination
    from apps.memories.serializers import MemorySearchSerializer

    assert set(MemorySearchSerializer().fields) == tools.SEARCH_FIELDS_HANDLED
    options = set(inspect.signature(conversation_selectors.list_entries).parameters)
    assert options == {"principal", "conversation_id", "channel", "window", "key"}
    assert {f.name for f in dataclasses.fields(pagination.Window)} == {"limit", "after", "before", "tail"}
    assert set(tools.ListEntriesArguments().fields) == {
        "conversation_id", "channel", "after_cursor", "before_cursor", "tail", "limit"
    }
    window = tools._entry_window({"limit": 7, "before_cursor": "b"})
    assert window == pagination.Window(7, None, "b", False)
    assert tools._entry_window({"tail": True}) == pagination.Window(50, None, None, True)
    assert tools._entry_window({"after_cursor": "a", "tail": False}) == pagination.Window(50, "a", None, False)


@pytest.mark.parametrize(
    "arguments",
    [
        {"after_cursor": "a", "tail": True},
        {"before_cursor": "b", "tail": True},
        {"after_cursor": "a", "before_cursor": "b"},
        {"after_cursor": "a", "before_cursor": "b", "tail": True},
    ],
)
def test_list_entries_modes_exclude_each_other_as_over_rest(arguments) -> None:
    """D11: at most one of after_cursor, before_cursor and tail=true; more is the REST list's 400, naming the
    arguments given, before the conversation is looked at."""
    with pytest.raises(errors.ApiError) as raised:
        tools.call(BOB, tools.TOOLS["list_entries"], {"conversation_id": "8b0e3e0c-0000-4000-8000-000000000000", **arguments})
    error = raised.value
    assert error.status == 400 and error.code == "validation_error"
    fields = error.details["fields"]
    assert set(fields) == {name for name, value in arguments.items() if value}
    assert all("mutually exclusive" in problem for problem in fields.values())


@pytest.mark.parametrize("tail", ["true", 1, None])
def test_list_entries_tail_is_a_json_boolean(tail) -> None:
    with pytest.raises(errors.ApiError) as raised:
        tools.call(BOB, tools.TOOLS["list_entries"], {"conversation_id": "8b0e3e0c-0000-4000-8000-000000000000", "tail": tail})
    assert set(raised.value.details["fields"]) == {"tail"}


def test_text_that_may_be_blank_admits_the_blank_string() -> None:
    """drf-spectacular states such a field as oneOf [text, blank], which "" matches twice (oneOf refuses it)."""
    for name, argument in (("append_entry", "text"), ("create_conversation", "title"), ("list_conversations", "query")):
        validator = Draft202012Validator(tools.TOOLS[name].input_schema()["properties"][argument])
        assert validator.is_valid("") and validator.is_valid("words") and not validator.is_valid("a\x00b"), name


def test_a_token_verified_moments_ago_is_decided_without_io(mint_token, settings) -> None:
    """/mcp authenticates on its event loop what authenticate_credentials verified moments ago, exactly as it did;
    anything else (a first sight, an API key, a malformed header) stays with authenticate_credentials."""
    import uuid

    from apps.identity.authentication import authenticate_cached, authenticate_credentials

    token = mint_token("bob", claims={"jti": uuid.uuid4().hex})
    header = f"Bearer {token}"
    assert authenticate_cached(header, None) is None  # never verified yet
    principal, verified = authenticate_credentials(header, None)
    assert authenticate_cached(header, None) == (principal, verified)
    assert authenticate_cached(header, None)[0].client_id is None
    assert authenticate_cached(header, "some-key") is None
    assert authenticate_cached(f"Basic {token}", None) is None
    assert authenticate_cached(f"Bearer {token} extra", None) is None
    settings.VERIFIED_TOKEN_CACHE_SECONDS = 0
    assert authenticate_cached(header, None) is None


@pytest.mark.django_db
def test_tool_calls_spend_the_callers_request_rate_and_searches_their_class(settings, monkeypatch) -> None:
    """The real limiter (apps.limits, on the session's Valkey): a tool call takes a ``requests`` token as a REST
    request does, and a search tool one of the ``searches`` class too."""
    import uuid

    from apps.identity.principal import Principal as Caller
    from apps.limits import rates
    from apps.limits.definitions import RATES

    ran: list[str] = []
    caller = Caller(user_id=f"mcp-rate-{uuid.uuid4().hex[:8]}", client_id=None, roles=("user",))
    setattr(settings, RATES["requests"].per_minute_setting, 60)
    setattr(settings, RATES["requests"].burst_setting, 2)
    rates.reset()
    monkeypatch.setattr(server, "check_rate", rates.check_rate)
    probe = _tool(lambda principal, data: ran.append("handler") or {})
    assert not server.run_tool(caller, probe, {}).is_error
    assert not server.run_tool(caller, probe, {}).is_error
    refused = server.run_tool(caller, probe, {})
    assert _body(refused)["code"] == "rate_limited" and refused.meta["retryAfter"] >= 1
    assert ran == ["handler", "handler"]
    assert server.RATE_KINDS == {"search_memories": "searches", "search_conversations": "searches"}
    assert set(server.RATE_KINDS) <= set(tools.TOOLS)
