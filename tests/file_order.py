"""The order xdist hands test files out in (a plugin of tests/conftest.py)."""

from __future__ import annotations

from collections import Counter

import pytest

# What a test costs on average by its markers, in seconds on a 2-core machine (a full run, 2026-12: live, slow and
# model tests 1-10 s each, the others 0.05-0.15 s). Only the order of files it gives matters.
HEAVY_TEST_SECONDS = 3.0
LIGHT_TEST_SECONDS = 0.08
HEAVY_MARKERS = ("live", "slow", "model")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's; it would sort files by their number of tests
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)  # after -m has deselected and tests/conftest.py has marked
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The most expensive files first, so that xdist's ``loadfile`` hands the cheap ones out last and its workers
    finish together. xdist's own order (most tests first) put a file of eight model tests (a minute) at the very end
    of a run, on one worker, while the others idled."""
    cost: Counter[str] = Counter()
    for item in items:
        heavy = any(item.get_closest_marker(name) for name in HEAVY_MARKERS)
        cost[file_of(item)] += HEAVY_TEST_SECONDS if heavy else LIGHT_TEST_SECONDS
    items.sort(key=lambda item: -cost[file_of(item)])  # stable: a file's tests keep their order


def file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]
