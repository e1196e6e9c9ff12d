"""Real concurrent HTTP clients against pytest-django's live server: each client is a thread with its own
connection to the server, and each server thread has its own PostgreSQL connection, as in production."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import requests
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.servers.basehttp import ThreadedWSGIServer
from django.test.testcases import LiveServerThread

T = TypeVar("T")


class _WideBacklogServer(ThreadedWSGIServer):
    # Django's test server listens with a backlog of 10: a burst of 32+ connects overflows it and the kernel resets
    # the overflow, which says nothing about the service.
    request_queue_size = 256


class _ServerThread(LiveServerThread):
    server_class = _WideBacklogServer


class LiveServer:
    """Django's threaded test server on a free port (one thread per request, each with its own database
    connection), serving the full middleware stack."""

    def __init__(self) -> None:
        self._thread = _ServerThread("127.0.0.1", static_handler=StaticFilesHandler)
        self._thread.daemon = True
        self._thread.start()
        self._thread.is_ready.wait()
        if self._thread.error:
            raise self._thread.error
        self.url = f"http://127.0.0.1:{self._thread.port}"

    def stop(self) -> None:
        self._thread.terminate()


def run_concurrently(clients: int, call: Callable[[int, requests.Session], T], *, timeout: float = 120) -> list[T]:
    """Run ``call(client_index, session)`` on ``clients`` threads released together by a barrier, so the requests
    really overlap on the server; returns the results in client order (an exception in any client is re-raised)."""
    barrier = threading.Barrier(clients, timeout=timeout)

    def client(index: int) -> T:
        with requests.Session() as session:
            barrier.wait()
            return call(index, session)

    with ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(client, index) for index in range(clients)]
        return [future.result(timeout=timeout) for future in futures]
