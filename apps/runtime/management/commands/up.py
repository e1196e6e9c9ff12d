"""`make run`: migrate (unless ``--no-migrate``: another host or a one-off job migrates a shared database), then run
web + worker + beat (the Procfile) under a supervisor that restarts a process that
dies, and stop the embedded servers this command started however it ends: Ctrl-C (SIGINT), SIGTERM, SIGHUP, a
fatal error or an exception (a ``finally``, signal handlers and ``atexit`` all lead to the same idempotent stop).

Only this command starts embedded servers: it hands their URLs to web, worker and beat (``DATABASE_URL``,
``REDIS_URL``), so a child restarted while one is down never starts a second one of its own, and every process
agrees on one PostgreSQL and one Valkey. The supervisor restarts the embedded servers this command started, on the
same address."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from apps.runtime import embedded_services
from apps.runtime.supervisor import Server, Supervisor, read_procfile, stop_with_parent

logger = logging.getLogger("apps.core.up")

_stop_lock = threading.Lock()


def stop_embedded_services() -> None:
    """Stop the embedded PostgreSQL and Valkey if this process started them (once, whoever calls first)."""
    with _stop_lock:
        started = set(embedded_services.started_here)
        if not started:
            return
        embedded_services.started_here.clear()
    embedded_services.stop(only=started)
    logger.info("embedded services stopped", extra={"services": sorted(started)})


class Command(BaseCommand):
    help = "Run the whole service (web, Celery worker, Celery beat) on the configured or embedded services."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=settings.PORT, help="HTTP port (default: $PORT or 8080)")
        parser.add_argument(
            "--no-migrate",
            dest="migrate",
            action="store_false",
            help="do not run `migrate` first: another host or a one-off job migrates the shared database",
        )

    def handle(self, *args, port: int, migrate: bool = True, **options) -> None:
        # Settings were loaded before this runs, which is when the embedded servers were started: from here on,
        # every way out stops them.
        atexit.register(stop_embedded_services)
        supervisor: Supervisor | None = None
        shutting_down = threading.Event()

        def on_signal(signum: int, _frame) -> None:
            if shutting_down.is_set():
                return  # a second Ctrl-C must not interrupt the orderly stop
            shutting_down.set()
            logger.info("shutting down", extra={"signal": signal.Signals(signum).name})
            if supervisor is None:
                raise SystemExit(128 + signum)  # still migrating: unwind through the finally below
            supervisor.stop()

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, on_signal)
        stop_with_parent()
        try:
            started = time.monotonic()
            if migrate:
                call_command("migrate", interactive=False, verbosity=0)
                ready = f"database ready ({time.monotonic() - started:.1f}s)"
            else:
                ready = self._unmigrated_warning() or "database ready (not migrated here: --no-migrate)"
            # Nothing here uses the database again: an idle session held open would keep a PostgreSQL smart
            # shutdown (SIGTERM) from ever finishing.
            connections.close_all()
            self.stdout.write(ready)
            self._prepare_embeddings()
            supervisor = Supervisor(
                processes=read_procfile(Path(settings.BASE_DIR) / "Procfile"),
                env=self._environment(port),
                cwd=Path(settings.BASE_DIR),
                servers=self._embedded_servers(),
            )
            self._banner(port)
            supervisor.run()
        finally:
            shutting_down.set()
            if supervisor is not None:
                supervisor.shutdown()
            stop_embedded_services()
            self.stdout.write("stopped")

    @staticmethod
    def _unmigrated_warning() -> str | None:
        """With --no-migrate, say so when the database lacks migrations this code needs (the one-off migrate has not
        run yet): the processes start anyway, as they would on a host that cannot run DDL."""
        from django.db import connection
        from django.db.migrations.executor import MigrationExecutor

        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if not plan:
            return None
        return (
            f"WARNING: --no-migrate and {len(plan)} migration(s) not applied to this database yet "
            f"(first: {plan[0][0].app_label}.{plan[0][0].name}); run `python manage.py migrate` once"
        )

    @staticmethod
    def _embedded_servers() -> dict[str, Server]:
        """The embedded servers this command started (not one it found running, nor an external one)."""
        servers = {}
        if "postgres" in embedded_services.started_here:
            servers["postgres"] = Server("postgres", embedded_services.postgres_up, embedded_services.restart_postgres)
        if "valkey" in embedded_services.started_here:
            servers["valkey"] = Server("valkey", embedded_services.valkey_up, embedded_services.restart_valkey)
        return servers

    def _prepare_embeddings(self) -> None:
        """Check the embedding devices and make the local model's ONNX export (once, cached) before the web server
        and the worker start, so they load it instead of racing to make it (``provider.prepare`` does both). The
        export imports torch in a subprocess; only probing a CUDA device (EMBEDDING_DEVICE=cuda) imports it here."""
        from apps.retrieval.embeddings import EmbeddingError, get_provider
        from apps.retrieval.embeddings.local import LocalEmbeddingProvider

        provider = get_provider()
        if not isinstance(provider, LocalEmbeddingProvider):
            return
        started = time.monotonic()
        ready = []
        for purpose in ("queries", "documents"):
            try:
                path = provider.prepare(purpose, progress=self.stdout.write)
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from exc
            except EmbeddingError as exc:
                raise CommandError(f"the local embedding model cannot be used: {exc}") from exc
            ready.append(f"{purpose} on {provider.runtime(purpose).device} ({path.name if path else 'torch'})")
        self.stdout.write(f"embedding model ready: {'; '.join(ready)} ({time.monotonic() - started:.1f}s)")

    def _environment(self, port: int) -> dict[str, str]:
        env = os.environ.copy()
        env["PORT"] = str(port)
        # The servers this process uses (embedded ones it started or found, or the configured ones): a child never
        # starts an embedded server of its own.
        env["DATABASE_URL"] = settings.DATABASE_URL
        env["REDIS_URL"] = settings.REDIS_URL
        # The Procfile names gunicorn and celery: take them from this interpreter's virtualenv.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        # Each gunicorn worker and Celery process writes its metrics here; /metrics aggregates them.
        metrics_dir = Path(settings.DATA_DIR) / "prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings.embedded"))
        return env

    def _banner(self, port: int) -> None:
        base = f"http://localhost:{port}"
        lines = [
            "",
            f"Memory Service on {base}   (API docs: {base}/docs, readiness: {base}/readyz)",
            f"Data directory: {settings.DATA_DIR}",
        ]
        local = {name: source for name, source in settings.SECRET_SOURCES.items() if source != "environment"}
        if local:
            # Loud on purpose (issue 32.2): a second host on this database must be given these, not make its own.
            lines.append(
                "Secrets: " + "; ".join(f"{name} {source}" for name, source in local.items())
                + ". Another host sharing this database needs the same values (README \"Several hosts\")."
            )
        host = os.environ.get("HOST") or "127.0.0.1"  # the Procfile's default
        if settings.DEV_IDP_ENABLED and host not in ("127.0.0.1", "localhost", "::1"):
            lines.append(
                f"WARNING: listening on {host} with the development identity provider on: anyone who can reach "
                "this port can get an admin token."
            )
        if settings.DEV_IDP_ENABLED:
            lines += [
                "Dev token (users alice, bob, charlie; password = user name):",
                f"  curl -s {base}/dev-idp/token -d grant_type=password -d client_id={settings.DEV_IDP_CLIENT_ID} "
                f"-d client_secret={settings.DEV_IDP_CLIENT_SECRET} -d username=alice -d password=alice",
            ]
        lines.append("Stop with Ctrl-C.\n")
        self.stdout.write("\n".join(lines))
