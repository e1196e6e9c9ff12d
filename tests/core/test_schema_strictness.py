"""/openapi.json is exactly as strict as validation (issue 21.10) where JSON Schema can say it: what the schema admits
is accepted, what it forbids is refused. tests/fuzz checks both directions over every operation; these pin the
cases Schemathesis reported, each against the server."""

from __future__ import annotations

import re
import uuid

import pytest
from django.test import override_settings

from apps.attachments.serializers import expires_in_schema, parse_expires_in
from apps.core import errors
from apps.memories import config
from apps.memories.models import ServiceSettings

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(api) -> dict:
    config.clear_cache()
    yield api.get("/openapi.json").json()
    config.clear_cache()


def parameter(schema: dict, path: str, method: str, name: str) -> dict:
    return next(p["schema"] for p in schema["paths"][path][method]["parameters"] if p["name"] == name)


def component(schema: dict, name: str) -> dict:
    return schema["components"]["schemas"][name]


def test_namespace_depth_is_the_admin_setting_in_force(api, schema):
    assert component(schema, "MemoryWriteRequest")["properties"]["namespace"]["maxItems"] == 5
    ServiceSettings.objects.create(memory_episodic_namespace_max_depth=7)
    config.clear_cache()
    changed = api.get("/openapi.json").json()
    assert component(changed, "MemoryWriteRequest")["properties"]["namespace"]["maxItems"] == 7
    # Reads and deletes take any address up to the setting's ceiling (issue 21.16): a record written under a higher
    # setting stays reachable after it is lowered.
    for method in ("get", "delete"):
        for served in (schema, changed):
            assert parameter(served, "/v1/memories", method, "ns")["maxItems"] == config.MAX_NAMESPACE_DEPTH
    assert "x-namespace-depth" not in api.get("/openapi.json").content.decode()


def test_namespace_segments_and_keys_refuse_nul_in_the_schema_as_on_the_server(schema, client_for):
    segment = parameter(schema, "/v1/memories", "get", "ns")["items"]
    key = parameter(schema, "/v1/memories", "get", "key")
    for field in (segment, key, parameter(schema, "/v1/memories/events", "get", "ns")["items"]):
        assert not re.search(field["pattern"], "a\x00b")
    assert key["maxLength"] == 1024 and "bytes in UTF-8" in key["description"]
    bob = client_for("bob")
    assert bob.get("/v1/memories?ns=user&ns=b%00ob&key=k").status_code == 400
    assert bob.get("/v1/memories?ns=user&ns=bob&key=k%00").status_code == 400


def test_ttl_maximum_is_in_the_schema(schema, settings):
    assert component(schema, "MemoryWriteRequest")["properties"]["ttl_seconds"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": settings.MEMORY_MAX_TTL_SECONDS,
    }


# The interface's limits table (binding): method, path, where the limit travels, default, maximum. Each list declares
# its bounds beside its view (or its request serializer); this checks the schema and the server against the table.
LIMITS_TABLE = [
    ("get", "/v1/conversations", "query", 20, 200),
    ("get", "/v1/conversations/{conversationId}/entries", "query", 50, 200),
    ("get", "/v1/conversations/{conversationId}/memberships", "query", 50, 200),
    ("get", "/v1/conversations/{conversationId}/forks", "query", 50, 200),
    ("post", "/v1/conversations/search", "body", 20, 200),
    ("get", "/v1/conversations/unindexed", "query", 100, 200),
    ("get", "/v1/ownership-transfers", "query", 50, 200),
    ("get", "/v1/admin/conversations", "query", 100, 1000),
    ("get", "/v1/admin/conversations/{conversationId}/entries", "query", 50, 1000),
    ("get", "/v1/admin/conversations/{conversationId}/memberships", "query", 50, 1000),
    ("get", "/v1/admin/conversations/{conversationId}/forks", "query", 50, 1000),
    ("post", "/v1/admin/conversations/search", "body", 20, 1000),
    ("get", "/v1/admin/attachments", "query", 50, 1000),
    ("post", "/v1/memories/search", "body", 10, 100),
    ("get", "/v1/memories/events", "query", 50, 200),
]


