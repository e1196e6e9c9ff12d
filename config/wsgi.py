"""The WSGI application: the REST API. config.asgi mounts it behind a2wsgi; plain WSGI servers can use it too."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.embedded")

application = get_wsgi_application()

from apps.core import startup  # noqa: E402

startup.check_or_die()
startup.warm_up_embedder()
