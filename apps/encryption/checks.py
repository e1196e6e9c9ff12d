"""The encryption part of /readyz: the key ring check (apps.encryption.key_rings) and the key ids stored values are
sealed with, against this process's ring."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.core.shapes import isoformat
from apps.encryption import crypto, key_rings

logger = logging.getLogger(__name__)


class _KeyIdScan:
    """Which key ids the stored envelopes name, and which of them the ring lacks (a botched rotation leaves rows no
    read can open): the ``encryption_keys`` part of /readyz. Scanning every encrypted column is a table scan, so it
    runs at most once per ENCRYPTION_KEY_SCAN_INTERVAL_SECONDS per process, in a thread of its own; a probe waits
    for it at most a second and otherwise shows the previous result. Informational: a missing key does not make the
    service unready (the rows it opens are served; taking every instance out of rotation would serve nothing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._running = False
        self._in_use: set[str] | None = None
        self._scanned_at: float = 0.0
        self._scanned_at_wall = None
        self._error: str | None = None

    def info(self) -> dict:
        with self._lock:
            due = not self._running and (
                self._in_use is None
                or time.monotonic() - self._scanned_at >= settings.ENCRYPTION_KEY_SCAN_INTERVAL_SECONDS
            )
            if due:
                self._running = True
                self._done.clear()
        if due:
            threading.Thread(target=self._scan, name="key-id-scan", daemon=True).start()
            self._done.wait(1.0)
        with self._lock:
            in_use, scanned_at, error = self._in_use, self._scanned_at_wall, self._error
        if in_use is None:
            return {"scan": f"failed: {error}" if error else "pending"}
        ring = crypto.keyring().keys
        info = {"in_use": sorted(in_use), "missing": sorted(in_use - ring.keys()), "scanned_at": isoformat(scanned_at)}
        if error:
            info["last_scan"] = f"failed: {error}"
        return info

    def _scan(self) -> None:
        in_use, error = None, None
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    # Not the service's statement timeout: a large store takes longer, and nobody waits for this.
                    cursor.execute(
                        "SET LOCAL statement_timeout = %s", [f"{settings.ENCRYPTION_KEY_SCAN_TIMEOUT_SECONDS}s"]
                    )
                in_use = crypto.stored_key_ids()
        except Exception as exc:  # reported in /readyz; the checks decide readiness
            error = type(exc).__name__
            logger.warning("encryption key id scan failed", extra={"error": error})
        finally:
            connection.close()  # this thread's own connection
            with self._lock:
                if in_use is not None:
                    self._in_use = in_use
                    self._scanned_at_wall = timezone.now()
                self._scanned_at = time.monotonic()
                self._error = error
                self._running = False
                self._done.set()
        if in_use is not None and (missing := sorted(in_use - crypto.keyring().keys.keys())):
            logger.error("stored values name encryption keys missing from the ring", extra={"key_ids": missing})


_key_id_scan = _KeyIdScan()


def encryption_keys_info() -> dict:
    """The stored key ids (the scan) and this process's key ring against the other live hosts' (``ring``: the check
    ``encryption_key_ring`` fails while it is not sound; apps.encryption.key_rings)."""
    return {**_key_id_scan.info(), "ring": key_rings.info()}
