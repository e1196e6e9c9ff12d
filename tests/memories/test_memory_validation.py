"""Bad input (D1, D3, D4): a 400 validation_error naming the field, or 413 for an oversized value, and nothing
written."""

from __future__ import annotations

import pytest

from apps.memories import config
from apps.memories.models import Memory, ServiceSettings
from tests.memories.conftest import (
    EVENTS,
    MEMORIES,
    NAMESPACES,
    SEARCH,
    assert_denied,
    assert_error,
    assert_validation_error,
    counts,
    delete,
    get,
    put_ok,
    search,
    url,
)

pytestmark = pytest.mark.django_db

NS = ["user", "bob", "notes"]
GOOD = {"namespace": NS, "key": "k", "value": {"v": 1}}


def put_body(client, **changes):
    body = {**GOOD, **changes}
    return client.put(MEMORIES, {k: v for k, v in body.items() if v is not OMIT}, format="json")


OMIT = object()


# --- PUT body -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"value": ["a", "b"]}, "value"),
        ({"value": "text"}, "value"),
        ({"value": None}, "value"),
        ({"value": 5}, "value"),
        ({"value": OMIT}, "value"),
        ({"namespace": "user/bob"}, "namespace"),
        ({"namespace": {"0": "user"}}, "namespace"),
        ({"namespace": None}, "namespace"),
        ({"namespace": []}, "namespace"),
        ({"namespace": OMIT}, "namespace"),
        ({"namespace": ["user", "", "x"]}, "namespace"),
        ({"namespace": ["user", 7]}, "namespace"),
        ({"namespace": ["user", None]}, "namespace"),
        ({"namespace": ["user", ["bob"]]}, "namespace"),
        ({"namespace": ["user", "bob", "x" * 257]}, "namespace"),
        ({"namespace": ["user", "bob", "a\x00b"]}, "namespace"),
        ({"namespace": ["user", "bob", "a", "b", "c", "d"]}, "namespace"),
        ({"key": ""}, "key"),
        ({"key": None}, "key"),
        ({"key": 12}, "key"),
        ({"key": OMIT}, "key"),
        ({"key": "k" * 1025}, "key"),
        ({"key": "é" * 513}, "key"),  # 1026 bytes in UTF-8
        ({"ttl_seconds": -1}, "ttl_seconds"),
        ({"ttl_seconds": "5"}, "ttl_seconds"),
        ({"ttl_seconds": 5.5}, "ttl_seconds"),
        ({"ttl_seconds": True}, "ttl_seconds"),
        ({"ttl_seconds": None}, "ttl_seconds"),
        ({"ttl_seconds": 10 * 365 * 24 * 3600 + 1}, "ttl_seconds"),
        ({"index": {"text": 5}}, "index"),
        ({"index": {"text": None}}, "index"),
        ({"index": {"text": ["a"]}}, "index"),
        ({"index": ["text"]}, "index"),
        ({"index": "text"}, "index"),
        ({"index": {f"f{i}": "x" for i in range(257)}}, "index"),
        ({"index": {"text": "x" * (256 * 1024 + 1)}}, "index"),
        ({"index": {"a": "x" * (128 * 1024), "b": "é" * (64 * 1024) + "x"}}, "index"),  # bytes, not characters
        ({"index": {"": "x"}}, "index"),
    ],
)
def test_put_rejects_bad_fields_and_writes_nothing(bob, changes, field):
    response = put_body(bob, **changes)

    assert_validation_error(response, field)
    assert counts() == (0, 0)


@pytest.mark.parametrize(
    "raw_value",
    [
        '{"a": 1e400}',
        '{"a": [-1e400]}',
        '{"a": 9223372036854775808}',
        '{"a": {"b": -9223372036854775809}}',
        '{"a": "x\\u0000y"}',
        '{"a\\u0000": 1}',
        '{"a": "\\ud800"}',
        '{"\\udfff": 1}',
        '{"a": ' * 40 + "1" + "}" * 40,
    ],
)
def test_put_rejects_values_that_cannot_be_stored_or_evaluated(bob, raw_value):
    # Each of these used to reach the policy engine or the encoder and fail as a 500.
    body = '{"namespace": ["user", "bob"], "key": "k", "value": ' + raw_value + "}"

    response = bob.put(MEMORIES, body, content_type="application/json")

    assert_validation_error(response, "value")
    assert counts() == (0, 0)


