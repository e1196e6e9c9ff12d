"""The one web application: ASGI on one port.

``/v1/events`` (server-sent events) is served natively by Channels and ``/mcp`` (the MCP server, apps.mcp) by the
MCP SDK; every other path goes to Django's WSGI application through a2wsgi's fixed thread pool. Measured on this
machine with a minimal DRF view (wrk, 16 connections): Django's own ASGI handler under daphne 850 req/s; gunicorn +
uvicorn workers + a2wsgi 3,800 req/s.

Production: ``gunicorn config.asgi:application -k apps.runtime.http_server.ServiceUvicornWorker`` (see Procfile).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.embedded")
# A web process embeds only search queries, one batch at a time (apps.retrieval.embeddings.local's batcher), beside the
# other web workers and PostgreSQL on the same cores. With one embedding thread per web process, instead of the
# runtime's default of one per core, a lone semantic search answered faster (issue 12, torch, 2 workers on 2 cores,
# four rounds against three: c1 p50 19.5-21.7 ms against 22.9-23.7) and 16 concurrent ones no worse (113-150
# against 114-147 searches/s, p95 163-174 against 162-177 ms); one thread also lets gunicorn's master preload the
# onnxruntime session for its workers. The Celery worker, which embeds documents in large batches, keeps the
# runtime's default. An explicit EMBEDDING_THREADS (or its former name EMBEDDING_TORCH_THREADS) wins.
os.environ.setdefault("EMBEDDING_THREADS", os.environ.get("EMBEDDING_TORCH_THREADS") or "1")

from django.core.asgi import get_asgi_application

# Sets up Django (apps, settings) before anything imports models.
_django_asgi = get_asgi_application()

from apps.runtime.wsgi_bridge import CoalescingWSGIMiddleware, acknowledge_lifespan  # noqa: E402
from config.env import env_int  # noqa: E402
from config.wsgi import application as wsgi_application  # noqa: E402

# Threads per process serving the REST API: each holds at most one database connection.
WSGI_THREADS = env_int("WSGI_THREADS", 16)

# The event loop thread (open event streams) and the REST threads share the GIL. At Python's default 5 ms switch
# interval a REST request that re-acquires the GIL after every query may wait up to 5 ms each time the loop is busy
# writing events. bench/events.py with 500 streams open, back to back: append p95/p99 43/86 ms at 5 ms against
# 29/34 ms at 1 ms (p50 21 vs 19 ms). Set GIL_SWITCH_INTERVAL_MS=5 for Python's default.
sys.setswitchinterval(env_int("GIL_SWITCH_INTERVAL_MS", 1) / 1000)

_rest_api = CoalescingWSGIMiddleware(wsgi_application, workers=WSGI_THREADS)

# Paths served by ASGI-native (Channels) consumers; each is an ASGI app. The SSE stream registers here.
_native_routes: dict[str, object] = {}


def _load_native_routes() -> None:
    try:
        from apps.events.routing import native_routes
    except ImportError:  # the stream is not installed in this build
        pass
    else:
        _native_routes.update(native_routes)
    # The MCP server (/mcp and its protected-resource metadata): its tools run in the REST bridge's threads.
    from apps.mcp.routing import native_routes as mcp_routes

    _native_routes.update(mcp_routes(_rest_api.executor))


_load_native_routes()


async def application(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        await acknowledge_lifespan(receive, send)
        return
    native = _native_routes.get(scope.get("path", "")) if scope["type"] == "http" else None
    if native is not None:
        await native(scope, receive, send)
    elif scope["type"] == "http":
        await _rest_api(scope, receive, send)
    else:
        await _django_asgi(scope, receive, send)
