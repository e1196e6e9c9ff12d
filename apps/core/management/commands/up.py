"""`make run`: migrate, then start web + worker + beat (honcho over the Procfile) and stop the embedded servers
this command started when it exits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from config import embedded_services


class Command(BaseCommand):
    help = "Run the whole service (web, Celery worker, Celery beat) on the configured or embedded services."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=settings.PORT, help="HTTP port (default: $PORT or 8080)")

    def handle(self, *args, port: int, **options) -> None:
        started = time.monotonic()
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(f"database ready ({time.monotonic() - started:.1f}s)")

        env = os.environ.copy()
        env["PORT"] = str(port)
        # The Procfile names gunicorn and celery: take them from this interpreter's virtualenv.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        # Each gunicorn worker and Celery process writes its metrics here; /metrics aggregates them.
        metrics_dir = Path(settings.DATA_DIR) / "prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings.embedded"))

        self._banner(port)
        honcho = Path(sys.executable).with_name("honcho")
        procfile = Path(settings.BASE_DIR) / "Procfile"
        # Ctrl-C reaches honcho and its children through the process group; SIGTERM (a supervisor, `timeout`) is
        # forwarded. Either way we wait for honcho to stop its processes, then stop what we started.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        honcho_process = subprocess.Popen([str(honcho), "start", "-f", str(procfile)], env=env, cwd=settings.BASE_DIR)
        signal.signal(signal.SIGTERM, lambda signum, frame: honcho_process.send_signal(signal.SIGTERM))
        try:
            code = honcho_process.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
            if embedded_services.started_here:
                embedded_services.stop(only=set(embedded_services.started_here))
                self.stdout.write("embedded PostgreSQL and Valkey stopped")
        raise SystemExit(code)

    def _banner(self, port: int) -> None:
        base = f"http://localhost:{port}"
        lines = [
            "",
            f"Memory Service on {base}   (API docs: {base}/docs, readiness: {base}/readyz)",
            f"Data directory: {settings.DATA_DIR}",
        ]
        if settings.DEV_IDP_ENABLED:
            lines += [
                "Dev token (users alice, bob, charlie; password = user name):",
                f"  curl -s {base}/dev-idp/token -d grant_type=password -d client_id={settings.DEV_IDP_CLIENT_ID} "
                f"-d client_secret={settings.DEV_IDP_CLIENT_SECRET} -d username=alice -d password=alice",
            ]
        lines.append("Stop with Ctrl-C.\n")
        self.stdout.write("\n".join(lines))
