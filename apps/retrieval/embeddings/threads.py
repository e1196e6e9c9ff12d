"""Thread pools that belong to one process.

A pool created before a fork has no threads in the child (gunicorn forks its workers after preloading the model,
apps.retrieval.embeddings.local.preload_for_fork): a child that submitted to it would wait forever. So a pool is
created on first use in each process, and again in a child.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ProcessPool"]

T = TypeVar("T")


class ProcessPool:
    """A ThreadPoolExecutor of ``max_workers`` threads named ``name``-N, created lazily in each process."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self.name = name
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid: int | None = None

    def executor(self) -> concurrent.futures.ThreadPoolExecutor:
        pid = os.getpid()
        if self._executor is None or self._pid != pid:
            with self._lock:
                if self._executor is None or self._pid != pid:
                    self._executor = concurrent.futures.ThreadPoolExecutor(self.max_workers, self.name)
                    self._pid = pid
        return self._executor

    def submit(self, function: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
        return self.executor().submit(function, *args)
