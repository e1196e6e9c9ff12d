"""The Celery worker of the service (Procfile: ``python -m config.worker``), started without Celery's command line.

``celery -A config worker`` (which works too) imports the whole CLI, and with it click-repl, prompt_toolkit and
pygments for ``celery shell``/``amqp``: 285 modules, ~13 MB in a process that only runs tasks (issue 12). This runs
``app.Worker`` as that command does, with the options the Procfile uses; anything else goes through ``celery``.
"""

from __future__ import annotations

import argparse
import sys

from config.celery import app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m config.worker", description="Celery worker of the memory service")
    parser.add_argument("-P", "--pool", default="threads", help="threads (default), solo or prefork")
    parser.add_argument("-c", "--concurrency", type=int, default=None)
    parser.add_argument("-l", "--loglevel", default="INFO")
    parser.add_argument("-n", "--hostname", default=None)
    args = parser.parse_args(argv)
    worker = app.Worker(
        pool_cls=args.pool, concurrency=args.concurrency, loglevel=args.loglevel, hostname=args.hostname
    )
    worker.start()
    sys.exit(worker.exitcode)


if __name__ == "__main__":
    main()
