"""Real Celery worker processes for the tests of the background indexers (memories, conversation search): a
broker database of their own, start with the Procfile's pool, kill the whole process group, wait with the logs."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import service_env


def broker_url() -> str:
    """A database of the test Valkey of its own, so the workers here see no other test's (or run's) tasks: one of
    this test process's share of databases 8-15 (config/settings/test.py)."""
    return random.choice(settings.TEST_CELERY_BROKER_URLS)


def start_worker(
    tmp_path: Path,
    name: str,
    broker: str,
    *,
    beat: bool = True,
    pool: str = "threads",
    procfile_command: bool = False,
    concurrency: int = 1,
    **env: str,
) -> tuple[subprocess.Popen, Path]:
    """A real Celery worker; ``pool`` defaults to the Procfile's (threads: one process embeds), ``concurrency`` to 1
    (the Procfile's is 2). With ``procfile_command``, started as the Procfile starts it (``python -m config.worker``;
    no beat)."""
    from psycopg.conninfo import make_conninfo

    connection.ensure_connection()
    params = {k: v for k, v in connection.get_connection_params().items() if k in {"dbname", "user", "password", "host", "port"}}
    log = tmp_path / f"{name}.log"
    environment = {
        **service_env(),
        "DJANGO_SETTINGS_MODULE": "config.settings.embedded",
        "DATABASE_URL": make_conninfo(**{k: str(v) for k, v in params.items() if v}),
        "REDIS_URL": broker,
        "SSE_REDIS_PREFIX": settings.SSE_REDIS_PREFIX,
        "DATA_DIR": str(tmp_path / name),
        "SECRET_KEY": settings.SECRET_KEY,
        "MEMORY_ENCRYPTION_KEYS": settings.MEMORY_ENCRYPTION_KEYS,
        "EMBEDDING_PROVIDER": "hash",
        "LOG_LEVEL": "INFO",
        "DB_CONN_MAX_AGE": "0",
        # Workers started with their own beat share the broker, so one beat leads (apps.runtime.beat_leader): a
        # killed leader's successor takes over within seconds here, not the production TTL's 20.
        "BEAT_LEADER_LOCK_TTL_SECONDS": "3",
        **env,
    }
    command = [
        sys.executable, "-m", "celery", "-A", "config", "worker",
        "--pool", pool, "--concurrency", str(concurrency), "--loglevel", "INFO", "--without-gossip", "--without-mingle",
    ]
    if procfile_command:
        assert not beat, "python -m config.worker runs no embedded beat"
        command = [sys.executable, "-m", "config.worker", "--pool", pool, "--concurrency", str(concurrency), "--loglevel", "INFO"]
    elif beat:
        command += ["--beat", "--schedule", str(tmp_path / f"{name}-beat-schedule")]
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command, env=environment, cwd=settings.BASE_DIR, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the pool and beat children die with it
        )
    return process, log


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def wait_for(condition, timeout: float, what: str, logs: list[Path]) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.2)
    tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs if log.exists())
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{tails}")


def start_beat(tmp_path: Path, name: str, broker: str, **env: str) -> tuple[subprocess.Popen, Path]:
    """A real beat process as the Procfile starts it (``python -m config.beat``), sending to ``broker``. Beat never
    connects to the database."""
    log = tmp_path / f"{name}.log"
    environment = service_env(
        DJANGO_SETTINGS_MODULE="config.settings.embedded",
        REDIS_URL=broker,
        DATABASE_URL="postgresql://unused.invalid/none",
        DATA_DIR=str(tmp_path / name),
        SECRET_KEY="unused",
        MEMORY_ENCRYPTION_KEYS=settings.MEMORY_ENCRYPTION_KEYS,
        **env,
    )
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "config.beat", "--loglevel", "INFO", "--schedule", str(tmp_path / f"{name}-schedule")],
            env=environment, cwd=settings.BASE_DIR, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return process, log


def queued_tasks(client) -> list[tuple[str, str]]:
    """(task name, origin) of every message waiting in the broker's default queue; the origin names the sending
    process (``gen<pid>@<host>``)."""
    import json

    return [
        (message["headers"]["task"], message["headers"].get("origin", ""))
        for message in map(json.loads, client.lrange("celery", 0, -1))
    ]
