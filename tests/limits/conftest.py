"""Helpers of the limits tests: a fresh user per test (rate buckets live in Valkey across tests), the real default
rates instead of the test settings' raised ones, and the counters of /metrics."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from apps.limits import config, rates
from apps.limits.definitions import RATES


@pytest.fixture
def fresh_user() -> Callable[[str], str]:
    """``fresh_user("name")``: a user id no other test (nor an earlier run against this Valkey) has used."""
    return lambda name="user": f"{name}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def real_rates(settings) -> None:
    """The default rates of apps.limits.definitions (the test settings raise them for the rest of the suite)."""
    for rate in RATES.values():
        setattr(settings, rate.per_minute_setting, rate.per_minute)
        setattr(settings, rate.burst_setting, rate.burst)


@pytest.fixture(autouse=True)
def _fresh_limits() -> None:
    """No override cached and no Valkey backoff left over from another test."""
    config.clear_cache()
    rates.reset()
    yield
    config.clear_cache()
    rates.reset()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


from tests.conversations.support import http  # noqa: E402,F401 - the live service's HTTP clients
