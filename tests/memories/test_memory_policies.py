"""Memory access through the Rego policies: the built-in default matrix over HTTP, custom policy directories, and
segment-exact namespace matching."""

from __future__ import annotations

import pytest

from apps.memories.models import Memory
from tests.memories.conftest import (
    EVENTS,
    NAMESPACES,
    assert_denied,
    assert_error,
    counts,
    delete,
    event_kinds,
    events,
    get,
    namespaces,
    put,
    put_ok,
    search,
    search_items,
    search_keys,
    url,
)

pytestmark = pytest.mark.django_db


# --- built-in default: direct access -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace",
    [["user", "bob"], ["user", "bob", "notes"], ["user", "bob", "a", "b", "c"]],
)
def test_own_namespace_allows_write_read_delete(bob, namespace):
    assert put(bob, namespace, "k", {"v": 1}).status_code == 200
    response = get(bob, namespace, "k")
    assert response.status_code == 200
    assert response.json()["value"] == {"v": 1} and response.json()["namespace"] == namespace
    assert delete(bob, namespace, "k").status_code == 204
    assert get(bob, namespace, "k").status_code == 404


@pytest.mark.parametrize(
    "namespace",
    [
        ["user", "alice"],
        ["user", "alice", "notes"],
        ["user", "bobby"],
        ["user", "BOB"],
        ["shared", "team"],
        ["bob", "user"],
        ["user"],
        ["bob"],
    ],
)
def test_other_namespaces_deny_write_read_delete(bob, namespace):
    assert_denied(put(bob, namespace, "k", {"v": 1}))
    assert_denied(get(bob, namespace, "k"))
    assert_denied(delete(bob, namespace, "k"))
    assert counts() == (0, 0)


def test_denied_read_of_an_existing_record_reveals_nothing(alice, bob):
    put_ok(alice, ["user", "alice"], "secret", {"s": "top-secret"})

    body = assert_denied(get(bob, ["user", "alice"], "secret"))
    missing = assert_denied(get(bob, ["user", "alice"], "no-such-key"))

    assert "top-secret" not in str(body)
    assert {k: v for k, v in body.items() if k != "requestId"} == {k: v for k, v in missing.items() if k != "requestId"}


def test_denied_delete_leaves_the_record(alice, bob):
    put_ok(alice, ["user", "alice"], "k")

    assert_denied(delete(bob, ["user", "alice"], "k"))

    assert get(alice, ["user", "alice"], "k").status_code == 200
    assert event_kinds(alice, ns=["user", "alice"]) == [("add", "k")]


def test_admin_role_does_not_bypass_authz_for_direct_access(alice, bob):
    put_ok(bob, ["user", "bob"], "k", {"v": 1})

    assert_denied(get(alice, ["user", "bob"], "k"))
    assert_denied(put(alice, ["user", "bob"], "k", {"v": 2}))
    assert_denied(delete(alice, ["user", "bob"], "k"))
    assert get(bob, ["user", "bob"], "k").json()["value"] == {"v": 1}


# --- built-in default: search, namespaces and events scoping -------------------------------------------------------


@pytest.fixture
def two_users(alice, bob):
    put_ok(alice, ["user", "alice", "notes"], "a1")
    put_ok(bob, ["user", "bob", "notes"], "b1")
    put_ok(bob, ["user", "bob", "todo"], "b2")


def test_admin_search_keeps_the_requested_prefix(alice, two_users):
    assert search_keys(alice, ["user", "bob"]) == ["b1", "b2"]
    assert search_keys(alice, ["user", "bob", "todo"]) == ["b2"]
    assert search_keys(alice, []) == ["a1", "b1", "b2"]
    assert search_keys(alice, ["user"]) == ["a1", "b1", "b2"]


@pytest.mark.parametrize("prefix", [[], ["user"], ["user", "bob"]])
def test_user_search_above_or_at_own_subtree_sees_only_own(bob, two_users, prefix):
    assert search_keys(bob, prefix) == ["b1", "b2"]