def test_put_rejects_index_text_that_cannot_be_stored(bob):
    body = '{"namespace": ["user", "bob"], "key": "k", "value": {}, "index": {"text": "bad \\ud800 surrogate"}}'

    response = bob.put(MEMORIES, body, content_type="application/json")

    assert_validation_error(response, "index")
    assert counts() == (0, 0)


def test_put_accepts_extreme_but_valid_json(bob):
    value = {"big": 2**63 - 1, "small": -(2**63), "float": 1e308, "text": 'ü\n\t"\\', "deep": [[[[{"a": None}]]]]}

    put_ok(bob, ["user", "bob"], "k", value)

    assert bob.get(url(MEMORIES, ns=["user", "bob"], key="k")).json()["value"] == value


def test_put_rejects_unknown_fields(bob):
    response = put_body(bob, ttl=5, extra=1)

    body = assert_validation_error(response, "ttl", "extra")
    assert body["details"]["fields"]["ttl"] == "unknown field"
    assert counts() == (0, 0)


def test_put_rejects_a_non_object_body(bob):
    response = bob.put(MEMORIES, [GOOD], format="json")

    assert_validation_error(response)
    assert counts() == (0, 0)


def test_put_rejects_malformed_json(bob):
    response = bob.put(MEMORIES, '{"namespace": ["user", "bob"], "key": ', content_type="application/json")

    assert_validation_error(response, "body")
    assert counts() == (0, 0)


def test_put_names_every_bad_field(bob):
    response = put_body(bob, key="", value=[], ttl_seconds="x")

    assert_validation_error(response, "key", "value", "ttl_seconds")


def test_validation_runs_before_authorization(bob):
    # D1 order: 400 before 403, even for a namespace the caller may not write.
    assert_validation_error(put_body(bob, namespace=["user", "alice"], value="nope"), "value")


def test_depth_at_the_maximum_is_accepted(bob):
    assert put_body(bob, namespace=["user", "bob", "a", "b", "c"]).status_code == 200
    assert counts() == (1, 1)


def test_key_of_exactly_1024_bytes_is_accepted(bob):
    put_ok(bob, NS, "k" * 1024)
    put_ok(bob, NS, "é" * 512)


def test_ttl_at_the_maximum_is_accepted(bob):
    assert put_ok(bob, NS, "k", ttl_seconds=10 * 365 * 24 * 3600)["expires_at"] is not None


def test_index_of_strings_is_accepted(bob):
    put_ok(bob, NS, "k", index={"text": "hello", "empty": ""})


def test_index_up_to_256_fields_and_256_kib_is_accepted(bob):
    """What LangGraph's store sends (every string leaf of the value): once refused past 32 fields / 8192 chars."""
    put_ok(bob, NS, "forty-fields", index={f"$.leaf{i}": f"value {i}" for i in range(40)})
    put_ok(bob, NS, "one-long-string", index={"$.text": "lorem ipsum " * 1000})  # 12,000 characters
    per_field = 256 * 1024 // 256
    at_limit = {f"f{i}": "x" * per_field for i in range(256)}
    put_ok(bob, NS, "at-limit", index=at_limit)
    put_ok(bob, NS, "multibyte-at-limit", index={"text": "é" * (128 * 1024)})  # 256 KiB in UTF-8
    stored = Memory.objects.get(key="at-limit", state="active").indexed_content
    assert stored == at_limit  # kept whole, never cut


