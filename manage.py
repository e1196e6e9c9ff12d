#!/usr/bin/env python
"""Django's command-line utility. Settings default to the embedded default (config.settings.embedded)."""

import os
import sys


def _take_policy_dir(argv: list[str]) -> list[str]:
    """Strip ``--policy-dir DIR`` / ``--policy-dir=DIR`` from anywhere in argv into SERVICE_POLICY_DIR (D4).

    Done before Django loads so settings see it, and through the environment so processes started from here
    (`manage.py up` → gunicorn, workers) inherit it."""
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--policy-dir":
            value = next(args, None)
            if value is None:
                sys.exit("manage.py: --policy-dir needs a directory")
            os.environ["SERVICE_POLICY_DIR"] = os.path.abspath(value)
        elif arg.startswith("--policy-dir="):
            value = arg.split("=", 1)[1]
            if not value:
                sys.exit("manage.py: --policy-dir needs a directory")
            os.environ["SERVICE_POLICY_DIR"] = os.path.abspath(value)
        else:
            rest.append(arg)
    return rest


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.embedded")
    argv = _take_policy_dir(sys.argv)
    from django.core.management import execute_from_command_line

    execute_from_command_line(argv)


if __name__ == "__main__":
    main()
