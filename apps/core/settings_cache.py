"""A process-wide object built from some settings and rebuilt when they change (override_settings in tests), for the
objects that are costly to build and must follow the settings: the attachment storage, the policy engine."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class BuiltFromSettings(Generic[T]):
    """``get()`` returns what ``build(key)`` made for the current ``key()`` (a tuple of the settings it depends on),
    building it again when the key differs from the one it was built for. One build at a time."""

    def __init__(self, key: Callable[[], tuple[Any, ...]], build: Callable[[tuple[Any, ...]], T]) -> None:
        self._key, self._build = key, build
        self._lock = threading.Lock()
        self._built: tuple[tuple[Any, ...], T] | None = None

    def get(self) -> T:
        key = self._key()
        built = self._built
        if built is not None and built[0] == key:
            return built[1]
        with self._lock:
            if self._built is None or self._built[0] != key:
                self._built = (key, self._build(key))
            return self._built[1]

    def reset(self) -> None:
        """Forget what was built (tests)."""
        with self._lock:
            self._built = None