def test_max_depth_follows_service_settings(bob):
    deep = ["user", "bob", "a", "b", "c", "d"]
    ServiceSettings.objects.create(memory_episodic_namespace_max_depth=6)
    config.clear_cache()

    assert put_body(bob, namespace=deep).status_code == 200

    ServiceSettings.objects.update(memory_episodic_namespace_max_depth=3)
    config.clear_cache()

    body = assert_validation_error(put_body(bob, namespace=["user", "bob", "a", "b"]), "namespace")
    assert "3" in body["details"]["fields"]["namespace"]
    assert put_body(bob, namespace=["user", "bob", "a"]).status_code == 200
    assert counts() == (2, 2)


def test_lowering_max_depth_caps_new_writes_only(bob):
    # Issue 21.16: records written under a higher setting stay readable, searchable, listable and deletable.
    deep = ["user", "bob", "a", "b", "c", "d"]
    ServiceSettings.objects.create(memory_episodic_namespace_max_depth=6)
    config.clear_cache()
    put_ok(bob, deep, "old", {"v": 1})
    ServiceSettings.objects.update(memory_episodic_namespace_max_depth=3)
    config.clear_cache()

    assert_validation_error(put_body(bob, namespace=deep, key="old"), "namespace")  # an update is a new write
    response = get(bob, deep, "old")
    assert response.status_code == 200, response.content
    assert response.json()["value"] == {"v": 1}
    assert [item["key"] for item in search(bob, ["user", "bob", "a"]).json()["items"]] == ["old"]
    assert bob.get(url(NAMESPACES)).json() == {"namespaces": [deep]}
    assert delete(bob, deep, "old").status_code == 204
    assert get(bob, deep, "old").status_code == 404
    assert counts() == (1, 2)


def test_addresses_deeper_than_any_setting_allows_are_malformed(bob):
    too_deep = ["user", "bob", *[f"s{i}" for i in range(config.MAX_NAMESPACE_DEPTH - 1)]]
    assert_validation_error(get(bob, too_deep, "k"), "ns")
    assert_validation_error(delete(bob, too_deep, "k"), "ns")
    assert get(bob, too_deep[:-1], "k").status_code == 404  # at the ceiling: well-formed


def test_max_depth_setting_is_bounded_by_the_ceiling(bob, settings):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        ServiceSettings(memory_episodic_namespace_max_depth=config.MAX_NAMESPACE_DEPTH + 1).full_clean()
    settings.MEMORY_EPISODIC_NAMESPACE_MAX_DEPTH = 1000
    config.clear_cache()
    assert config.namespace_max_depth() == config.MAX_NAMESPACE_DEPTH


def test_empty_service_settings_fall_back_to_the_environment_default(bob, settings):
    ServiceSettings.objects.create(memory_episodic_namespace_max_depth=None)
    settings.MEMORY_EPISODIC_NAMESPACE_MAX_DEPTH = 2
    config.clear_cache()

    assert_validation_error(put_body(bob, namespace=["user", "bob", "x"]), "namespace")
    assert put_body(bob, namespace=["user", "bob"]).status_code == 200


def test_oversized_value_is_413_and_writes_nothing(bob, settings):
    settings.MEMORY_MAX_VALUE_BYTES = 100

    response = put_body(bob, value={"text": "x" * 100})

    body = assert_error(response, 413, "payload_too_large")
    assert set(body) == {"code", "error", "requestId"}
    assert counts() == (0, 0)


def test_value_exactly_at_the_size_limit_is_accepted(bob, settings):
    value = {"t": "x" * 92}  # {"t":"xxx..."} serialized compactly: 8 + 92 bytes
    settings.MEMORY_MAX_VALUE_BYTES = 100

    assert put_body(bob, value=value).status_code == 200
    assert_error(put_body(bob, value={"t": "x" * 93}), 413, "payload_too_large")


def test_default_value_limit_is_one_mebibyte(bob):
    response = put_body(bob, value={"text": "x" * (1024 * 1024)})

    assert_error(response, 413, "payload_too_large")
    assert counts() == (0, 0)


def test_value_size_is_checked_before_authorization(bob, settings):
    settings.MEMORY_MAX_VALUE_BYTES = 10
    assert_error(put_body(bob, namespace=["user", "alice"], value={"t": "x" * 20}), 413, "payload_too_large")


