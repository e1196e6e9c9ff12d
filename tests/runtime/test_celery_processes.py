"""The Procfile's Celery processes: beat (``python -m config.beat``) sends the schedule without setting Django up;
the worker (``python -m config.worker``) runs tasks without Celery's command line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
import redis
from django.conf import settings

from tests.celery_workers import broker_url, kill_group, start_worker, wait_for
from tests.conftest import service_env

# Celery worker and beat processes started as the Procfile starts them.
pytestmark = pytest.mark.live


def test_every_scheduled_task_is_registered_with_the_worker() -> None:
    # Beat registers no task and sends each by name (config.beat): a name no worker task has would never run.
    from config.celery import app

    app.loader.import_default_modules()
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert entry["task"] in app.tasks, name


def test_beat_app_does_not_set_django_up() -> None:
    # What beat does at start (celery.apps.beat.Beat.init_loader), then what it would have loaded with config.celery.
    probe = (
        "import json, sys\n"
        "from config.beat import app\n"
        "app.loader.init_worker()\n"
        "app.finalize()\n"
        "from django.apps import apps\n"
        "print(json.dumps({'ready': apps.ready, 'schedule': sorted(app.conf.beat_schedule), 'loaded': [m for m in\n"
        "    ('rest_framework', 'apps.memories.models', 'torch', 'celery.bin.celery') if m in sys.modules]}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=service_env(DJANGO_SETTINGS_MODULE="config.settings.test", LOG_LEVEL="WARNING"),
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"ready": False, "schedule": sorted(settings.CELERY_BEAT_SCHEDULE), "loaded": []}


@pytest.mark.slow
def test_beat_sends_scheduled_tasks_by_name(tmp_path) -> None:
    broker = broker_url()
    client = redis.Redis.from_url(broker)
    client.delete("celery")
    process = subprocess.Popen(
        [sys.executable, "-m", "config.beat", "--loglevel", "INFO", "--schedule", str(tmp_path / "beat-schedule")],
        env=service_env(
            DJANGO_SETTINGS_MODULE="config.settings.embedded",
            REDIS_URL=broker,
            DATABASE_URL="postgresql://unused.invalid/none",  # beat never connects to the database
            DATA_DIR=str(tmp_path),
            # Settings still read them; next to an external database they are never generated (issue 32.2).
            SECRET_KEY=settings.SECRET_KEY,
            MEMORY_ENCRYPTION_KEYS=settings.MEMORY_ENCRYPTION_KEYS,
            MEMORY_EPISODIC_INDEXING_INTERVAL="1",
        ),
        cwd=settings.BASE_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        sent: set[str] = set()
        deadline = time.monotonic() + 60
        while "apps.memories.tasks.index_pending_memories" not in sent and time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read().decode(errors="replace")
            for raw in client.lrange("celery", 0, -1):
                sent.add(json.loads(raw)["headers"]["task"])
            time.sleep(0.2)
        assert "apps.memories.tasks.index_pending_memories" in sent
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        client.delete("celery")
        client.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_started_as_the_procfile_does_runs_tasks(tmp_path) -> None:
    from config.celery import app

    broker = broker_url()
    worker, log = start_worker(tmp_path, "procfile", broker, beat=False, procfile_command=True)
    try:
        with app.connection_for_write(url=broker) as conn:
            result = app.send_task("apps.memories.tasks.prune_memory_events", connection=conn)
        # This very task's success line: the task's name alone is in the worker's startup banner (its task list).
        done = re.compile(rb"prune_memory_events\[" + re.escape(result.id.encode()) + rb"\] succeeded")
        wait_for(lambda: done.search(log.read_bytes()), 90, "the worker to run the task", [log])
    finally:
        kill_group(worker, signal.SIGTERM)
