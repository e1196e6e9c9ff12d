"""Key rings across hosts (issue 32.2 and 32.5): /readyz fails on a host whose ring cannot decrypt what the other live
hosts write, and rotate_encryption_key refuses to promote a key some live host lacks (apps.encryption.key_rings).

Hosts are simulated in this process: each report is made under a host name and a MEMORY_ENCRYPTION_KEYS of its own,
as the heartbeat of a process on that host would make it."""

from __future__ import annotations

import base64
import os
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.encryption import crypto, key_rings
from apps.encryption.models import EncryptionKeyRing

pytestmark = pytest.mark.usefixtures("own_key_rings")

K1, K2, OTHER = (f"{kid}:{base64.b64encode(os.urandom(32)).decode()}" for kid in ("k1", "k2", "other"))
K1_ELSEWHERE = f"k1:{base64.b64encode(os.urandom(32)).decode()}"  # the same key id, other key bytes


@pytest.fixture
def host(settings, monkeypatch):
    """``host(name, keys)``: report the ring ``keys`` as host ``name``; then this test's ring is ``keys``."""

    def report(name: str, keys: str) -> key_rings.RingStatus:
        settings.MEMORY_ENCRYPTION_KEYS = keys
        monkeypatch.setattr(key_rings.socket, "gethostname", lambda: name)
        return key_rings.report()

    return report


def _ring(name: str, keys: str) -> key_rings._Ring:
    ring = crypto.parse_keyring(keys)
    return key_rings._Ring(key_rings.ring_id(ring), ring.primary, dict(ring.fingerprints), (name,))


def _restarted(keys: str) -> None:
    """Every host now runs ``keys``: the rings they ran before stop being reported and, three heartbeats later, are
    no longer live."""
    current = key_rings.ring_id(crypto.parse_keyring(keys))
    EncryptionKeyRing.objects.exclude(ring_id=current).update(seen_at="2000-01-01T00:00:00Z")


def test_a_host_that_joins_with_keys_of_its_own_is_the_one_told(host):
    assert host("a", K1).sound
    joined = host("b", OTHER)  # e.g. a generated key next to the shared database
    assert not joined.sound and joined.lacking == {"k1": ["a"]}
    assert host("a", K1).sound  # the host already serving stays sound: it need not read what b should not write
    assert host("b", f"{K1},{OTHER}").sound  # b given a's key (first: it encrypts with it) is sound


def test_promoting_a_key_before_every_host_has_it(host):
    assert host("a", K1).sound
    assert host("b", K1).sound
    promoted = host("a", f"{K2},{K1}")  # phase 1 skipped on b
    assert promoted.primary_lacking_on == ["a", "b"]  # a's processes on the old ring are live for 3 heartbeats
    EncryptionKeyRing.objects.filter(hostname="a", primary="k1").update(seen_at="2000-01-01T00:00:00Z")
    promoted = host("a", f"{K2},{K1}")
    assert promoted.sound and promoted.primary_lacking_on == ["b"]
    lagging = host("b", K1)
    assert not lagging.sound and lagging.lacking == {"k2": ["a"]}  # b cannot read what a now writes


def test_two_phase_rotation_keeps_every_host_sound(host, settings):
    for name in ("a", "b"):
        assert host(name, K1).sound
    for name in ("a", "b"):  # phase 1: the new key added everywhere, decrypt-only
        assert host(name, f"{K1},{K2}").sound
    _restarted(f"{K1},{K2}")
    for name in ("a", "b"):  # phase 2: promoted everywhere, hosts still on phase 1 read what the others write
        status = host(name, f"{K2},{K1}")
        assert status.sound and status.primary_lacking_on == [], status
    # Phase 3, dropping k1: only once no live ring encrypts with it. The phase-1 rings are live for three heartbeats.
    assert not host("a", K2).sound
    _restarted(f"{K2},{K1}")
    EncryptionKeyRing.objects.filter(ring_id=key_rings.ring_id(crypto.parse_keyring(K2))).delete()
    assert host("a", K2).sound and host("b", K2).sound


