"""D3: the cursor codec and the keyset pager (both of its row sources), over real rows in the embedded PostgreSQL.
Every list endpoint's answer to hostile cursors is tested through HTTP in tests/core/test_cursors.py."""

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from apps.core import errors, pagination
from apps.sharing.models import Membership

pytestmark = pytest.mark.django_db

TAG = "test.list"
ROOT = uuid.uuid4()
SOME_ID = "27938a27-330a-4d5b-b2b3-ec0ff080134d"  # fixed: parametrized test ids must be the same in every xdist worker
START = datetime(2026, 1, 1, tzinfo=UTC)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def assert_malformed(cursor: str, *, tag: str = TAG, kind: type = datetime, field: str = "afterCursor") -> None:
    with pytest.raises(errors.ApiError) as raised:
        pagination.decode_cursor(cursor, tag, kind, field)
    assert raised.value.status == 400
    assert raised.value.details == {"fields": {field: "malformed cursor"}}


# --- The codec ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("position", "kind"),
    [(START + timedelta(microseconds=7), datetime), (0.123456789, float), (3, float), (2**62, int), (-1, int)],
)
def test_cursor_round_trip(position, kind) -> None:
    item_id = uuid.uuid4()
    cursor = pagination.encode_cursor(TAG, position, item_id)
    assert pagination.decode_cursor(cursor, TAG, kind) == (position, item_id)
    assert str(item_id) not in cursor and "=" not in cursor  # opaque, not a bare id; unpadded base64url


def test_the_longest_cursor_the_service_makes_is_within_the_bound() -> None:
    longest_tag = "search.admin.semantic." + "f" * 16  # apps.conversations.search.cursor_tag
    for position in (-1.2345678901234567e-300, datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), -(2**63)):
        assert len(pagination.encode_cursor(longest_tag, position, uuid.uuid4())) <= pagination.MAX_CURSOR_CHARS
    with pytest.raises(ValueError):
        pagination.encode_cursor("x" * pagination.MAX_CURSOR_CHARS, 1, uuid.uuid4())


def test_cursor_of_another_list_is_400() -> None:
    cursor = pagination.encode_cursor("another.list", START, uuid.uuid4())
    assert_malformed(cursor)
    assert_malformed(cursor, field="after_cursor")


def test_over_long_cursor_is_refused_before_it_is_decoded() -> None:
    """One of ours in every respect but its length (JSON whitespace), so only the length bound refuses it."""
    padded = '["2026-01-01T00:00:00+00:00",' + " " * 300 + f'"{uuid.uuid4()}","{TAG}"]'
    cursor = b64(padded.encode())
    assert len(cursor) > pagination.MAX_CURSOR_CHARS
    assert_malformed(cursor)
    assert pagination.decode_cursor(b64(padded.replace(" " * 300, " ").encode()), TAG)[0] == START


def test_nested_cursor_is_refused_before_it_is_decoded(monkeypatch) -> None:
    """Within the length bound, so the depth bound refuses it: the JSON decoder never sees it."""
    monkeypatch.setattr(json, "loads", lambda *args, **kwargs: pytest.fail("nested JSON reached the decoder"))
    cursor = b64(b"[" * 60 + b"1" + b"]" * 60)
    assert len(cursor) <= pagination.MAX_CURSOR_CHARS
    assert_malformed(cursor)
    assert_malformed(b64(f'[{{"a": 1}}, "{uuid.uuid4()}", "{TAG}"]'.encode()))


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "!!!",
        "abc+/def",  # base64, not base64url
        "WyJ4Il0=",  # padded
        "AAAAA",  # no base64 text has this length
        "Wy\u00e9Il0",
        "Wy\x00Il0",
        b64(b'["\xff\xfe", "x", "test.list"]'),  # not UTF-8
        b64(b"not json"),
        b64(b'{"a": 1}'),
        b64(json.dumps(["2026-01-01T00:00:00+00:00", SOME_ID]).encode()),  # untagged (the old format)
        b64(json.dumps(["2026-01-01T00:00:00", SOME_ID, TAG]).encode()),  # no zone
        b64(json.dumps(["yesterday", SOME_ID, TAG]).encode()),
        b64(json.dumps([1700000000, SOME_ID, TAG]).encode()),
        b64(json.dumps(["2026-01-01T00:00:00+00:00", "not-a-uuid", TAG]).encode()),
        b64(json.dumps(["2026-01-01T00:00:00+00:00", 7, TAG]).encode()),
        b64(json.dumps(["2026-01-01T00:00:00+00:00", SOME_ID, TAG, "extra"]).encode()),
    ],
)
def test_malformed_timestamp_cursor_is_400(cursor: str) -> None:
    assert_malformed(cursor)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "true", '"1"'])
