"""Celery beat for the service (Procfile: ``python -m config.beat``): the schedule without Django.

Beat only sends the tasks of ``CELERY_BEAT_SCHEDULE`` by name at their intervals; the worker runs them. Started
with ``-A config`` it got the worker's app, whose Django fix-up runs ``django.setup()`` and imports every app's
models, admin and tasks (with DRF, Channels/Twisted, drf-spectacular...): 1,800 modules and ~100 MB of PSS for a
process that needs none of them (issue 12). This app reads the same CELERY_* settings (importing the settings
module, not setting Django up) and installs no fix-up, so beat stays at the cost of Celery and the broker client.
The settings' LOGGING applies as under Django, so beat logs JSON like the other processes.

``python -m config.beat`` runs beat as ``celery -A config.beat beat`` does (which works too), without importing
Celery's command line: it loads click-repl, prompt_toolkit and pygments for ``celery shell``/``amqp`` (285 modules,
~13 MB of beat's remaining ~50).
"""

from __future__ import annotations

import logging.config
import os

from celery import Celery
from django.conf import settings

# Read when the settings are first accessed (below), as in config.celery.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.embedded")

logging.config.dictConfig(settings.LOGGING)

# fixups=[]: not Celery's Django fix-up, which is what calls django.setup() (see above). No task is registered
# here, so beat sends each scheduled task by its name, exactly the message the worker's registered task gets.
app = Celery("memory_service", fixups=[])
app.config_from_object("django.conf:settings", namespace="CELERY")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m config.beat", description="Celery beat of the memory service")
    parser.add_argument("-l", "--loglevel", default="INFO")
    parser.add_argument("-s", "--schedule", help="schedule state file (default: CELERY_BEAT_SCHEDULE_FILENAME)")
    args = parser.parse_args(argv)
    app.Beat(loglevel=args.loglevel, schedule=args.schedule).run()


if __name__ == "__main__":
    main()