def test_policy_deny_on_write_writes_nothing(bob):
    assert_denied(put_body(bob, namespace=["user", "alice"]))
    assert counts() == (0, 0)


# --- GET / DELETE query -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["get", "delete"])
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"key": "k"}, "ns"),
        ({"ns": NS}, "key"),
        ({"ns": NS, "key": ""}, "key"),
        ({"ns": ["user", "", "x"], "key": "k"}, "ns"),
        # Deeper than the configured depth (5) is still an address (issue 21.16); deeper than its ceiling is not.
        ({"ns": ["user", "bob", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"], "key": "k"}, "ns"),
        ({"ns": NS, "key": "k" * 1025}, "key"),
        ({"ns": NS, "key": "é" * 513}, "key"),  # 1026 bytes in UTF-8
        ({"ns": NS, "key": "a\x00b"}, "key"),
    ],
)
def test_get_and_delete_reject_a_bad_address(bob, method, params, field):
    response = getattr(bob, method)(url(MEMORIES, **params))

    assert_validation_error(response, field)
    assert counts() == (0, 0)


@pytest.mark.parametrize("key", ["k" * 1025, "é" * 513])
def test_get_and_delete_refuse_an_oversized_key_exactly_as_put_does(bob, key):
    """Issue 21.9: GET answered 404 and DELETE 204 for a key PUT refuses with 400."""
    refused = put_body(bob, key=key)
    assert_validation_error(refused, "key")
    for method in ("get", "delete"):
        response = getattr(bob, method)(url(MEMORIES, ns=NS, key=key))
        assert_validation_error(response, "key")
        assert response.json()["details"]["fields"]["key"] == refused.json()["details"]["fields"]["key"]


def test_bad_delete_leaves_the_record(bob):
    put_ok(bob, NS, "k")

    assert_validation_error(bob.delete(url(MEMORIES, ns=NS, key="")), "key")
    assert counts() == (1, 1)
    assert bob.get(url(MEMORIES, ns=NS, key="k")).status_code == 200


def test_bad_address_is_400_before_authorization(bob):
    assert_validation_error(bob.get(url(MEMORIES, ns=["user", "alice"])), "key")


# --- search body --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "namespace_prefix"),
        ({"namespace_prefix": "user"}, "namespace_prefix"),
        ({"namespace_prefix": ["user", ""]}, "namespace_prefix"),
        ({"namespace_prefix": ["user", 3]}, "namespace_prefix"),
        ({"namespace_prefix": [], "limit": 0}, "limit"),
        ({"namespace_prefix": [], "limit": 101}, "limit"),
        ({"namespace_prefix": [], "limit": "x"}, "limit"),
        # A JSON body is typed: a number in a string is refused, as a query string's "5" is not (issue 21.18).
        ({"namespace_prefix": [], "limit": "5"}, "limit"),
        ({"namespace_prefix": [], "query": "q", "limit": "5"}, "limit"),
        ({"namespace_prefix": [], "limit": 5.5}, "limit"),
        ({"namespace_prefix": [], "limit": True}, "limit"),
        ({"namespace_prefix": [], "offset": -1}, "offset"),
        ({"namespace_prefix": [], "offset": 10001}, "offset"),
        ({"namespace_prefix": [], "offset": "1"}, "offset"),
        ({"namespace_prefix": [], "offset": 1.5}, "offset"),
        ({"namespace_prefix": [], "query": ""}, "query"),
        ({"namespace_prefix": [], "query": 5}, "query"),
        ({"namespace_prefix": [], "sort": "asc"}, "sort"),
        ({"namespace_prefix": [], "filter": []}, "filter"),
        ({"namespace_prefix": [], "filter": "sub=bob"}, "filter"),
        ({"namespace_prefix": [], "filter": {"n": {"like": "a%"}}}, "filter.n.like"),
        ({"namespace_prefix": [], "filter": {"n": {"$ne": 1}}}, "filter.n.$ne"),
        ({"namespace_prefix": [], "filter": {"n": {"in": []}}}, "filter.n.in"),
        ({"namespace_prefix": [], "filter": {"n": {"in": "a"}}}, "filter.n.in"),
        ({"namespace_prefix": [], "filter": {"n": {"in": [{"a": 1}]}}}, "filter.n.in"),
        ({"namespace_prefix": [], "filter": {"n": {"in": [[1]]}}}, "filter.n.in"),
        ({"namespace_prefix": [], "filter": {"n": {"a": {"b": 1}}}}, "filter.n.a"),
        ({"namespace_prefix": [], "filter": {"n": {}}}, "filter.n"),
        ({"namespace_prefix": [], "filter": {"n": [1, 2]}}, "filter.n"),
        ({"namespace_prefix": [], "filter": {"n": {"gt": "yesterday"}}}, "filter.n.gt"),
        ({"namespace_prefix": [], "filter": {"n": {"gt": True}}}, "filter.n.gt"),
        ({"namespace_prefix": [], "filter": {"n": {"gte": None}}}, "filter.n.gte"),
        ({"namespace_prefix": [], "filter": {"n": {"lt": [1]}}}, "filter.n.lt"),
        ({"namespace_prefix": [], "filter": {"n": {"$eq": {"x": 1}}}}, "filter.n.$eq"),
        ({"namespace_prefix": [], "filter": {"": 1}}, "filter"),
        ({"namespace_prefix": [], "filter": {"n": "a\x00b"}}, "filter.n"),
        ({"namespace_prefix": [], "filter": {"n": 2**64}}, "filter.n"),
        ({"namespace_prefix": [], "filter": {"n": {"in": [1, -(2**63) - 1]}}}, "filter.n"),
        ({"namespace_prefix": [], "filter": {"n": {"gt": 2**70}}}, "filter.n.gt"),
        ({"namespace_prefix": [], "filter": {"n": {"gt": "2024-02-30T00:00:00Z"}}}, "filter.n.gt"),
        ({"namespace_prefix": [], "filter": {"n": {"lt": "0001-01-01T00:00:00+23:59"}}}, "filter.n.lt"),
    ],
)
def test_search_rejects_bad_input(alice, body, field):
    response = alice.post(SEARCH, body, format="json")

    assert_validation_error(response, field)