def test_score_cursor_must_be_a_finite_number(number: str) -> None:
    assert_malformed(b64(f'[{number}, "{uuid.uuid4()}", "{TAG}"]'.encode()), kind=float)


@pytest.mark.parametrize("number", ["1.5", "true", '"1"', "NaN"])
def test_sequence_cursor_must_be_an_integer(number: str) -> None:
    assert_malformed(b64(f'[{number}, "{uuid.uuid4()}", "{TAG}"]'.encode()), kind=int)


@pytest.mark.parametrize("number", [2**63, -(2**63) - 1, 10**100])
def test_sequence_cursor_must_fit_a_bigint(number: int) -> None:
    """Past a bigint no row has the position: a forged one reached the SQL as numeric, and an events page came back
    empty with the forged cursor to continue from."""
    assert pagination.decode_cursor(b64(f'[{2**63 - 1}, "{SOME_ID}", "{TAG}"]'.encode()), TAG, int)[0] == 2**63 - 1
    assert_malformed(b64(f'[{number}, "{SOME_ID}", "{TAG}"]'.encode()), kind=int)


@pytest.mark.parametrize("item_id", [str(2**63), "9" * 19])
def test_sequence_id_must_fit_a_bigint(item_id: str) -> None:
    largest = pagination.encode_cursor(TAG, 7, 2**63 - 1)
    assert pagination.decode_cursor(largest, TAG, int, id_kind=int) == (7, 2**63 - 1)
    with pytest.raises(errors.ApiError):
        pagination.decode_cursor(pagination.encode_cursor(TAG, 7, item_id), TAG, int, id_kind=int)


# --- The pager, over a QuerySet and over raw SQL -------------------------------------------------------------------


@pytest.fixture
def rows() -> list[Membership]:
    """Seven rows, oldest first by (created_at, id); three share one created_at, so the id breaks the tie."""
    times = [START, START + timedelta(seconds=1), START + timedelta(seconds=1), START + timedelta(seconds=1),
             START + timedelta(seconds=2), START + timedelta(seconds=3), START + timedelta(seconds=4)]
    made = [Membership.objects.create(root_id=ROOT, user_id=f"u{index}", access_level="reader", created_at=at)
            for index, at in enumerate(times)]
    return sorted(made, key=lambda row: (row.created_at, row.id))


def model_keyset(descending: bool = False) -> pagination.ModelKeyset:
    return pagination.ModelKeyset(Membership.objects.filter(root_id=ROOT), "created_at", descending=descending)


def sql_keyset(descending: bool = False) -> pagination.SqlKeyset:
    return pagination.SqlKeyset(
        "SELECT m.id, m.user_id, m.created_at FROM conversation_memberships m", ["m.root_id = %s"], [ROOT],
        order=("m.created_at", "m.id"), position_index=2, descending=descending,
    )


def user_of(row) -> str:
    return row.user_id if isinstance(row, Membership) else row[1]


SOURCES = pytest.mark.parametrize("source", [model_keyset, sql_keyset], ids=["queryset", "sql"])


