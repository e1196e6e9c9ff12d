"""The WSGI application: the REST API. config.asgi mounts it behind a2wsgi; plain WSGI servers can use it too."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.embedded")

application = get_wsgi_application()

from apps.runtime import startup  # noqa: E402

startup.check_or_die()
startup.check_dev_idp_key()
startup.check_embedding_device("queries")
if os.environ.get("WEB_PRELOAD_MASTER_PID") == str(os.getpid()):
    # gunicorn's master, importing the application for its workers (config/gunicorn.conf.py): load the embedding
    # model for the workers to share; each adopts it after the fork (post_fork).
    startup.preload_embedder_for_fork()
    # The URLconf, and with it every view, serializer and service module, which Django otherwise imports at each
    # worker's first request: one copy shared copy-on-write instead of one per worker (issue 12).
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (the property imports the URLconf)
else:
    startup.warm_up_embedder()
    startup.start_key_ring_heartbeat()
