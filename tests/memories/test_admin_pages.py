"""The operator pages of the memory store look but never change: a version deleted there would skip the
memory_deleted event and leave its vectors behind."""

from __future__ import annotations

import pytest

from apps.memories.models import Memory, MemoryEvent
from tests.memories.conftest import get, put_ok

pytestmark = pytest.mark.django_db



def test_memory_admin_cannot_delete_or_edit(operator, client_for):
    bob = client_for("bob")
    put_ok(bob, ["user", "bob", "memories"], "k", {"secret": "admin-must-not-see"})
    memory = Memory.objects.get(key="k")
    events_before = MemoryEvent.objects.count()

    listing = operator.get("/admin/memories/memory/")
    assert listing.status_code == 200
    assert b"delete_selected" not in listing.content
    assert b"admin-must-not-see" not in listing.content
    page = operator.get(f"/admin/memories/memory/{memory.pk}/change/")
    assert page.status_code == 200
    assert b"admin-must-not-see" not in page.content

    assert operator.get(f"/admin/memories/memory/{memory.pk}/delete/").status_code == 403
    assert operator.post(f"/admin/memories/memory/{memory.pk}/delete/", {"post": "yes"}).status_code == 403
    bulk = operator.post("/admin/memories/memory/", {"action": "delete_selected", "_selected_action": [memory.pk],
                                                     "post": "yes"})
    assert bulk.status_code in (200, 302)
    assert operator.post(f"/admin/memories/memory/{memory.pk}/change/", {"key": "other"}).status_code == 403

    assert Memory.objects.filter(pk=memory.pk).exists()
    assert MemoryEvent.objects.count() == events_before
    assert get(bob, ["user", "bob", "memories"], "k").json()["value"] == {"secret": "admin-must-not-see"}


def test_memory_event_admin_is_read_only(operator, client_for):
    put_ok(client_for("bob"), ["user", "bob", "memories"], "k")
    event = MemoryEvent.objects.get(key="k")
    assert operator.get("/admin/memories/memoryevent/").status_code == 200
    assert operator.post(f"/admin/memories/memoryevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert MemoryEvent.objects.filter(pk=event.pk).exists()