def walk(keyset, limit: int) -> list[str]:
    seen, cursor = [], None
    while True:
        page = pagination.keyset_page(keyset, tag=TAG, cursor=cursor, limit=limit)
        seen.extend(user_of(row) for row in page.items)
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


def test_a_raw_sql_list_without_conditions_of_its_own_pages_too(rows) -> None:
    """Issue 28 item 12: with no conditions and no cursor, the statement had an empty ``WHERE``."""
    keyset = pagination.SqlKeyset(
        "SELECT m.id, m.user_id, m.created_at FROM conversation_memberships m", [], [],
        order=("m.created_at", "m.id"), position_index=2,
    )
    first = pagination.keyset_page(keyset, tag=TAG, cursor=None, limit=4)
    rest = pagination.keyset_page(keyset, tag=TAG, cursor=first.next_cursor, limit=10)
    assert [user_of(row) for row in [*first.items, *rest.items]] == [row.user_id for row in rows]


@SOURCES
def test_walks_every_item_once_in_either_direction(rows, source) -> None:
    expected = [row.user_id for row in rows]
    for limit in (1, 2, 3, 7):
        assert walk(source(), limit) == expected
        assert walk(source(descending=True), limit) == expected[::-1]


@SOURCES
def test_last_page_has_null_cursor_exactly(rows, source) -> None:
    page = pagination.keyset_page(source(), tag=TAG, cursor=None, limit=7)
    assert len(page.items) == 7 and page.next_cursor is None
    page = pagination.keyset_page(source(), tag=TAG, cursor=None, limit=6)
    assert page.next_cursor is not None
    last = pagination.keyset_page(source(), tag=TAG, cursor=page.next_cursor, limit=1)
    assert len(last.items) == 1 and last.next_cursor is None


@SOURCES
def test_cursor_continues_after_its_deleted_item(rows, source) -> None:
    page = pagination.keyset_page(source(), tag=TAG, cursor=None, limit=3)
    Membership.objects.filter(user_id=user_of(page.items[-1])).delete()  # the item the cursor points at is gone
    rest = pagination.keyset_page(source(), tag=TAG, cursor=page.next_cursor, limit=10)
    assert [user_of(row) for row in rest.items] == [row.user_id for row in rows[3:]]


@SOURCES
def test_pager_refuses_another_lists_cursor(rows, source) -> None:
    cursor = pagination.keyset_page(source(), tag="another.list", cursor=None, limit=2).next_cursor
    with pytest.raises(errors.ApiError) as raised:
        pagination.keyset_page(source(), tag=TAG, cursor=cursor, limit=2, field="after_cursor")
    assert raised.value.details == {"fields": {"after_cursor": "malformed cursor"}}


def test_a_limit_is_an_integer_within_its_lists_bounds():
    bounds = pagination.LimitBounds(default=20, maximum=200)
    assert pagination.parse_limit(None, bounds) == 20
    assert pagination.parse_limit("200", bounds) == 200
    assert pagination.parse_limit(" 7 ", bounds) == 7
    assert pagination.parse_limit(1000, pagination.LimitBounds(default=100, maximum=1000)) == 1000
    for bad in (0, 201, "", "x", True, 1.5):
        with pytest.raises(errors.ApiError) as raised:
            pagination.parse_limit(bad, bounds)
        assert raised.value.details == {"fields": {"limit": "must be an integer between 1 and 200"}}


def test_a_body_limit_is_a_json_integer():
    """A query's limit is text; a JSON body's is not: "5" there is a 400, from the same check (body_limit_field)."""
    bounds = pagination.LimitBounds(default=20, maximum=200)
    assert pagination.parse_limit(5, bounds, body=True) == 5
    with pytest.raises(errors.ApiError) as raised:
        pagination.parse_limit("5", bounds, body=True)
    assert raised.value.details == {"fields": {"limit": "must be an integer between 1 and 200"}}
