"""gunicorn settings of the web process (Procfile: ``gunicorn -c config/gunicorn.conf.py config.asgi:application``).

The application is imported once in the master before the workers fork (``preload_app``), so the workers share
its pages copy-on-write: Django, the policy engine and, with the local embedding model, its runtime (onnxruntime,
or torch and sentence-transformers) and the model's weights (issue 12); ``pre_fork`` freezes them so the workers'
garbage collections do not copy those pages. The master builds the model's query runtime on one thread and never
runs it (neither runtime's thread pool survives a fork once started); each worker adopts it after the fork
(``post_fork``) (apps.retrieval.embeddings.local.preload_for_fork). GUNICORN_PRELOAD=false imports the application in
each worker instead.
"""

from __future__ import annotations

import errno
import os
import socket

from apps.core.native import tune_malloc
from config.env import env_bool

# Before the application's threads exist; the workers inherit it (see apps.core.native).
tune_malloc()

preload_app = env_bool("GUNICORN_PRELOAD", True)
if preload_app:
    # Read by config.wsgi while the master imports the application: defer the model warm-up to post_fork.
    os.environ["WEB_PRELOAD_MASTER_PID"] = str(os.getpid())


# Each worker listens on a socket of its own (SO_REUSEPORT; gunicorn then opens no socket in the master) and the
# kernel spreads new connections over them. On one socket shared by every worker, the worker that wakes first accepts
# every pending connection (uvloop drains the accept queue), so a burst of keep-alive connections could all land on
# one worker and leave the other core idle (issue 12: all 16 of a benchmark's connections on one of two workers, web
# CPU 95% of one core at concurrency 16). The cost: a connection still in a worker's queue when that worker exits is
# reset. GUNICORN_REUSE_PORT=false goes back to the shared socket; a Unix socket, port 0 or systemd's sockets always
# use it (_check_reuse_port).
reuse_port = env_bool("GUNICORN_REUSE_PORT", True)

# gunicorn's control socket (for gunicornc: worker counts, reload, shutdown) defaults to one path per user,
# $XDG_RUNTIME_DIR or $HOME/.gunicorn/gunicorn.ctl, which a second server of the same user (a benchmark next to
# `make run`) takes over. Nothing here uses it: off unless GUNICORN_CONTROL_SOCKET names a path for it.
control_socket_disable = not os.environ.get("GUNICORN_CONTROL_SOCKET")
if not control_socket_disable:
    control_socket = os.environ["GUNICORN_CONTROL_SOCKET"]


def on_starting(server) -> None:
    if server.cfg.reuse_port:
        _check_reuse_port(server)


def _check_reuse_port(server) -> None:
    """Keep a shared socket where per-worker sockets cannot work, and refuse a port already in use.

    Workers on a Unix socket would each unlink the path the other bound, port 0 would give each worker a different
    port, and sockets from systemd would go unused. A port in use must fail here: with SO_REUSEPORT a second server
    of the same user would bind it too and quietly take half the connections. A probe without SO_REUSEPORT cannot
    bind beside any listener."""
    addresses = server.cfg.address
    socket_activated = bool(os.environ.get("LISTEN_FDS"))  # systemd hands over sockets the workers must share
    if socket_activated or any(not isinstance(address, tuple) or address[1] == 0 for address in addresses):
        server.cfg.set("reuse_port", False)
        return
    for host, port in addresses:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    server.log.error("Address %s:%s is already in use", host, port)
                    raise SystemExit(1) from None
                raise


def when_ready(server) -> None:
    # Before the first fork: no database connection may be shared between the master and its workers.
    if preload_app:
        from django.db import connections

        connections.close_all()
        # What each worker would otherwise import for itself when it starts serving: uvicorn's protocol and loop
        # implementations (the "auto" modules pick and import httptools, websockets, uvloop) and the Celery/kombu
        # modules the first indexing request (task.delay) loads; imported here, the workers share them (issue 12).
        import celery.app.amqp  # noqa: F401
        import kombu.transport.redis  # noqa: F401
        import uvicorn.loops.auto
        import uvicorn.protocols.http.auto
        import uvicorn.protocols.websockets.auto  # noqa: F401


def pre_fork(server, worker) -> None:
    if preload_app:
        # The preloaded objects move to the GC's permanent generation, which the workers' collections never walk:
        # a collection writes to the header of every object it visits, so each full collection in a worker copied
        # every page of the master's heap it touched (issue 12: two workers after 9,000 GET/PUT and 500 semantic
        # searches, web PSS 1066 -> 818 MB). Before every fork, so a respawned worker gets it too.
        import gc

        gc.collect()
        gc.freeze()


def post_fork(server, worker) -> None:
    if preload_app:
        from apps.runtime import startup

        startup.warm_up_embedder()
        startup.start_key_ring_heartbeat()  # threads do not survive the fork: each worker starts its own
