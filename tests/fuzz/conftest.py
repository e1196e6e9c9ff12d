"""The live service the fuzzer talks to: one gunicorn process for the session, on the session's test database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.live_service import LiveService


def pytest_configure(config) -> None:
    """Load Schemathesis's pytest plugin for this directory's runs only (pyproject.toml turns its auto-load off)."""
    from schemathesis.pytest import plugin

    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "schemathesis-fuzz")


@pytest.fixture(scope="session")
def live_service(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LiveService]:
    from django.db import connection

    # pytest-django has created the test database (for the django_db-marked tests); its name is in the connection's
    # settings from here on. Never let the live server (and the flush after it) near any other database.
    assert connection.settings_dict["NAME"].startswith("test_"), connection.settings_dict["NAME"]
    service = LiveService(db_settings=connection.settings_dict, log_path=tmp_path_factory.mktemp("live") / "web.log")
    service.start()
    try:
        yield service
    finally:
        # Before pytest-django drops the test database: the server's connections would block the DROP.
        service.stop()


def pytest_terminal_summary(terminalreporter) -> None:
    """How many requests the fuzzer sent per operation and what came back: the figures CI logs keep."""
    from tests.fuzz.test_api_fuzz import STATS

    if not STATS:
        return
    total = sum(sum(statuses.values()) for statuses in STATS.values())
    terminalreporter.write_sep("-", f"schemathesis: {total} requests over {len(STATS)} operations (both users)")
    for operation, statuses in sorted(STATS.items()):
        seen = ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items()))
        terminalreporter.write_line(f"{operation:45} {seen}")


def pytest_unconfigure(config) -> None:
    """Drop the policy engine while regopy can still free it: with Schemathesis and Hypothesis loaded, the engine
    otherwise lives until interpreter shutdown and regopy's __del__ prints ignored TypeErrors there."""
    import gc

    from apps.core.policy import reset_engine

    reset_engine()
    gc.collect()
