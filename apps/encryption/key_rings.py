"""Which key rings the live processes of the service hold, so each host knows whether it can decrypt what the others
write (issue 32.2, 32.5).

Every web and worker process reports its ring (key ids, fingerprints, primary) at start and then every
``ENCRYPTION_KEY_RING_HEARTBEAT_SECONDS``, into ``encryption_key_rings`` (one row per distinct ring); a ring not
reported for three heartbeats is no longer live. Fingerprints (crypto.key_fingerprint) tell the same key id with
other key bytes apart without any host revealing a key.

Which rings are sound is decided in the order the rings were first seen, so the host that joins wrong is the one
that is told, not the ones already serving: a ring is *accepted* when it holds, with the same bytes, the primary of
every ring accepted before it; a ring is *sound* when it is accepted and holds the primary of every accepted ring,
later ones included (a host promoted to a new primary while this one lacks it: this one cannot read its writes).
``/readyz`` fails (check ``encryption_key_ring``) on a process whose ring is not sound, and
``rotate_encryption_key`` refuses to rotate to a primary some live ring lacks.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.encryption import crypto

logger = logging.getLogger(__name__)

_LOCK_ID = 0x6B657972  # "keyr": serialises reports, so two rings first seen together still get an order
# A ring nobody reported for this long is forgotten (its row deleted by the next report).
FORGET_AFTER = timedelta(days=7)


class KeyRingMismatch(Exception):
    """This process's key ring cannot decrypt what other live hosts write (see ``RingStatus``)."""


@dataclass
class RingStatus:
    """What the last report found, for this process's ring."""

    ring_id: str
    primary: str
    sound: bool
    # key ids other live rings encrypt with that this ring lacks, with the hosts that write them
    lacking: dict[str, list[str]] = field(default_factory=dict)
    # key ids this ring holds with other key bytes than a live ring accepted before it
    conflicting: list[str] = field(default_factory=list)
    # hosts whose live ring lacks this ring's primary (they cannot read what this host writes)
    primary_lacking_on: list[str] = field(default_factory=list)
    live_rings: int = 0
    reported_at: float = field(default_factory=time.monotonic)

    def as_info(self) -> dict:
        info: dict = {"sound": self.sound, "primary": self.primary, "live_rings": self.live_rings}
        if self.lacking:
            info["lacking"] = self.lacking
        if self.conflicting:
            info["conflicting"] = self.conflicting
        if self.primary_lacking_on:
            info["primary_lacking_on"] = self.primary_lacking_on
        return info


@dataclass(frozen=True)
class _Ring:
    ring_id: str
    primary: str
    fingerprints: dict[str, str]
    hosts: tuple[str, ...]


def ring_id(ring: crypto.KeyRing) -> str:
    material = ring.primary + "|" + ",".join(f"{kid}:{ring.fingerprints[kid]}" for kid in sorted(ring.fingerprints))
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def _holds(ring: _Ring, kid: str, fingerprint: str) -> bool:
    return ring.fingerprints.get(kid) == fingerprint


def evaluate(mine: _Ring, live: list[_Ring]) -> RingStatus:
    """``live``: every live ring, this one included, in the order they were first seen."""
    accepted: list[_Ring] = []
    for ring in live:
        if all(_holds(ring, other.primary, other.fingerprints[other.primary]) for other in accepted):
            accepted.append(ring)
    lacking: dict[str, set[str]] = {}
    conflicting: set[str] = set()
    for other in accepted:
        if other.ring_id == mine.ring_id:
            continue
        kid, fingerprint = other.primary, other.fingerprints[other.primary]
        if kid not in mine.fingerprints:
            lacking.setdefault(kid, set()).update(other.hosts)
        elif mine.fingerprints[kid] != fingerprint:
            conflicting.add(kid)
    for other in accepted:
        if other.ring_id == mine.ring_id:
            break
        conflicting.update(
            kid
            for kid, fingerprint in mine.fingerprints.items()
            if other.fingerprints.get(kid, fingerprint) != fingerprint
        )
    primary_fingerprint = mine.fingerprints[mine.primary]
    lacking_mine = sorted(
        {
            host
            for ring in live
            if ring.ring_id != mine.ring_id and not _holds(ring, mine.primary, primary_fingerprint)
            for host in ring.hosts
        }
    )
    is_accepted = any(ring.ring_id == mine.ring_id for ring in accepted)
    return RingStatus(
        ring_id=mine.ring_id,
        primary=mine.primary,
        sound=is_accepted and not lacking and not conflicting,
        lacking={kid: sorted(hosts) for kid, hosts in sorted(lacking.items())},
        conflicting=sorted(conflicting),
        primary_lacking_on=lacking_mine,
        live_rings=len(live),
    )


