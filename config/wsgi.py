"""The WSGI application: the REST API. config.asgi mounts it behind a2wsgi; plain WSGI servers can use it too."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.embedded")

application = get_wsgi_application()

from apps.core import startup  # noqa: E402

startup.check_or_die()
if os.environ.get("WEB_PRELOAD_MASTER_PID") == str(os.getpid()):
    # gunicorn's master, importing the application for its workers (config/gunicorn.conf.py): import the embedding
    # libraries for the workers to share, and leave the model to each worker (post_fork).
    startup.import_embedder_modules()
else:
    startup.warm_up_embedder()
