"""Load order of native libraries that cannot share a process in either order.

Loading torch *after* regopy's librego_shared.so aborts the process ("double free or corruption") on the first
model load; torch loaded first works. So whenever this process may embed with the local model, torch is imported
before regopy. Reproduce with: evaluate a policy, then `import torch` (see tests/memories/test_semantic_search.py's
real-model test, which runs after policy evaluation).
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)


def preload_before_regopy() -> None:
    from django.conf import settings

    wants_local_model = getattr(settings, "EMBEDDING_PROVIDER", "local") == "local" or getattr(
        settings, "PRELOAD_TORCH", False
    )
    if wants_local_model and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401


_M_ARENA_MAX = -8  # glibc <malloc.h>


def limit_malloc_arenas(default: int = 2) -> None:
    """Cap glibc's malloc arenas, as MALLOC_ARENA_MAX does, for a multi-threaded server process.

    glibc gives threads their own arenas (up to 8 per core) and returns little of their free memory to the system:
    a web worker with 16 WSGI threads grew by ~200 MB of fragmented heap under load (bench/memories.py, issue 12).
    Call it early, before the threads start; inherited by forked children. MALLOC_ARENA_MAX set in the environment
    wins (glibc reads it itself); no effect on other C libraries.
    """
    import ctypes
    import os

    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_ARENA_MAX, int(os.environ.get("SERVICE_MALLOC_ARENA_MAX", default)))
    except (OSError, AttributeError, ValueError):  # not glibc: nothing to tune
        logger.debug("mallopt unavailable; malloc arenas not capped")