@pytest.mark.parametrize(
    ("raw_filter", "field"),
    [('{"n": {"gt": 1e400}}', "filter"), ('{"n": "\\ud800"}', "filter.n"), ('{"\\ud800": 1}', "filter")],
)
def test_search_rejects_filters_json_can_spell_but_nothing_can_run(alice, raw_filter, field):
    body = '{"namespace_prefix": [], "filter": ' + raw_filter + "}"

    assert_validation_error(alice.post(SEARCH, body, content_type="application/json"), field)


@pytest.mark.parametrize("query", [None, "anything"])
@pytest.mark.parametrize(
    "raw_filter",
    [
        # Issue 21.7: more bound values than PostgreSQL takes in one statement (65,535) was a 500 ...
        {"n": {"in": list(range(65_536))}},
        # ... and 5,000 range clauses with a semantic query took 25-29 s of CPU.
        {f"a{i}": {"gt": i} for i in range(5_000)},
        {f"a{i}": 1 for i in range(17)},  # more than 16 attributes
        {"a": {"gt": 0, "gte": 0, "lt": 9, "lte": 9, "$gt": 1}},  # more than 4 operators on one attribute
        {"a": {"in": list(range(600))}, "b": {"$in": list(range(401))}},  # 1,001 `in` values in all
    ],
)
def test_search_caps_the_filter(alice, raw_filter, query):
    body = {"namespace_prefix": [], "filter": raw_filter, **({"query": query} if query else {})}
    assert_validation_error(alice.post(SEARCH, body, format="json"), "filter")


