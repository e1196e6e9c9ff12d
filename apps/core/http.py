"""Outbound HTTP shared by the policy sidecar client and the embedding provider."""

from __future__ import annotations

import threading

import requests


class ThreadLocalSessions:
    """One requests.Session per thread: connection reuse without sharing a Session, which requests does not
    document as thread-safe (the web server runs many threads)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session
