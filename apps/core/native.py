"""Load order of native libraries that cannot share a process in either order.

Loading torch *after* regopy's librego_shared.so aborts the process ("double free or corruption") on the first
model load; torch loaded first works. So whenever this process may embed with torch (``EMBEDDING_BACKEND=torch``,
or a GPU device, which may run through torch), torch is imported before regopy. Reproduce with: evaluate a policy,
then `import torch` (see tests/memories/test_semantic_search.py's real-model test, which runs after policy
evaluation). The cause is the two C++ allocators described in ``share_cxx_allocator``: with it, the reverse order no
longer aborts either (checked by loading the model after policy evaluations), but the torch-first order stays.
onnxruntime (the default backend) loads after regopy without either problem (checked the same way, and by every
web process: they import it only at the first semantic search or warm-up, after the policies compiled), so nothing
preloads it: a process that never embeds never maps it.
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)


def torch_environment() -> None:
    """Settings torch's OpenMP runtime reads once, when torch is first imported; call before that import.

    OMP_WAIT_POLICY=PASSIVE: OpenMP's threads sleep when a parallel region ends instead of spinning for the next
    one. On this 2-core machine the spinning took the cores the request threads and PostgreSQL needed: a one-query
    encode cost 178-239 ms of wall time (200 ms CPU) under load, 34-55 ms passive (issue 12). An explicit
    OMP_WAIT_POLICY in the environment wins.
    """
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def preload_before_regopy() -> None:
    if _may_use_torch() and importlib.util.find_spec("torch") is not None:
        torch_environment()
        import torch  # noqa: F401
    share_cxx_allocator()


def _may_use_torch() -> bool:
    """Whether this process may embed through torch (or is told to load it: PRELOAD_TORCH, the tests' reference)."""
    from django.conf import settings

    if getattr(settings, "PRELOAD_TORCH", False):
        return True
    if getattr(settings, "EMBEDDING_PROVIDER", "local") != "local":
        return False
    devices = (getattr(settings, "EMBEDDING_DEVICE", "cpu"), getattr(settings, "EMBEDDING_QUERY_DEVICE", "cpu"))
    return getattr(settings, "EMBEDDING_BACKEND", "onnx") == "torch" or any(d != "cpu" for d in devices)


def share_cxx_allocator() -> None:
    """Make regopy's library allocate its C++ objects with the same operator new/delete as libstdc++.

    librego_shared.so (regopy 1.5.2) exports its own operator new/delete (snmalloc) and also uses libstdc++.so.6.
    When libstdc++ was loaded before it (numpy and torch load it, and both come first), libstdc++'s code allocates
    with glibc while rego-cpp's frees with snmalloc, or the other way round: about 1 KB stayed allocated per policy
    evaluation (every PUT evaluates twice, uncached), so a web worker grew by ~3.6 KB per PUT without end (issue
    12). With libstdc++ in the global scope before librego is loaded, librego's operator new/delete resolve to
    libstdc++'s, so there is one allocator. Reproduce: import numpy, then evaluate any policy in a loop and watch
    RSS. Call before ``import regopy``; no effect where libstdc++.so.6 is missing (not glibc/GCC).
    """
    import ctypes
    import os

    try:
        ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_GLOBAL)
    except OSError:
        logger.debug("libstdc++.so.6 not found; regopy keeps its own allocator")


# glibc <malloc.h> mallopt parameters, with the environment variable glibc itself reads for each.
_MALLOPT = (
    (-8, "MALLOC_ARENA_MAX", 2),  # M_ARENA_MAX
    (-3, "MALLOC_MMAP_THRESHOLD_", 4 * 1024 * 1024),  # M_MMAP_THRESHOLD
    (-1, "MALLOC_TRIM_THRESHOLD_", 16 * 1024 * 1024),  # M_TRIM_THRESHOLD
)


def tune_malloc() -> None:
    """Make glibc's malloc give memory back, for the long-running web and worker processes (issue 12).

    * Arenas capped at 2: glibc gives threads their own arenas (up to 8 per core), each keeping its free memory.
    * A fixed mmap threshold of 4 MiB, and the heap top trimmed above 16 MiB: glibc's default raises the mmap
      threshold as large blocks are freed (up to 32 MiB), so torch's activation buffers for a batch of documents
      (tens of MB) end up in the heap and stay there. Measured with the local model, 64 texts of ~110 words in
      batches of 32: a process grew by 53 MB with glibc's defaults (190 MB in an earlier measurement), by 5 MB with
      these, and by 8 MB more over 60 batches of 1-16 queries.
    * Not lower: a batch of concurrent search queries allocates activations of 0.3-2 MB. Below the threshold
      (the first tuning had 256 KiB and 1 MiB) each of them was a fresh mmap, zero-filled page by page: ~7,600
      page faults per batch of 16 queries, 10-25% of its CPU on this VM; none with these values, and the same growth.

    MALLOC_TUNING=off leaves glibc's defaults. Call early, before the threads start; forked children inherit it.
    An environment variable glibc reads
    (MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) wins over the value here. No effect on
    other C libraries.
    """
    import ctypes
    import os

    if os.environ.get("MALLOC_TUNING", "on").lower() in ("0", "off", "false", "no"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        for parameter, variable, value in _MALLOPT:
            if not os.environ.get(variable):
                libc.mallopt(parameter, value)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        logger.debug("mallopt unavailable; malloc left at its defaults")