@pytest.mark.parametrize("query", [None, "anything"])
def test_search_takes_a_filter_at_the_caps(alice, query):
    put_ok(alice, ["user", "alice"], "k", index={"text": "anything at all"})
    at_caps = {
        **{f"a{i}": {"gt": -1, "lt": 10, "$gte": -1, "$lte": 10} for i in range(14)},
        "namespace": {"in": ["user", *[f"x{i}" for i in range(499)]], "$eq": "user", "gte": "2000-01-01T00:00:00Z"},
        "sub": {"$in": ["alice", *[f"y{i}" for i in range(499)]], "eq": "alice", "lte": 1, "gt": 0},
    }  # 16 attributes of 4 operators (64 conditions), 1,000 `in` values
    assert len(at_caps) == 16
    body = {"namespace_prefix": [], "filter": at_caps, **({"query": query} if query else {})}
    response = alice.post(SEARCH, body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["items"] == []  # no such attributes: nothing matches, nothing fails


def test_search_rejects_malformed_json(alice):
    assert_validation_error(alice.post(SEARCH, '{"namespace_prefix": [', content_type="application/json"), "body")


def test_search_limit_and_offset_bounds_are_inclusive(alice):
    put_ok(alice, ["user", "alice"], "k")

    assert search(alice, [], limit=1).status_code == 200
    assert search(alice, [], limit=100).status_code == 200
    assert search(alice, [], offset=0).status_code == 200
    assert search(alice, [], offset=10000).json() == {"items": []}


def test_bad_filter_is_400_for_non_admins_too(bob):
    # The caller's filter is validated even though the policy ANDs its own.
    assert_validation_error(search(bob, [], filter={"sub": {"nope": 1}}), "filter.sub.nope")


# --- namespaces query ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"max_depth": "0"}, "max_depth"),
        ({"max_depth": "-1"}, "max_depth"),
        ({"max_depth": "x"}, "max_depth"),
        ({"max_depth": "1.5"}, "max_depth"),
        ({"prefix": ["user", ""]}, "prefix"),
        ({"suffix": [""]}, "suffix"),
        # Found by the fuzzer (tests/fuzz): an empty value is malformed, not absent; no segment exceeds 256.
        ({"max_depth": ""}, "max_depth"),
        ({"prefix": ["x" * 257]}, "prefix"),
        ({"suffix": ["x" * 257]}, "suffix"),
    ],
)
def test_namespaces_reject_bad_query(bob, params, field):
    assert_validation_error(bob.get(url(NAMESPACES, **params)), field)


@pytest.mark.parametrize("max_depth", ["2147483647", "2147483648", "99999999999999999999"])
def test_namespaces_huge_max_depth_truncates_nothing(bob, max_depth):
    put_ok(bob, ["user", "bob", "a"], "k")

    assert bob.get(url(NAMESPACES, max_depth=max_depth)).json() == {"namespaces": [["user", "bob", "a"]]}


# --- events query -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"limit": "-5"}, "limit"),
        ({"kinds": "add,created"}, "kinds"),
        ({"kinds": ["add", "ADD"]}, "kinds"),
        ({"kinds": "added"}, "kinds"),
        ({"after": "yesterday"}, "after"),
        ({"after": "2024-13-01T00:00:00Z"}, "after"),
        ({"before": "2024-01-01T25:00:00Z"}, "before"),
        ({"before": "1700000000"}, "before"),
        ({"after_cursor": "not a cursor!"}, "after_cursor"),
        ({"after_cursor": "e30"}, "after_cursor"),  # base64url of "{}"
        ({"after_cursor": "WyJ4IiwieSJd"}, "after_cursor"),  # ["x","y"]: not a position of ours
        ({"after_cursor": "W3RydWUsInkiXQ"}, "after_cursor"),  # [true,"y"]
        ({"after": "9999-12-31T23:59:59-23:59"}, "after"),
        ({"before": "0001-01-01T00:00:00+23:59"}, "before"),
        ({"ns": ["user", ""]}, "ns"),
        # Found by the fuzzer (tests/fuzz): an empty value is malformed, not absent; no segment exceeds 256.
        ({"limit": ""}, "limit"),
        ({"after": ""}, "after"),
        ({"before": ""}, "before"),
        ({"ns": ["x" * 257]}, "ns"),
    ],
)
def test_events_reject_bad_query(bob, params, field):
    assert_validation_error(bob.get(url(EVENTS, **params)), field)