def _limit_schema(schema: dict, method: str, path: str, where: str) -> dict:
    if where == "query":
        return parameter(schema, path, method, "limit")
    ref = schema["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return component(schema, ref.rsplit("/", 1)[-1])["properties"]["limit"]


@pytest.mark.parametrize(("method", "path", "where", "default", "maximum"), LIMITS_TABLE)
def test_every_limit_has_the_interfaces_bounds_in_the_schema(schema, method, path, where, default, maximum):
    limit = _limit_schema(schema, method, path, where)
    assert (limit["type"], limit["minimum"], limit["maximum"], limit["default"]) == ("integer", 1, maximum, default)


@pytest.mark.parametrize(("method", "path", "where", "default", "maximum"), LIMITS_TABLE)
def test_every_limit_is_enforced_with_the_interfaces_bounds(client_for, method, path, where, default, maximum):
    if path.startswith("/v1/admin/"):
        client = client_for("alice")
    elif path.endswith("/unindexed"):
        client = client_for("indexer-bot", roles=("user", "indexer"))
    else:
        client = client_for("bob")
    path = path.replace("{conversationId}", str(uuid.uuid4()))
    body = {"namespace_prefix": ["user", "bob"]} if path == "/v1/memories/search" else {"query": "anything"}

    def call(limit: int):
        if where == "body":
            return client.post(path, {**body, "limit": limit}, format="json")
        return client.get(path, {"limit": limit})

    for refused in (0, maximum + 1):
        response = call(refused)
        assert response.status_code == 400, (refused, response.content)
        assert response.json()["details"]["fields"] == {"limit": f"must be an integer between 1 and {maximum}"}
    assert call(maximum).status_code != 400


def test_admin_attachments_limit_zero_is_outside_the_schema_and_refused(schema, client_for):
    assert parameter(schema, "/v1/admin/attachments", "get", "limit")["minimum"] == 1
    assert client_for("alice").get("/v1/admin/attachments?limit=0").status_code == 400


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("add", True),
        ("add,update", True),
        (" add , ,expired ", True),
        ("", True),
        ("bogus", False),
        ("add,bogus", False),
        ("ADD", False),
    ],
)
def test_event_kinds_pattern_matches_what_the_server_takes(schema, client_for, value, valid):
    pattern = parameter(schema, "/v1/memories/events", "get", "kinds")["items"]["pattern"]
    assert bool(re.search(pattern, value)) is valid
    response = client_for("bob").get("/v1/memories/events", {"kinds": value})
    assert response.status_code == (200 if valid else 400), response.content


FILTERS = [
    ({"a": 1}, True),
    ({"a": None, "b": "x", "c": True, "d": 1.5}, True),
    ({"a": {"in": [1, "x"]}, "b": {"$gte": 1, "lt": "2024-01-01T00:00:00Z"}, "c": {"eq": "v"}}, True),
    ({"a": {"between": [1, 2]}}, False),
    ({"a": {}}, False),
    ({"a": {"in": []}}, False),
    ({"a": {"gt": True}}, False),
    ({"a": [1, 2]}, False),
    ({"": 1}, False),
]


