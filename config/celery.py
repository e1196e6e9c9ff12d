"""The Celery application shared by the worker and beat processes (see Procfile)."""

import logging
import os

from celery import Celery
from celery.signals import worker_process_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.embedded")

from apps.core.native import tune_malloc

# Before the worker's threads start (Procfile --pool threads): malloc gives memory back (apps.core.native).
tune_malloc()

logger = logging.getLogger("config.celery")

app = Celery("memory_service")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _check_configuration(sender=None, **_kwargs) -> None:
    from celery.concurrency.prefork import TaskPool as PreforkPool
    from django.core.exceptions import ImproperlyConfigured

    from apps.runtime import startup

    startup.check_or_die()
    try:
        startup.check_embedding_device("documents")
    except ImproperlyConfigured as exc:
        # Celery logs and ignores what a signal handler raises; a worker that cannot embed must not start.
        logger.critical("%s", exc)
        raise SystemExit(1) from exc
    startup.start_key_ring_heartbeat()
    if not isinstance(getattr(sender, "pool", None), PreforkPool):
        # A threads or solo pool (the Procfile's): this process runs the tasks, so it embeds.
        startup.warm_up_embedder("documents")


@worker_process_init.connect
def _warm_up(**_kwargs) -> None:
    # After the prefork: each child loads its own model (neither runtime is fork-safe once initialised).
    from apps.runtime import startup

    startup.warm_up_embedder("documents")
