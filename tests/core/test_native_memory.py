"""The two native-memory guards that keep a web worker's RSS flat under traffic (issue 23; the growth of issue 12
was 195 -> 400+ MB per worker). `bench/worker_rss.py` measures the whole: +3-5% from 1k to 100k mixed requests.

Each check runs in a fresh interpreter, because both depend on what was loaded, and in what order, before the
first thread or policy evaluation: no clock involved, only counts (malloc arenas) and RSS over a fixed workload.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from django.conf import settings

# Each check is a fresh interpreter running a fixed workload.
pytestmark = pytest.mark.slow


def _run(script: str) -> str:
    # The service's defaults: no malloc settings from the environment running the tests.
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=settings.BASE_DIR,
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings.embedded", "EMBEDDING_PROVIDER": "hash"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


ARENAS = """
    import ctypes, tempfile, threading
    from apps.core.native import tune_malloc

    tune_malloc()  # what config/gunicorn.conf.py and config/celery.py do before any thread starts
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    THREADS = 16  # WSGI_THREADS' default: the request threads of one web worker
    started, release = threading.Barrier(THREADS + 1), threading.Barrier(THREADS + 1)

    def request_thread():
        libc.malloc(4096)  # a thread's first malloc attaches it to an arena (a new one while under the cap)
        started.wait()
        release.wait()

    threads = [threading.Thread(target=request_thread) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    started.wait()
    with tempfile.NamedTemporaryFile(suffix=".xml") as report:
        stream = libc.fopen(report.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        heaps = open(report.name).read().count("<heap nr=")
    release.wait()
    for thread in threads:
        thread.join()
    print(heaps)
"""


def test_request_threads_share_two_malloc_arenas() -> None:
    """Each arena keeps its own free memory; with glibc's default cap (8 per core) every request thread of a worker
    got one. Counted with malloc_info while 16 threads are alive: 16 arenas without the tuning."""
    assert int(_run(ARENAS)) <= 2


POLICY_LOOP = """
    import numpy  # noqa: F401  libstdc++ loaded before regopy, as numpy (torch, onnxruntime) are in the service
    import apps.policy.regopy_engine  # noqa: F401  the service's import of regopy, after its preparation
    import regopy

    def rss_mb():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

    interpreter = regopy.Interpreter()
    interpreter.add_module("probe", "package probe\\nimport rego.v1\\nallow if input.user == \\"bob\\"\\n")
    bundle = interpreter.build("data.probe.allow")

    def evaluate(n):
        interpreter.set_input_term('{"user": "bob", "n": %d}' % n)
        return interpreter.query_bundle(bundle)

    for n in range(500):  # warm-up: caches and allocator pools reach their working size
        evaluate(n)
    before = rss_mb()
    for n in range(5000):
        evaluate(n)
    print(round(rss_mb() - before, 2))
"""


def test_policy_evaluations_do_not_grow_native_memory() -> None:
    """librego_shared.so brings its own operator new/delete; with libstdc++ loaded first, memory allocated by one
    allocator was freed by the other and about 1 KB stayed behind per evaluation (5 MB over these 5,000, 3.6 KB per
    PUT in a web worker), unless apps.core.native.share_cxx_allocator runs before regopy is imported."""
    assert float(_run(POLICY_LOOP)) < 1.5