def test_events_limit_bounds_are_inclusive(bob):
    assert bob.get(url(EVENTS, limit=1)).status_code == 200
    assert bob.get(url(EVENTS, limit=200)).status_code == 200


def test_events_accept_a_date_only_bound(bob):
    put_ok(bob, NS, "k")

    assert len(bob.get(url(EVENTS, after="2000-01-01")).json()["events"]) == 1
    assert bob.get(url(EVENTS, before="2000-01-01")).json()["events"] == []


# --- The serializers' fast paths (issue 12) ------------------------------------------------------------------------
# plainly_valid_address / plainly_valid_search skip the serializer for input it plainly accepts. Whatever they accept
# must be exactly what the serializer returns; whatever they refuse goes through the serializer (whose answer stands).

_LONG = "s" * 257
ADDRESS_CASES = [
    (NS, "k"),
    (["user"], "k"),
    (NS, ""),
    (NS, None),
    ([], "k"),
    (["user", ""], "k"),
    (["user", _LONG], "k"),
    (["user", "a\x00b"], "k"),
    (NS, "a\x00b"),
    (["user", "\ud800"], "k"),
    (["a", "b", "c", "d", "e", "f"], "k"),
    (NS, " spaced key "),
    (NS, "k" * 1024),
    (NS, "k" * 1025),
    (NS, "é" * 513),
    ([" spaced ", "segment"], "k"),
]


@pytest.mark.parametrize(("ns", "key"), ADDRESS_CASES)
def test_address_fast_path_agrees_with_the_serializer(ns, key):
    from apps.memories import serializers

    data = {"ns": ns} if key is None else {"ns": ns, "key": key}
    serializer = serializers.MemoryAddressSerializer(data=data)
    if serializers.plainly_valid_address(ns, key):
        assert serializer.is_valid(), serializer.errors
        assert (serializer.validated_data["ns"], serializer.validated_data["key"]) == (ns, key)


SEARCH_CASES = [
    {"namespace_prefix": ["user", "bob"]},
    {"namespace_prefix": ["user", "bob"], "limit": 10, "offset": 0},
    {"namespace_prefix": [], "filter": {"sub": "bob"}},
    {"namespace_prefix": ["user"], "filter": [1, 2], "limit": "x", "offset": 1.5},
    {"namespace_prefix": ["user"], "query": "coffee"},
    {"namespace_prefix": ["user"], "query": " coffee "},
    {"namespace_prefix": ["user"], "query": ""},
    {"namespace_prefix": ["user"], "query": "q" * 8193},
    {"namespace_prefix": ["user"], "query": 12},
    {"namespace_prefix": ["user"], "filter": None},
    {"namespace_prefix": ["user"], "limit": None},
    {"namespace_prefix": ["user", ""]},
    {"namespace_prefix": ["user", _LONG]},
    {"namespace_prefix": ["user", 3]},
    {"namespace_prefix": ["user", "a\x00"]},
    {"namespace_prefix": "user"},
    {"namespace_prefix": None},
    {},
    {"namespace_prefix": ["user"], "unknown": 1},
    [],
]


@pytest.mark.parametrize("data", SEARCH_CASES)
def test_search_fast_path_agrees_with_the_serializer(data):
    from apps.memories import serializers

    fast = serializers.plainly_valid_search(data)
    if fast is not None:
        serializer = serializers.MemorySearchSerializer(data=data)
        assert serializer.is_valid(), serializer.errors
        assert dict(serializer.validated_data) == fast


def test_fast_paths_take_the_common_requests():
    from apps.memories import serializers

    assert serializers.plainly_valid_address(NS, "k")
    body = {"namespace_prefix": ["user", "bob"], "limit": 10}
    assert serializers.plainly_valid_search(body) == body
