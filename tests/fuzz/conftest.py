"""Schemathesis for this directory only: its plugin, the run's summary and clean-up. The live service it fuzzes is the
session fixture in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import may_select

# Every test of test_api_fuzz.py fuzzes the live service (marked live and django_db): a run whose -m deselects them
# does not import it, and so never loads Schemathesis (seconds of every process's start-up).
FUZZ_MODULE = "test_api_fuzz.py"
FUZZ_MARKERS = {"live", "django_db"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return True if collection_path.name == FUZZ_MODULE and not may_select(config, FUZZ_MARKERS) else None


def pytest_configure(config: pytest.Config) -> None:
    """Schemathesis's pytest plugin (pyproject.toml turns its auto-load off: as an entry-point plugin its modules were
    all assertion-rewritten in every run). pytest calls this when collection first reaches this directory, before
    its modules are collected, in every process that collects them (each pytest-xdist worker too): a run that
    collects no fuzz test never loads Schemathesis."""
    if not may_select(config, FUZZ_MARKERS):
        return
    from schemathesis.pytest import plugin

    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "schemathesis-fuzz")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Schemathesis names each operation's item (``test_api_as_admin[GET /healthz]``) but gives all of a test
    function's items that function's node id. pytest-xdist schedules by node id: it ran one item per fuzz test and
    reported the rest nowhere. Each item gets its name as its node id (tests/conftest.py stops a run where two
    items still share one)."""
    if not config.pluginmanager.has_plugin("schemathesis-fuzz"):
        return
    from schemathesis.pytest.plugin import SchemathesisFunction

    for item in items:
        if isinstance(item, SchemathesisFunction) and not item.nodeid.endswith(f"::{item.name}"):
            item._id = item.parent.id.child(item.name)


def pytest_terminal_summary(terminalreporter) -> None:
    """How many requests the fuzzer sent per operation and what came back: the figures CI logs keep."""
    from tests.fuzz.cases import STATS

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

    from apps.policy import reset_engine

    reset_engine()
    gc.collect()
