"""D3: the keyset paginator, over real rows in the embedded PostgreSQL."""

import pytest
from django.contrib.auth.models import Group

from apps.core import errors, pagination

pytestmark = pytest.mark.django_db


@pytest.fixture
def groups():
    return [Group.objects.create(name=f"g{i:02d}") for i in range(7)]


def _walk(queryset, limit, **kwargs):
    seen, cursor = [], None
    while True:
        page = pagination.keyset_page(queryset, sort_field="name", limit=limit, cursor=cursor, **kwargs)
        seen.extend(item.name for item in page.items)
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


def test_cursor_round_trip():
    cursor = pagination.encode_cursor("2026-01-01T00:00:00+00:00", "abc")
    assert pagination.decode_cursor(cursor) == ("2026-01-01T00:00:00+00:00", "abc")
    assert "abc" not in cursor  # opaque, not a bare id


def test_walks_every_item_once(groups):
    assert _walk(Group.objects.all(), 3) == [g.name for g in groups]
    assert _walk(Group.objects.all(), 3, descending=True) == [g.name for g in reversed(groups)]


def test_last_page_has_null_cursor_exactly(groups):
    page = pagination.keyset_page(Group.objects.all(), sort_field="name", limit=7, cursor=None)
    assert len(page.items) == 7 and page.next_cursor is None
    page = pagination.keyset_page(Group.objects.all(), sort_field="name", limit=6, cursor=None)
    assert page.next_cursor is not None


def test_stale_cursor_continues_after_deleted_item(groups):
    page = pagination.keyset_page(Group.objects.all(), sort_field="name", limit=3, cursor=None)
    page.items[-1].delete()  # the item the cursor points at is gone
    rest = pagination.keyset_page(Group.objects.all(), sort_field="name", limit=10, cursor=page.next_cursor)
    assert [g.name for g in rest.items] == ["g03", "g04", "g05", "g06"]


@pytest.mark.parametrize("cursor", ["!!!", "bm90IGpzb24", pagination.encode_cursor("x", "y")[:-3] + "###", "W10"])
def test_malformed_cursor_is_400(groups, cursor):
    with pytest.raises(errors.ApiError) as raised:
        pagination.keyset_page(Group.objects.all(), sort_field="name", limit=3, cursor=cursor)
    assert raised.value.status == 400
    assert raised.value.details == {"fields": {"afterCursor": "malformed cursor"}}


def test_forged_cursor_with_wrong_id_type_is_400(groups):
    cursor = pagination.encode_cursor("g01", "not-an-integer")
    with pytest.raises(errors.ApiError) as raised:
        pagination.keyset_page(Group.objects.all(), sort_field="name", limit=3, cursor=cursor)
    assert raised.value.status == 400


def test_limit_bounds_follow_the_interface_table():
    assert pagination.parse_limit(None, "conversations") == 20
    assert pagination.parse_limit("200", "conversations") == 200
    assert pagination.parse_limit(1000, "admin_conversations") == 1000
    assert pagination.parse_limit(None, "memory_events") == 50
    for bad in (0, 201, "x", True, 1.5):
        with pytest.raises(errors.ApiError):
            pagination.parse_limit(bad, "conversations")
    with pytest.raises(errors.ApiError):
        pagination.parse_limit(101, "memory_search")