def as_json_schema(node):
    """OpenAPI 3.0's ``nullable`` as JSON Schema says it, everywhere in ``node``."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: as_json_schema(value) for key, value in node.items() if key != "nullable"}
    return {"anyOf": [converted, {"type": "null"}]} if node.get("nullable") else converted


@pytest.mark.parametrize(("filter_", "valid"), FILTERS)
def test_filter_operators_are_in_the_schema_as_the_compiler_takes_them(schema, client_for, filter_, valid):
    import jsonschema

    filter_schema = as_json_schema(component(schema, "MemorySearchRequest")["properties"]["filter"])
    assert jsonschema.Draft7Validator(filter_schema).is_valid(filter_) is valid
    response = client_for("bob").post(
        "/v1/memories/search", {"namespace_prefix": ["user", "bob"], "filter": filter_}, format="json"
    )
    assert response.status_code == (200 if valid else 400), response.content


EXPIRES_IN = ["1", "60", "86400", "86401", "0", "PT90S", "PT86400S", "PT86401S", "PT30M", "PT1440M", "PT1441M",
              "PT1H", "PT24H", "PT25H", "P1D", "P2D", "P1W", "PT0S", "", "soon", "-5", "1.5"]  # fmt: skip


def _accepted(value: str) -> bool:
    try:
        parse_expires_in(value)
    except errors.ApiError:
        return False
    return True


@pytest.mark.parametrize("value", EXPIRES_IN)
def test_expires_in_pattern_admits_exactly_what_is_accepted(value):
    assert bool(re.search(expires_in_schema()["pattern"], value)) is _accepted(value)


@pytest.mark.parametrize("value", ["PT1H30M", "pt1h", " 60 ", "060", "P0DT60S"])
def test_expires_in_forms_accepted_beyond_the_schema(value):
    """Several units, lower case, blanks and leading zeros are taken too; the description says so, the pattern
    (which cannot bound a sum) does not."""
    assert _accepted(value) and not re.search(expires_in_schema()["pattern"], value)


@override_settings(ATTACHMENT_MAX_EXPIRES_IN=7 * 86400 + 5)
def test_expires_in_pattern_follows_the_configured_maximum():
    pattern = expires_in_schema()["pattern"]
    assert re.search(pattern, "P1W") and re.search(pattern, "P7D") and re.search(pattern, str(7 * 86400 + 5))
    assert not re.search(pattern, "P8D") and not re.search(pattern, str(7 * 86400 + 6)) and not re.search(pattern, "P2W")


def test_expires_in_is_documented_on_query_and_form_and_the_upload_body_is_required(schema):
    operation = schema["paths"]["/v1/attachments"]["post"]
    query = next(p["schema"] for p in operation["parameters"] if p["name"] == "expiresIn")
    form = operation["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]["expiresIn"]
    assert query["pattern"] == form["pattern"] == expires_in_schema()["pattern"]
    assert operation["requestBody"]["required"] is True


@pytest.mark.parametrize(
    ("path", "method"),
    [("/v1/attachments", "post"), ("/v1/conversations/{conversationId}/entries", "post"), ("/v1/memories", "put")],
)
def test_a_body_with_required_fields_is_required(schema, path, method):
    assert schema["paths"][path][method]["requestBody"]["required"] is True


def test_list_bodies_state_their_bounds(schema, settings):
    body = schema["paths"]["/v1/conversations/index"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert (body["minItems"], body["maxItems"]) == (1, settings.CONVERSATION_INDEX_MAX_ITEMS)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/conversations/search", {"query": "\n\t "}),
        ("/v1/memories/search", {"namespace_prefix": ["user", "bob"], "query": "   "}),
    ],
)
def test_blank_queries_are_outside_the_schema_and_refused(schema, client_for, path, body):
    request = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    query = component(schema, request["$ref"].rsplit("/", 1)[1])["properties"]["query"]
    assert not re.search(query["pattern"], body["query"]) and re.search(query["pattern"], " a ")
    assert client_for("bob").post(path, body, format="json").status_code == 400


def test_the_primary_owners_membership_is_documented_as_not_removable(schema):
    for method in ("delete", "patch"):
        operation = schema["paths"]["/v1/conversations/{conversationId}/memberships/{userId}"][method]
        assert "primary owner" in operation["description"] and "400" in operation["responses"]


def test_a_made_up_conversation_id_in_a_path_is_not_a_400(client_for):
    """The fuzzer's ids are random UUIDs: what reaches existence must answer 404, not 400."""
    assert client_for("bob").get(f"/v1/conversations/{uuid.uuid4()}").status_code == 404
