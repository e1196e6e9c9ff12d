"""Embed a query while the request thread reads the database.

A hybrid search needs its query's vector (the encoder's CPU time, about 10 ms for the local model) and its words'
matches (a query PostgreSQL runs in another process, on another core). Neither needs the other, so the request
thread starts the embedding here and reads the words meanwhile: one search alone waits for the slower half, not
for both one after the other. The CPU spent is the same; under load the gain shrinks to nothing.

What runs here must not touch the database: Django's connections are per thread, and one opened on a helper
thread would outlive the request. Embedding providers do no database work.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from .threads import ProcessPool

__all__ = ["start"]

T = TypeVar("T")

# Each thread only waits: for the encode thread (apps.retrieval.embeddings.local) or a remote provider. Twice a web
# worker's request threads (WSGI_THREADS, 16 by default), so a search finds one free; one beyond them would wait for
# a free thread (never for another search's database work, which stays on the request threads).
MAX_THREADS = 32

_pool = ProcessPool(MAX_THREADS, "embed-meanwhile")


def start(function: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
    """``function(*args)`` on a helper thread of this process; its result, or its exception, from the future."""
    return _pool.submit(function, *args)
