"""D4 encryption at rest, observed from outside: the database never holds a plaintext value."""

from __future__ import annotations

import base64
import os

import pytest
from django.core.management import call_command

from apps.encryption import crypto
from apps.memories.models import Memory, MemoryEvent
from tests.database import pg_dump

MARKER = "plaintext-marker-7f3a9c"


def _put(client, key: str, value: dict) -> dict:
    response = client.put("/v1/memories", {"namespace": ["user", "bob", "vault"], "key": key, "value": value}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def _get(client, key: str):
    return client.get("/v1/memories", {"ns": ["user", "bob", "vault"], "key": key})


@pytest.mark.django_db(transaction=True)  # pg_dump sees committed data only
def test_pg_dump_contains_no_plaintext_value(client_for):
    bob = client_for("bob")
    _put(bob, "secret", {"note": MARKER, "nested": {"deep": MARKER + "-deep"}})
    _put(bob, "secret", {"note": MARKER + "-v2"})  # an update: both versions and both event snapshots

    dump = pg_dump()
    assert b"COPY public.memories" in dump  # the dump really holds the table
    assert Memory.objects.count() == 2 and MemoryEvent.objects.count() == 2
    assert MARKER.encode() not in dump
    # bytea is dumped as hex: the plaintext must not be there in that form either.
    assert MARKER.encode().hex() not in dump.decode()


@pytest.mark.django_db
def test_ciphertext_copied_to_another_row_does_not_decrypt(client_for, caplog):
    bob = client_for("bob")
    _put(bob, "a", {"note": "value of a"})
    _put(bob, "b", {"note": "value of b"})
    a = Memory.objects.get(key="a")
    Memory.objects.filter(key="b").update(value_ciphertext=bytes(a.value_ciphertext))

    bob.raise_request_exception = False
    response = _get(bob, "b")
    assert response.status_code == 500
    assert response.json()["code"] == "undecryptable"  # documented, not internal_error (issue 21 item 11)
    assert b"value of a" not in response.content
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(bytes(a.value_ciphertext), purpose="memory.value", row_id=str(Memory.objects.get(key="b").id))
    assert _get(bob, "a").json()["value"] == {"note": "value of a"}


def _new_key(kid: str) -> str:
    return f"{kid}:{base64.b64encode(os.urandom(32)).decode()}"


@pytest.mark.django_db
@pytest.mark.usefixtures("own_key_rings")
def test_key_rotation_keeps_every_value_readable(client_for, settings):
    old = _new_key("old")
    settings.MEMORY_ENCRYPTION_KEYS = old
    bob = client_for("bob")
    for index in range(7):
        _put(bob, f"k{index}", {"n": index})
    assert {crypto.key_id_of(bytes(m.value_ciphertext)) for m in Memory.objects.all()} == {"old"}

    new = _new_key("new")
    settings.MEMORY_ENCRYPTION_KEYS = f"{new},{old}"
    _put(bob, "k7", {"n": 7})  # written under the new primary while old rows still use the old key
    call_command("rotate_encryption_key", "--batch-size", "3", "--no-progress", stdout=open(os.devnull, "w"))

    for model in (Memory, MemoryEvent):
        kids = {crypto.key_id_of(bytes(row.value_ciphertext)) for row in model.objects.exclude(value_ciphertext=None)}
        assert kids == {"new"}, model
    settings.MEMORY_ENCRYPTION_KEYS = new  # the old key is gone: everything must still open
    for index in range(8):
        response = _get(bob, f"k{index}")
        assert response.status_code == 200
        assert response.json()["value"] == {"n": index}
    events = bob.get("/v1/memories/events", {"limit": 200}).json()["events"]
    assert sorted(event["value"]["n"] for event in events) == list(range(8))

    # Resumable: a second run finds nothing left to do.
    before = {m.id: bytes(m.value_ciphertext) for m in Memory.objects.all()}
    call_command("rotate_encryption_key", "--no-progress", stdout=open(os.devnull, "w"))
    assert {m.id: bytes(m.value_ciphertext) for m in Memory.objects.all()} == before
