"""daphne's app (and Twisted with it) is installed for `manage.py runserver` only (config.settings.base)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.conf import settings

from tests.conftest import service_env

# Each case is a fresh interpreter that sets Django up.
pytestmark = pytest.mark.slow

PROBE = (
    "import json, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "import django\n"
    "django.setup()\n"
    "from django.core.management import get_commands\n"
    "print(json.dumps([get_commands()['runserver'], 'twisted' in sys.modules]))\n"
)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["manage.py", "runserver"], ["daphne", True]),  # the ASGI development server, event stream included
        (["gunicorn"], ["django.contrib.staticfiles", False]),  # any server process: no Twisted
    ],
)
def test_daphne_only_for_runserver(argv: list[str], expected: list) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        env=service_env(DJANGO_SETTINGS_MODULE="config.settings.test", LOG_LEVEL="WARNING"),
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected
