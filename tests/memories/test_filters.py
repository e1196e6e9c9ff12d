"""The filter compiler and namespace matcher (apps.memories.filters), run against the real PostgreSQL, and typed
attribute filtering end to end through a custom attributes policy."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection

from apps.core.db.prepared import bound_cursor
from apps.core.errors import ApiError
from apps.memories import filters
from tests.memories.conftest import COPY_ATTRIBUTES_REGO, assert_validation_error, put_ok, search, search_keys

pytestmark = pytest.mark.django_db


def matches(raw_filter: Any, attributes: Any) -> bool:
    """Run the compiled filter against one literal jsonb value (None: SQL NULL attributes), with its parameters
    bound server-side (attribute search, namespaces and events) and client-side (Django's cursor: semantic search);
    both must agree."""
    sql, params = filters.to_sql(filters.parse_filter(raw_filter), "t.attributes")
    statement = f"SELECT coalesce(({sql}), false) FROM (SELECT %s::jsonb AS attributes) t"
    params = [*params, None if attributes is None else json.dumps(attributes)]
    with bound_cursor() as cursor:
        cursor.execute(statement, params)
        bound = cursor.fetchone()[0]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        quoted = cursor.fetchone()[0]
    assert bound is quoted, (raw_filter, attributes)
    return bound


def prefix_matches(prefix: list[str], namespace: list[str], sql_for: Any = filters.namespace_prefix_sql) -> bool:
    sql, params = sql_for(prefix, "t.ns")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT ({sql}) FROM (SELECT %s::text[] AS ns) t", [*params, namespace])
        return cursor.fetchone()[0]


def suffix_matches(suffix: list[str], namespace: list[str]) -> bool:
    sql, params = filters.namespace_suffix_sql(suffix, "t.ns")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT ({sql}) FROM (SELECT %s::text[] AS ns) t", [*params, namespace])
        return cursor.fetchone()[0]


def parse_error_fields(raw: Any) -> dict[str, str]:
    with pytest.raises(ApiError) as caught:
        filters.parse_filter(raw)
    assert caught.value.status == 400
    assert caught.value.code == "validation_error"
    return caught.value.details["fields"]


# --- parse_filter ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([], "filter"),
        ("x", "filter"),
        (5, "filter"),
        ({"": 1}, "filter"),
        ({"a": {}}, "filter.a"),
        ({"a": [1]}, "filter.a"),
        ({"a": {"ne": 1}}, "filter.a.ne"),
        ({"a": {"$nin": [1]}}, "filter.a.$nin"),
        ({"a": {"IN": [1]}}, "filter.a.IN"),
        ({"a": {"in": []}}, "filter.a.in"),
        ({"a": {"in": 1}}, "filter.a.in"),
        ({"a": {"in": [[1]]}}, "filter.a.in"),
        ({"a": {"$in": [{"b": 1}]}}, "filter.a.$in"),
        ({"a": {"gt": {"b": 1}}}, "filter.a.gt"),
        ({"a": {"gt": [1]}}, "filter.a.gt"),
        ({"a": {"gt": None}}, "filter.a.gt"),
        ({"a": {"gt": False}}, "filter.a.gt"),
        ({"a": {"gt": "abc"}}, "filter.a.gt"),
        ({"a": {"gt": "2024-01-01"}}, "filter.a.gt"),
        ({"a": {"lte": "today"}}, "filter.a.lte"),
        ({"a": {"eq": [1]}}, "filter.a.eq"),
        ({"a": {"b": {"c": 1}}}, "filter.a.b"),
        ({"a": "x\x00"}, "filter.a"),
        ({"a\x00": 1}, "filter"),
        ({"\ud800": 1}, "filter"),
        ({"a": "\udfff"}, "filter.a"),
        ({"a": 2**63}, "filter.a"),
        ({"a": {"in": [-(2**63) - 1]}}, "filter.a"),
        ({"a": float("inf")}, "filter.a"),
        ({"a": {"gt": float("nan")}}, "filter.a.gt"),
        ({"a": {"gt": "2024-02-30T00:00:00Z"}}, "filter.a.gt"),
        ({"a": {"gt": "9999-12-31T23:59:59-23:59"}}, "filter.a.gt"),
        # More than MAX_OPERATORS on one attribute: named by the attribute, or by `filter` when the name cannot be
        # a key of the error body.
        ({"a": {"gt": 0, "gte": 0, "lt": 9, "lte": 9, "$gt": 1}}, "filter.a"),
        ({"a\x00": {"gt": 0, "gte": 0, "lt": 9, "lte": 9, "$gt": 1}}, "filter"),
        ({"\ud800": {"gt": 0, "gte": 0, "lt": 9, "lte": 9, "$gt": 1}}, "filter"),
    ],
)
def test_parse_filter_rejects(raw, field):
    assert list(parse_error_fields(raw)) == [field]


def test_parse_filter_accepts_the_documented_forms():
    compiled = filters.parse_filter(
        {
            "s": "x",
            "n": 3,
            "f": 1.5,
            "b": True,
            "z": None,
            "one": {"in": ["a", 1]},
            "two": {"$in": ["b"]},
            "range": {"gt": 1, "$lte": 9},
            "big": {"in": [2**63 - 1, -(2**63)]},
            "when": {"gte": "2024-01-01T00:00:00Z"},
            "eq": {"$eq": "y"},
        }
    )

    by_field = {c.field: c for c in compiled.conditions}
    assert by_field["s"].has_equals and by_field["s"].equals == "x"
    assert by_field["z"].has_equals and by_field["z"].equals is None
    assert by_field["one"].one_of == ("a", 1)
    assert by_field["two"].one_of == ("b",)
    assert by_field["range"].ranges == (("gt", 1), ("lte", 9))
    assert by_field["when"].ranges == (("gte", datetime(2024, 1, 1, tzinfo=UTC)),)
    assert by_field["eq"].has_equals and by_field["eq"].equals == "y"


def test_parse_filter_of_none_and_empty_is_no_condition():
    assert not filters.parse_filter(None)
    assert not filters.parse_filter({})
    assert filters.to_sql(filters.parse_filter({}), "attributes") == ("TRUE", [])


def test_parse_filter_names_the_policy_filter_when_asked():
    with pytest.raises(ApiError) as caught:
        filters.parse_filter({"a": {"bad": 1}}, where="policy.attribute_filter")
    assert list(caught.value.details["fields"]) == ["policy.attribute_filter.a.bad"]


def test_merge_ands_conditions():
    merged = filters.merge(filters.parse_filter({"a": 1}), filters.parse_filter({"a": 2, "b": 3}))

    assert [c.field for c in merged.conditions] == ["a", "a", "b"]
    assert matches({"a": 1}, {"a": 1, "b": 3})
    assert not matches({"a": 1, "b": 3}, {"a": 2, "b": 3})


def _merged_matches(first: Any, second: Any, attributes: Any) -> bool:
    merged = filters.merge(filters.parse_filter(first), filters.parse_filter(second))
    sql, params = filters.to_sql(merged, "t.attributes")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(({sql}), false) FROM (SELECT %s::jsonb AS attributes) t", [*params, json.dumps(attributes)])
        return cursor.fetchone()[0]


@pytest.mark.parametrize(
    ("first", "second", "attributes", "expected"),
    [
        ({"a": 1}, {"b": 2}, {"a": 1, "b": 2}, True),  # folded into one containment
        ({"a": 1}, {"a": 2}, {"a": 1}, False),  # one field, two values: never both
        ({"a": True}, {"a": 1}, {"a": True}, False),  # equal in Python, different in JSON
        ({"a": True}, {"a": 1}, {"a": 1}, False),
        ({"a": 9}, {"a": 9.0}, {"a": 9}, True),  # the same number
    ],
)
def test_merged_equalities_keep_every_condition(first, second, attributes, expected):
    assert _merged_matches(first, second, attributes) is expected


# --- to_sql semantics -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "attributes", "expected"),
    [
        # equality is type-exact
        ({"a": "x"}, {"a": "x"}, True),
        ({"a": "x"}, {"a": "X"}, False),
        ({"a": "x"}, {"b": "x"}, False),
        ({"a": 9}, {"a": 9}, True),
        ({"a": 9}, {"a": 9.0}, True),
        ({"a": 9}, {"a": "9"}, False),
        ({"a": "9"}, {"a": 9}, False),
        ({"a": True}, {"a": True}, True),
        ({"a": True}, {"a": 1}, False),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {}, False),
        ({"a": "x"}, {}, False),
        ({"a": "x"}, None, False),
        ({"a": "x", "b": 1}, {"a": "x", "b": 1}, True),
        ({"a": "x", "b": 1}, {"a": "x", "b": 2}, False),
        # membership
        ({"a": {"in": ["x", "y"]}}, {"a": "y"}, True),
        ({"a": {"in": ["x", "y"]}}, {"a": "z"}, False),
        ({"a": {"$in": [1, "1"]}}, {"a": 1}, True),
        ({"a": {"in": [2]}}, {"a": "2"}, False),
        ({"a": {"in": [None]}}, {"a": None}, True),
        ({"a": {"in": [None]}}, {}, False),
        ({"a": {"in": [9]}}, {"a": 9.0}, True),
        ({"a": {"in": [True]}}, {"a": 1}, False),
        ({"a": {"in": ["x"]}}, {"a": ["x"]}, False),
        ({"a": {"in": list(range(1000))}}, {"a": 999}, True),
        ({"a": {"in": list(range(1000))}}, {"a": 999.0}, True),
        ({"a": {"in": list(range(1000))}}, {"a": "999"}, False),
        ({"a": {"in": [True, *range(100)]}}, {"a": 1}, True),
        ({"a": {"in": [True, *range(2, 100)]}}, {"a": 1}, False),
        ({"a": {"in": [None, *range(100)]}}, {}, False),
        ({"a": {"in": [None, *range(100)]}}, {"a": None}, True),
        # numbers compare numerically, not as text
        ({"a": {"gt": 9}}, {"a": 10}, True),
        ({"a": {"lt": 10}}, {"a": 9}, True),
        ({"a": {"lt": 9}}, {"a": 10}, False),
        ({"a": {"$gt": 9}}, {"a": 10}, True),
        ({"a": {"gte": 10, "lte": 10}}, {"a": 10}, True),
        ({"a": {"gt": 10}}, {"a": 10}, False),
        ({"a": {"gt": 1.5}}, {"a": 2}, True),
        ({"a": {"lt": -1}}, {"a": -2.5}, True),
        ({"a": {"gt": 0, "lt": 5}}, {"a": 7}, False),
        # exactly, beyond float precision: neither as float8 (2**53 + 1 == 2.0**53) nor rounded to 15 digits
        ({"a": {"gt": 9007199254740992.0}}, {"a": 9007199254740993}, True),
        ({"a": {"gt": 9007199254740992.0}}, {"a": 9007199254740991}, False),
        ({"a": {"lt": 0.30000000000000004}}, {"a": 0.3}, True),
        # a value of another type never matches a range (and is no error)
        ({"a": {"gt": 1}}, {"a": "10"}, False),
        ({"a": {"lt": 100}}, {"a": "abc"}, False),
        ({"a": {"gt": 1}}, {"a": True}, False),
        ({"a": {"gt": 1}}, {"a": None}, False),
        ({"a": {"gt": 1}}, {}, False),
        ({"a": {"gt": 1}}, None, False),
        ({"a": {"gt": "2024-01-01T00:00:00Z"}}, {"a": 20250101}, False),
        # RFC 3339 strings compare as instants
        ({"a": {"gt": "2024-01-01T00:00:00Z"}}, {"a": "2024-06-01T00:00:00Z"}, True),
        ({"a": {"lt": "2024-01-01T00:00:00Z"}}, {"a": "2024-06-01T00:00:00Z"}, False),
        ({"a": {"gte": "2024-01-01T02:00:00+02:00"}}, {"a": "2024-01-01T00:00:00Z"}, True),
        ({"a": {"gt": "2024-01-01T02:00:00+02:00"}}, {"a": "2024-01-01T00:00:00Z"}, False),
        ({"a": {"lt": "2024-01-01T10:00:00Z"}}, {"a": "2024-01-01T09:00:00-02:00"}, False),
        ({"a": {"gt": "2024-01-01T00:00:00.5Z"}}, {"a": "2024-01-01T00:00:00.75Z"}, True),
        ({"a": {"gt": "2024-01-01T00:00:00z"}}, {"a": "2024-01-02t00:00:00z"}, True),
        ({"a": {"gt": "2024-01-01T00:00:00Z"}}, {"a": "2025-01-01"}, False),
        ({"a": {"gt": "2024-01-01T00:00:00Z"}}, {"a": "today"}, False),
        ({"a": {"gt": "2024-01-01T00:00:00Z"}}, {"a": "2024-13-45T99:00:00Z"}, False),
        ({"a": {"gt": "2024-01-01T00:00:00Z"}}, {"a": 5}, False),
    ],
)
def test_to_sql_semantics(raw, attributes, expected):
    assert matches(raw, attributes) is expected


def test_to_sql_binds_every_value_as_a_parameter():
    raw = {"a'; DROP TABLE memories; --": "x' OR '1'='1", "b": {"in": ["%", "_"]}, "c": {"gt": 1}}

    sql, params = filters.to_sql(filters.parse_filter(raw), "t.attributes")

    assert "DROP" not in sql and "OR '1'" not in sql and "%%" not in sql
    assert not matches(raw, {"a": "x"})
    assert matches({"a'b": "x' OR '1'='1"}, {"a'b": "x' OR '1'='1"})
    assert params


# --- namespace matching ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "namespace", "expected"),
    [
        ([], ["user", "alice"], True),
        (["user"], ["user", "alice"], True),
        (["user", "alice"], ["user", "alice"], True),
        (["user", "alice"], ["user", "alice", "notes"], True),
        (["user", "alice"], ["user", "alice2"], False),
        (["user", "al"], ["user", "alice"], False),
        (["user", "alice", "notes"], ["user", "alice"], False),
        (["alice"], ["user", "alice"], False),
        (["alice", "user"], ["user", "alice"], False),
        (["notes"], ["user", "alice", "notes"], False),
        (["user", "a%"], ["user", "ab"], False),
        (["user", "%"], ["user", "ab"], False),
        (["user", "a_"], ["user", "ab"], False),
        (["user", "a\\%"], ["user", "a%"], False),
        (["user", "a\\b"], ["user", "a\\b"], True),
        (["user", "a\\\\b"], ["user", "a\\b"], False),
        (["user", "a.*"], ["user", "ab"], False),
        (["user", "a"], ["user", "a/b"], False),
        (["user", "a/b"], ["user", "a/b"], True),
        (["user", "a,b"], ["user", "a", "b"], False),
        (["user", "{a}"], ["user", "{a}"], True),
        (["user", '"'], ["user", '"'], True),
        (["user", "NULL"], ["user", "NULL"], True),
        (["ü"], ["ü", "x"], True),
        (["u"], ["ü"], False),
        (["User"], ["user"], False),
        (["user", "alice"], ["alice", "user"], False),
        (["a", "a"], ["a", "b", "a"], False),
    ],
)
def test_namespace_prefix_sql_and_python_agree(prefix, namespace, expected):
    assert prefix_matches(prefix, namespace) is expected
    # The events page's form (namespace[1:2] = owner, then the rest) means the same.
    assert prefix_matches(prefix, namespace, filters.owner_prefix_sql) is expected
    assert filters.namespace_has_prefix(namespace, prefix) is expected


def test_namespace_prefix_sql_without_prefix_is_true():
    assert filters.namespace_prefix_sql([], "ns") == ("TRUE", [])


@pytest.mark.parametrize(
    ("suffix", "namespace", "expected"),
    [
        ([], ["user", "alice"], True),
        (["alice"], ["user", "alice"], True),
        (["user", "alice"], ["user", "alice"], True),
        (["x", "user", "alice"], ["user", "alice"], False),
        (["notes"], ["user", "alice", "notes"], True),
        (["alice"], ["user", "alice", "notes"], False),
        (["ice"], ["user", "alice"], False),
        (["%"], ["user", "alice"], False),
        (["a_ice"], ["user", "alice"], False),
        (["alice", "notes"], ["user", "alice", "notes"], True),
        (["bob", "notes"], ["user", "alice", "notes"], False),
    ],
)
def test_namespace_suffix_sql(suffix, namespace, expected):
    assert suffix_matches(suffix, namespace) is expected


# --- typed filters end to end ------------------------------------------------------------------------------------------


@pytest.fixture
def typed(policy_dir, alice, bob):
    """bob's records with attributes copied from their values by a custom attributes policy."""
    policy_dir(attributes=COPY_ATTRIBUTES_REGO)
    values = {
        "n9": {"n": 9, "at": "2024-01-09T00:00:00Z", "tag": "x"},
        "n10": {"n": 10, "at": "2024-01-10T00:00:00Z", "tag": "y"},
        "n100": {"n": 100, "at": "2024-03-01T12:00:00+02:00", "tag": "x"},
        "text": {"n": "50", "at": "soon", "tag": "z"},
        "none": {"tag": 1},
    }
    for key, value in values.items():
        assert put_ok(bob, ["user", "bob"], key, value)["attributes"] == {"namespace": "user", "sub": "bob", **value}
    return alice


TYPED_CASES = [
    ({"n": {"gt": 9}}, ["n10", "n100"]),
    ({"n": {"lt": 10}}, ["n9"]),
    ({"n": {"$gt": 9, "$lt": 100}}, ["n10"]),
    ({"n": {"gte": 10, "lte": 100}}, ["n10", "n100"]),
    ({"n": {"lt": 1000}}, ["n10", "n100", "n9"]),
    ({"n": 10}, ["n10"]),
    ({"n": "50"}, ["text"]),
    ({"n": {"in": [9, "50"]}}, ["n9", "text"]),
    ({"n": {"$in": [100]}}, ["n100"]),
    ({"n": {"$eq": 9}}, ["n9"]),
    ({"at": {"gt": "2024-01-09T12:00:00Z"}}, ["n10", "n100"]),
    ({"at": {"lt": "2024-03-01T09:00:00Z"}}, ["n10", "n9"]),
    ({"at": {"lt": "2024-03-01T11:00:00Z"}}, ["n10", "n100", "n9"]),
    ({"at": {"gte": "2024-03-01T10:00:00Z", "lte": "2024-03-01T10:00:00Z"}}, ["n100"]),
    ({"tag": "x", "n": {"gt": 9}}, ["n100"]),
    ({"tag": {"in": ["y", "z"]}}, ["n10", "text"]),
    ({"tag": 1}, ["none"]),
    ({"tag": "1"}, []),
    ({"missing": {"gt": 0}}, []),
]


def test_typed_attribute_filters(typed):
    # One data set for all cases (each policy directory and its five writes cost more than the searches).
    for raw, expected in TYPED_CASES:
        assert search_keys(typed, ["user", "bob"], filter=raw) == expected, raw


def test_non_admin_typed_filter_is_anded_with_the_policy_filter(typed, bob, client_for):
    assert search_keys(bob, [], filter={"n": {"gt": 9}}) == ["n10", "n100"]
    assert search_keys(client_for("charlie"), [], filter={"n": {"gt": 9}}) == []


def test_typed_filter_errors_are_400_through_http(typed):
    assert_validation_error(search(typed, [], filter={"n": {"gt": "nine"}}), "filter.n.gt")
    assert_validation_error(search(typed, [], filter={"n": {"between": [1, 2]}}), "filter.n.between")
