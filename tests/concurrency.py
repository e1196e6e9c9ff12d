"""Real concurrency in tests: ``run_concurrently`` is the one helper every concurrency test uses.

Against the live service (tests/live_service.py, the ``live_service`` fixture) each call is a real HTTP client with
its own connection, served by its own request thread with its own PostgreSQL connection, as in production. Calls
that use Django in this process (the test client, services, the ORM) each get their own database connection too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import connections

T = TypeVar("T")


def run_concurrently(calls: Sequence[Callable[[], T]], *, timeout: float = 120) -> list[T]:
    """Run every call at once, each on a thread of its own, released together by a barrier so they really overlap
    (on the server, in the database); returns their results in call order and re-raises the first exception. Each
    thread closes the Django database connections it opened, so none outlives the test.

    ``run_concurrently([lambda: ..., ...])``; for N alike clients, ``run_concurrently([partial(work, i) for i in
    range(N)])``."""
    barrier = threading.Barrier(len(calls), timeout=timeout)

    def run(one: Callable[[], T]) -> T:
        try:
            barrier.wait()
            return one()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(run, one) for one in calls]
        return [future.result(timeout=timeout) for future in futures]


def meet(monkeypatch, first: tuple[object, str], second: tuple[object, str], *, timeout: float = 5) -> list[bool]:
    """Patch ``getattr(*first)`` and ``getattr(*second)`` so each, when called, waits up to ``timeout`` seconds for
    the other to start: the list returned fills with one True per call that met the other, False when one ran after
    the other (the second waits in vain, or the first does)."""
    started = {id(first): threading.Event(), id(second): threading.Event()}
    met: list[bool] = []

    def wrap(this: tuple[object, str], other: tuple[object, str]) -> None:
        original = getattr(*this)

        def waiting(*args, **kwargs):
            started[id(this)].set()
            met.append(started[id(other)].wait(timeout))
            return original(*args, **kwargs)

        monkeypatch.setattr(*this, waiting)

    wrap(first, second)
    wrap(second, first)
    return met
