"""The fuzzing run's summary and clean-up; Schemathesis's plugin is registered by tests/conftest.py, the live service
it fuzzes is the session fixture there."""

from __future__ import annotations


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

    from apps.policy import reset_engine

    reset_engine()
    gc.collect()
