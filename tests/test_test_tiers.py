"""The fast tier (README, testing): a session loads and starts only what its collected tests need (tests/conftest.py,
tests/fuzz/conftest.py), and ``-m`` is read right about what it can select."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.conftest import may_select, service_env

FAST = "not live and not slow and not model"


def _config(markexpr: str) -> SimpleNamespace:
    return SimpleNamespace(option=SimpleNamespace(markexpr=markexpr))


@pytest.mark.parametrize(
    ("markexpr", "markers", "expected"),
    [
        ("", {"model"}, True),
        (FAST, {"model"}, False),
        (FAST, {"live", "django_db"}, False),
        ("not live", {"model"}, True),
        ("not live", {"live", "django_db"}, False),
        ("live", {"live", "django_db"}, True),
        ("model or slow", {"model"}, True),
        ("not model", {"model"}, False),
        ("django_db and not live", {"live", "django_db"}, False),
        ("not live or flaky", {"live", "django_db"}, True),  # a marker it knows nothing of: it may
    ],
)
def test_what_an_m_expression_can_select(markexpr: str, markers: set[str], expected: bool) -> None:
    assert may_select(_config(markexpr), markers) is expected


SESSION = """
import json, sys
import pytest

code = pytest.main(sys.argv[1:])
loaded = {name: name in sys.modules for name in ("schemathesis", "hypothesis", "torch")}
print("MODULES " + json.dumps({"exit": int(code), **loaded}))
"""


@pytest.mark.slow
def test_a_session_of_tests_that_need_no_database_starts_none_and_loads_no_fuzzer_or_torch(tmp_path: Path) -> None:
    """A clean data directory (a clean clone's): the fast tier over a database-free test file and tests/fuzz (the
    fuzzer's own unit tests run, the live fuzzing is deselected) initialises no PostgreSQL, registers no
    Schemathesis and imports no torch or Hypothesis."""
    result = subprocess.run(
        [
            sys.executable, "-c", SESSION, "-q", "-p", "no:cacheprovider", "-m", FAST,
            "tests/core/test_renderers.py", "tests/fuzz",
        ],
        cwd=settings.BASE_DIR,
        env=service_env(DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="config.settings.test"),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("MODULES ")]
    assert lines, result.stdout[-3000:] + result.stderr[-3000:]
    outcome = json.loads(lines[-1].removeprefix("MODULES "))
    assert outcome == {"exit": 0, "schemathesis": False, "hypothesis": False, "torch": False}, result.stdout[-3000:]
    assert not (tmp_path / "postgres" / "PG_VERSION").exists()