@pytest.mark.parametrize("prefix", [["user", "alice"], ["user", "alice", "notes"], ["shared"], ["user", "bo"]])
def test_user_search_outside_own_subtree_sees_nothing(bob, two_users, prefix):
    assert search_items(bob, prefix) == []


def test_user_search_inside_own_subtree_keeps_the_narrower_prefix(bob, two_users):
    assert search_keys(bob, ["user", "bob", "todo"]) == ["b2"]


def test_policy_attribute_filter_is_anded_with_the_callers(bob, two_users):
    # A caller filter naming alice cannot widen bob's scope: both conditions must hold.
    assert search_items(bob, [], filter={"sub": "alice"}) == []
    assert search_keys(bob, [], filter={"sub": "bob"}) == ["b1", "b2"]


def test_the_configured_admin_role_is_the_admin_of_the_built_in_filter(client_for, settings, alice, two_users):
    # Issue 21.21: with ADMIN_ROLE=boss, "boss" widens search and lists, and "admin" is an ordinary role.
    settings.ADMIN_ROLE = "boss"
    boss = client_for("dave", roles=("user", "boss"))
    assert search_keys(boss, ["user", "bob"]) == ["b1", "b2"]
    assert namespaces(boss, prefix=["user", "bob"]) == [["user", "bob", "notes"], ["user", "bob", "todo"]]
    assert search_items(alice, ["user", "bob"]) == []  # alice holds "admin", no longer the admin role
    assert search_keys(alice, []) == ["a1"]


def test_a_custom_filter_leaving_a_rule_undefined_fails_closed(policy_dir, bob, two_users):
    # Issue 21.22: attribute_filter undefined read as "no attribute filter", namespace_prefix undefined as "keep
    # the requested prefix": bob saw alice's memories. Now a policy_error.
    policy_dir(
        filter="""
        package memories.filter

        import rego.v1

        namespace_prefix := ["user", input.context.user_id] if input.namespace_prefix == []
        attribute_filter := {"sub": input.context.user_id} if input.namespace_prefix == []
        """
    )
    assert search_keys(bob, []) == ["b1", "b2"]
    for prefix in (["user", "alice"], ["user"]):
        assert_error(search(bob, prefix), 500, "policy_error")
    assert_error(bob.get(url(NAMESPACES, prefix=["user", "alice"])), 500, "policy_error")
    assert_error(bob.get(url(EVENTS, ns=["user", "alice"])), 500, "policy_error")


def test_admin_namespaces_keep_the_requested_prefix(alice, two_users):
    assert namespaces(alice) == [["user", "alice", "notes"], ["user", "bob", "notes"], ["user", "bob", "todo"]]
    assert namespaces(alice, prefix=["user", "bob"]) == [["user", "bob", "notes"], ["user", "bob", "todo"]]


def test_user_namespaces_are_narrowed_to_own_subtree(bob, charlie, two_users):
    assert namespaces(bob) == [["user", "bob", "notes"], ["user", "bob", "todo"]]
    assert namespaces(bob, prefix=["user"]) == [["user", "bob", "notes"], ["user", "bob", "todo"]]
    assert namespaces(bob, prefix=["user", "alice"]) == []
    assert namespaces(bob, max_depth=1) == [["user"]]
    assert namespaces(bob, suffix=["notes"]) == [["user", "bob", "notes"]]
    assert namespaces(charlie) == []


def test_user_events_are_narrowed_to_own_subtree(alice, bob, charlie, two_users):
    delete(alice, ["user", "alice", "notes"], "a1")

    assert event_kinds(bob) == [("add", "b1"), ("add", "b2")]
    assert event_kinds(bob, ns=["user"]) == [("add", "b1"), ("add", "b2")]
    assert event_kinds(bob, ns=["user", "alice"]) == []
    assert event_kinds(bob, ns=["user", "alice"], kinds="delete") == []
    assert event_kinds(charlie) == []


def test_admin_events_keep_the_requested_prefix(alice, two_users):
    delete(alice, ["user", "alice", "notes"], "a1")

    assert event_kinds(alice, ns=["user", "bob"]) == [("add", "b1"), ("add", "b2")]
    assert event_kinds(alice) == [("add", "a1"), ("add", "b1"), ("add", "b2"), ("delete", "a1")]


def test_events_of_one_owner_exclude_owners_whose_names_extend_it(alice, bob, client_for, two_users):
    bobby = client_for("bobby")
    put_ok(bobby, ["user", "bobby", "notes"], "y1")
    put_ok(bob, ["user", "bob", "notes"], "b3")

    assert event_kinds(bob) == [("add", "b1"), ("add", "b2"), ("add", "b3")]
    assert event_kinds(bobby) == [("add", "y1")]
    assert event_kinds(alice, ns=["user", "bob"]) == [("add", "b1"), ("add", "b2"), ("add", "b3")]
    assert event_kinds(alice, ns=["user", "bo"]) == []
    assert event_kinds(alice, ns=["user"]) == [("add", "a1"), ("add", "b1"), ("add", "b2"), ("add", "y1"), ("add", "b3")]
    # Paging one owner's timeline past another owner's events in between, with the cursor.
    first = events(alice, ns=["user", "bob"], limit=2)
    rest = events(alice, ns=["user", "bob"], limit=2, after_cursor=first["after_cursor"])
    assert [e["key"] for e in first["events"] + rest["events"]] == ["b1", "b2", "b3"]


def test_user_sees_own_delete_events(bob, two_users):
    delete(bob, ["user", "bob", "notes"], "b1")

    assert event_kinds(bob, kinds="delete") == [("delete", "b1")]


def test_role_list_comes_from_the_token(client_for, two_users):
    # "admin" as a role makes any user an admin for search; without it, alice is confined like anyone else.
    assert search_keys(client_for("dave", roles=["user", "admin"]), ["user", "bob"]) == ["b1", "b2"]
    assert search_keys(client_for("alice", roles=["user"]), []) == ["a1"]


# --- custom policy directory --------------------------------------------------------------------------------------

SHARED_AUTHZ_REGO = """
    package memories.authz

    import rego.v1

    default decision := {"allow": false, "reason": "not your namespace"}

    decision := {"allow": true} if {
        count(input.namespace) >= 2
        input.namespace[0] == "user"
        input.namespace[1] == input.context.user_id
    }

    decision := {"allow": true} if {
        count(input.namespace) >= 2
        input.namespace[0] == "shared"
    }
"""

TEAM_ATTRIBUTES_REGO = """
    package memories.attributes

    import rego.v1

    base := {"namespace": input.namespace[0], "sub": input.namespace[1]} if count(input.namespace) >= 2

    default team := "none"

    team := input.value.team if is_string(input.value.team)

    team := input.namespace[1] if {
        not is_string(input.value.team)
        input.namespace[0] == "shared"
    }

    attributes := object.union(base, {"team": team})
"""


@pytest.fixture
def shared_policies(policy_dir):
    return policy_dir(authz=SHARED_AUTHZ_REGO, attributes=TEAM_ATTRIBUTES_REGO)


def test_custom_authz_allows_the_shared_namespace(shared_policies, bob, charlie):
    put_ok(bob, ["shared", "x"], "doc", {"v": 1})

    body = get(charlie, ["shared", "x"], "doc").json()
    assert body["value"] == {"v": 1}
    assert body["attributes"] == {"namespace": "shared", "sub": "x", "team": "x"}
    assert delete(charlie, ["shared", "x"], "doc").status_code == 204


def test_custom_authz_deny_carries_the_policy_reason(shared_policies, bob):
    response = put(bob, ["user", "alice"], "k", {"v": 1})

    body = assert_error(response, 403, "forbidden")
    assert body["reason"] == "not your namespace"
    assert counts() == (0, 0)
    # The other policies still come from the built-ins: one-segment namespaces stay denied.
    assert assert_error(get(bob, ["shared"], "k"), 403, "forbidden")["reason"] == "not your namespace"


