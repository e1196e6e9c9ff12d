"""Shared fixtures. Tests talk HTTP to the service (DRF's APIClient through the full middleware stack) against the
real embedded PostgreSQL with pgvector; the session stops the embedded servers it started itself."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from config import embedded_services


def pytest_sessionfinish(session, exitstatus) -> None:
    if embedded_services.started_here:
        embedded_services.stop(only=set(embedded_services.started_here))


@pytest.fixture
def api() -> APIClient:
    """An anonymous client; see ``client_for`` in tests/core/conftest.py for authenticated ones."""
    return APIClient()