def test_the_same_key_id_with_other_bytes_is_a_conflict(host):
    assert host("a", K1).sound
    status = host("b", K1_ELSEWHERE)
    assert not status.sound and status.conflicting == ["k1"]


def test_evaluation_orders_rings_by_first_seen():
    a, b = _ring("a", K1), _ring("b", OTHER)
    assert key_rings.evaluate(a, [a, b]).sound and not key_rings.evaluate(b, [a, b]).sound
    assert key_rings.evaluate(b, [b, a]).sound and not key_rings.evaluate(a, [b, a]).sound


def test_readyz_fails_on_a_host_whose_ring_cannot_decrypt_what_live_hosts_write(host, api, settings):
    """Before: /readyz said 200 here (the key id scan is informational and runs later, per process)."""
    host("a", K1)
    settings.MEMORY_ENCRYPTION_KEYS = OTHER  # this host, at its first probe
    response = api.get("/readyz")
    assert response.status_code == 503, response.content
    details = response.json()["details"]
    assert details["checks"]["encryption_key_ring"] == "failed: KeyRingMismatch"
    assert details["encryption_keys"]["ring"]["lacking"] == {"k1": ["a"]}
    settings.MEMORY_ENCRYPTION_KEYS = K1
    response = api.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["encryption_keys"]["ring"]["sound"] is True


def _rotate() -> str:
    out = StringIO()
    call_command("rotate_encryption_key", "--no-progress", stdout=out)
    return out.getvalue()


def test_rotate_encryption_key_refuses_a_primary_some_live_host_lacks(host, settings):
    """Before: the command re-encrypted everything under a key host b did not have."""
    host("a", K1)
    host("b", K1)
    settings.MEMORY_ENCRYPTION_KEYS = f"{K2},{K1}"  # the operator's shell: k2 promoted here only
    with pytest.raises(CommandError, match=r"'k2' is not in MEMORY_ENCRYPTION_KEYS on every live host: a, b lack"):
        _rotate()
    # The refused run reported nothing: a and b stay sound.
    assert EncryptionKeyRing.objects.count() == 2 and host("b", K1).sound
    host("a", f"{K1},{K2}")  # phase 1 on both hosts
    host("b", f"{K1},{K2}")
    _restarted(f"{K1},{K2}")
    settings.MEMORY_ENCRYPTION_KEYS = f"{K2},{K1}"
    assert "Every live host (2 key ring(s) reported) holds k2." in _rotate()


def test_rotate_encryption_key_refuses_a_ring_that_lacks_what_hosts_write(host, settings):
    host("a", K1)
    settings.MEMORY_ENCRYPTION_KEYS = K2
    with pytest.raises(CommandError, match=r"lacks keys live hosts encrypt with: k1 \(written by a\)"):
        _rotate()
    settings.MEMORY_ENCRYPTION_KEYS = K1_ELSEWHERE
    with pytest.raises(CommandError, match="other key bytes on live hosts"):
        _rotate()


def test_fingerprints_tell_keys_apart_and_reveal_none():
    one, other = crypto.parse_keyring(K1), crypto.parse_keyring(K1_ELSEWHERE)
    assert one.fingerprints["k1"] != other.fingerprints["k1"]
    assert len(one.fingerprints["k1"]) == 32
    raw = base64.b64decode(K1.split(":", 1)[1])
    assert raw.hex()[:32] != one.fingerprints["k1"] and crypto.key_fingerprint(raw) == one.fingerprints["k1"]


def test_a_live_hosts_report_waits_for_a_test_that_owns_the_key_rings():
    """own_key_rings (tests/conftest.py): a report another process makes while a rotation test runs (a heartbeat, or
    a first report after a module emptied the tables) would make the test's ring look lacking; it now waits."""
    import threading

    from django.db import connection, connections

    got: list[bool] = []

    def live_host() -> None:  # another session, as another process's report() would use
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [key_rings._LOCK_ID])
                got.append(cursor.fetchone()[0])
        finally:
            connections.close_all()

    thread = threading.Thread(target=live_host)
    thread.start()
    thread.join(10)
    assert got == [False]