def test_custom_attributes_policy_derives_team(shared_policies, bob):
    written = put_ok(bob, ["user", "bob"], "k", {"team": "y"})

    assert written["attributes"] == {"namespace": "user", "sub": "bob", "team": "y"}
    assert put_ok(bob, ["user", "bob"], "plain", {"v": 1})["attributes"] == {
        "namespace": "user",
        "sub": "bob",
        "team": "none",
    }


def test_search_by_policy_derived_attribute(shared_policies, alice, bob, charlie):
    put_ok(bob, ["user", "bob"], "bob-x", {"team": "x"})
    put_ok(bob, ["user", "bob"], "bob-y", {"team": "y"})
    put_ok(charlie, ["user", "charlie"], "charlie-x", {"team": "x"})
    put_ok(charlie, ["shared", "x"], "shared-x", {})
    put_ok(charlie, ["shared", "y"], "shared-y", {})

    # The built-in filter.rego still confines users to their own subtree.
    assert search_keys(bob, [], filter={"team": "x"}) == ["bob-x"]
    assert search_keys(charlie, [], filter={"team": "x"}) == ["charlie-x"]
    assert search_items(bob, ["shared"], filter={"team": "x"}) == []
    # An admin keeps the prefix and gets no policy filter.
    assert search_keys(alice, [], filter={"team": "x"}) == ["bob-x", "charlie-x", "shared-x"]
    assert search_keys(alice, ["shared"], filter={"team": "x"}) == ["shared-x"]
    assert search_keys(alice, [], filter={"team": {"in": ["y", "none"]}}) == ["bob-y", "shared-y"]


def test_custom_filter_policy_replaces_the_prefix(policy_dir, alice, bob):
    put_ok(bob, ["user", "bob", "public"], "pub")
    put_ok(bob, ["user", "bob", "private"], "priv")
    policy_dir(
        filter="""
        package memories.filter

        import rego.v1

        namespace_prefix := ["user", "bob", "public"]

        attribute_filter := {}
        """
    )

    assert search_keys(alice, []) == ["pub"]
    assert search_keys(alice, ["user", "bob", "private"]) == ["pub"]
    assert namespaces(alice) == [["user", "bob", "public"]]


def test_policy_evaluation_error_is_500_and_never_an_allow(policy_dir, bob):
    policy_dir(
        authz="""
        package memories.authz

        import rego.v1

        decision := {"allow": true} if input.key == "k"
        decision := {"allow": false} if input.key == "k"
        """
    )

    response = put(bob, ["user", "bob"], "k", {"v": 1})

    assert_error(response, 500, "policy_error")
    assert Memory.objects.count() == 0


@pytest.mark.parametrize(
    "attributes",
    [
        '{"team": {"name": "x"}}',  # not a scalar
        '{"team": ["x"]}',
        '["x"]',  # not an object
        '{"team": "a\\u0000b"}',  # jsonb holds no NUL: a database error before (issue 21.20)
        '{"te\\u0000am": 1}',
    ],
)
def test_attributes_the_store_cannot_hold_are_a_policy_error_and_nothing_is_written(policy_dir, bob, attributes):
    policy_dir(attributes=f"package memories.attributes\nimport rego.v1\nattributes := {attributes}\n")
    response = put(bob, ["user", "bob"], "k", {"v": 1})
    assert_error(response, 500, "policy_error")
    assert counts() == (0, 0)


# --- segment-exact namespace matching -------------------------------------------------------------------------------


def test_prefix_does_not_match_a_longer_segment(client_for, alice):
    put_ok(alice, ["user", "alice"], "mine")
    put_ok(client_for("alice2"), ["user", "alice2"], "theirs")

    assert search_keys(alice, ["user", "alice"]) == ["mine"]
    assert search_keys(alice, ["user", "alice2"]) == ["theirs"]
    assert search_items(alice, ["user", "ali"]) == []
    assert namespaces(alice, prefix=["user", "alice"]) == [["user", "alice"]]
    assert event_kinds(alice, ns=["user", "alice"]) == [("add", "mine")]