def _live_rings(now) -> list[_Ring]:
    """Each live ring once (with the hosts reporting it), in the order rings were first seen on any host."""
    from apps.encryption.models import EncryptionKeyRing

    live_since = now - timedelta(seconds=3 * settings.ENCRYPTION_KEY_RING_HEARTBEAT_SECONDS)
    rings: dict[str, tuple[_Ring, set[str]]] = {}
    for row in EncryptionKeyRing.objects.filter(seen_at__gte=live_since).order_by("first_seen", "ring_id", "hostname"):
        _, hosts = rings.setdefault(row.ring_id, (_Ring(row.ring_id, row.primary, dict(row.fingerprints), ()), set()))
        hosts.add(row.hostname)
    return [
        _Ring(ring.ring_id, ring.primary, ring.fingerprints, tuple(sorted(hosts))) for ring, hosts in rings.values()
    ]


def _hostname() -> str:
    return socket.gethostname()[:255]


def _mine() -> _Ring:
    ring = crypto.keyring()
    return _Ring(ring_id(ring), ring.primary, dict(ring.fingerprints), (_hostname(),))


def assess() -> RingStatus:
    """This process's ring against the live ones, as if it joined now, without reporting it (rotate_encryption_key:
    a refused run must not make the hosts lacking its primary unready)."""
    mine = _mine()
    live = [ring for ring in _live_rings(timezone.now()) if ring.ring_id != mine.ring_id]
    return evaluate(mine, [*live, mine])


def report() -> RingStatus:
    """Record this process's ring as live now and evaluate it against the other live rings (one short transaction;
    the database's statement timeout applies)."""
    from apps.encryption.models import EncryptionKeyRing

    mine = _mine()
    now = timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
        EncryptionKeyRing.objects.filter(seen_at__lt=now - FORGET_AFTER).delete()
        updated = EncryptionKeyRing.objects.filter(ring_id=mine.ring_id, hostname=mine.hosts[0]).update(seen_at=now)
        if not updated:
            # A ring another host reported before keeps its place in the order (first_seen of its first report).
            first = EncryptionKeyRing.objects.filter(ring_id=mine.ring_id).order_by("first_seen").first()
            EncryptionKeyRing.objects.create(
                ring_id=mine.ring_id, hostname=mine.hosts[0], primary=mine.primary, fingerprints=mine.fingerprints,
                first_seen=first.first_seen if first else now, seen_at=now,
            )  # fmt: skip
        live = _live_rings(now)
    status = evaluate(mine, live)
    _remember(status)
    return status


# --- This process's view: refreshed by the heartbeat, read by /readyz ------------------------------------------

_state_lock = threading.Lock()
_last: RingStatus | None = None
_heartbeat: threading.Thread | None = None


def _remember(status: RingStatus) -> None:
    global _last
    with _state_lock:
        previous, _last = _last, status
    if not status.sound and (previous is None or previous.sound or previous.as_info() != status.as_info()):
        logger.error(
            'this host\'s encryption key ring cannot decrypt what other hosts write; README "Several hosts"',
            extra={"key_ring": status.as_info()},
        )
    elif status.primary_lacking_on and (previous is None or previous.primary_lacking_on != status.primary_lacking_on):
        logger.warning(
            "hosts lack this host's primary encryption key and cannot read what it writes",
            extra={"key_ring": status.as_info()},
        )


def _remember_quietly(status: RingStatus | None) -> None:
    """Set (tests: forget) the last status without logging."""
    global _last
    with _state_lock:
        _last = status


def current(max_age: float | None = None) -> RingStatus:
    """The last report's status, reporting now when there is none (a process without a heartbeat: manage.py, the
    tests) or it is older than ``max_age`` seconds (default: two heartbeats) or was made for another ring."""
    if max_age is None:
        max_age = 2 * settings.ENCRYPTION_KEY_RING_HEARTBEAT_SECONDS
    with _state_lock:
        last = _last
    if last is None or time.monotonic() - last.reported_at > max_age or last.ring_id != ring_id(crypto.keyring()):
        return report()
    return last


def check() -> None:
    """Readiness check ``encryption_key_ring``: fails while this ring is not sound (details in ``encryption_keys``)."""
    if not current().sound:
        raise KeyRingMismatch()


def info() -> dict:
    with _state_lock:
        last = _last
    return last.as_info() if last is not None else {"sound": "unknown"}


def start_heartbeat() -> None:
    """Report now and every ENCRYPTION_KEY_RING_HEARTBEAT_SECONDS from a daemon thread of this process (web workers
    and the Celery worker, after any fork). A failed report (database down) is retried at the next beat."""
    global _heartbeat
    with _state_lock:
        if _heartbeat is not None and _heartbeat.is_alive():
            return
        _heartbeat = threading.Thread(target=_beat, name="key-ring-heartbeat", daemon=True)
        _heartbeat.start()


def _beat() -> None:
    from django.db import connections

    while True:
        try:
            report()
        except Exception as exc:  # the database check of /readyz says why; try again at the next beat
            logger.warning("encryption key ring report failed", extra={"error": type(exc).__name__})
        finally:
            connections.close_all()  # this thread's own connection
        time.sleep(settings.ENCRYPTION_KEY_RING_HEARTBEAT_SECONDS)