def test_user_alice2_cannot_see_alice(client_for, alice):
    alice2 = client_for("alice2")
    put_ok(alice, ["user", "alice"], "mine")
    put_ok(alice2, ["user", "alice2"], "theirs")

    assert search_keys(alice2, []) == ["theirs"]
    assert search_items(alice2, ["user", "alice"]) == []
    assert namespaces(alice2) == [["user", "alice2"]]
    assert_denied(get(alice2, ["user", "alice"], "mine"))


PATTERN_PROBES = [
    # (stored segment, prefix segment that must NOT match it)
    ("ab", "a%"),
    ("abc", "a%"),
    ("ab", "a_"),
    ("ab", "_b"),
    ("a\\b", "a\\\\b"),
    ("a\\b", "a"),
    ("ab", "a."),
    ("a/b", "a"),
    ("ab", "a*"),
    ("ab", "[a]b"),
    ("ab", "%"),
]


@pytest.mark.parametrize(("stored", "probe"), PATTERN_PROBES)
def test_prefix_segments_are_literal(alice, bob, stored, probe):
    put_ok(bob, ["user", "bob", stored], "k")

    assert search_items(alice, ["user", "bob", probe]) == []
    assert namespaces(alice, prefix=["user", "bob", probe]) == []
    assert event_kinds(alice, ns=["user", "bob", probe]) == []


@pytest.mark.parametrize(
    "segment",
    [
        "a%",
        "a_",
        "a.b",
        "a/b",
        "ü ñ 😀",
        " a ",
        "a\\b",
        'a"b',
    ],
)
def test_special_segments_round_trip_and_match_themselves(alice, bob, segment):
    namespace = ["user", "bob", segment]
    put_ok(bob, namespace, "k", {"v": segment})
    put_ok(bob, ["user", "bob", "other"], "k")

    assert get(bob, namespace, "k").json()["value"] == {"v": segment}
    assert [i["namespace"] for i in search_items(alice, namespace)] == [namespace]
    assert namespaces(alice, prefix=namespace) == [namespace]
    assert namespaces(alice, suffix=[segment]) == [namespace]


def test_user_ids_with_pattern_characters_are_literal(client_for, alice):
    put_ok(client_for("b%"), ["user", "b%"], "k1")
    put_ok(client_for("bx"), ["user", "bx"], "k2")

    assert search_keys(client_for("b%"), []) == ["k1"]
    assert search_keys(client_for("b_"), []) == []
    assert search_keys(alice, ["user", "b%"]) == ["k1"]


@pytest.mark.parametrize("user_id", ['q"uote', "back\\slash", "tab/slash", "uni\u00e7ode"])
def test_user_ids_with_json_special_characters_round_trip(client_for, alice, user_id):
    client = client_for(user_id)

    written = put_ok(client, ["user", user_id], "k")

    assert written["attributes"] == {"namespace": "user", "sub": user_id}
    assert get(client, ["user", user_id], "k").status_code == 200
    assert search_keys(client, []) == ["k"]
    assert namespaces(client) == [["user", user_id]]
    assert search_keys(alice, [], filter={"sub": user_id}) == ["k"]


@pytest.mark.parametrize("user_id", ["new\nline", "tab\tbed"])
def test_user_ids_with_control_characters_are_refused_at_authentication(client_for, user_id):
    # A user id becomes namespace segments, memberships and Redis keys: control characters never get that far.
    response = client_for(user_id).get("/v1/memories", {"ns": ["user", user_id], "key": "k"})

    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"


def test_user_id_with_an_escape_sequence_cannot_reach_another_users_subtree(client_for, bob):
    # "bo\\u0062" is a literal backslash-u user id; an unescaped policy result would read it as "bob".
    put_ok(bob, ["user", "bob"], "bob-secret")
    mallory = client_for("bo\\u0062")

    assert search_items(mallory, []) == []
    assert namespaces(mallory) == []
