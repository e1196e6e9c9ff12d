"""The limits are documented where callers look: the README's "Limits and quotas" table names every rate and quota
with its variable and default (the defaults of apps.limits.definitions), and /openapi.json declares 429 (with
Retry-After) on every operation that takes credentials and 403 quota_exceeded where a quota can refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from apps.limits.definitions import QUOTAS, RATES
from apps.limits.openapi import QUOTA_OPERATIONS

README = Path(settings.BASE_DIR) / "README.md"


def _limits_section() -> str:
    text = README.read_text()
    section = text[text.index("## Limits and quotas"):]
    return section[: section.index("\n## ", 1)]


def _human(amount: int, unit: str) -> str:
    if unit == "bytes":
        for suffix, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if amount % size == 0:
                return f"{amount // size} {suffix}"
    return f"{amount:,}"


def test_the_readme_table_names_every_limit_with_its_default_and_variable() -> None:
    rows = {line.split("|")[1].strip(): line for line in _limits_section().splitlines() if line.startswith("| ")}
    for rate in RATES.values():
        row = rows[rate.kind]
        assert f"{rate.per_minute} per minute, burst {rate.burst}" in row, row
        assert f"`{rate.per_minute_setting}`" in row and f"`{rate.burst_setting}`" in row, row
    for quota in QUOTAS.values():
        row = rows[quota.name]
        assert f"| {_human(quota.default, quota.unit)} |" in row, row
        assert f"`{quota.setting}`" in row, row


def test_the_settings_default_to_the_definitions() -> None:
    from config.settings import base

    for rate in RATES.values():
        assert getattr(base, rate.per_minute_setting) == rate.per_minute
        assert getattr(base, rate.burst_setting) == rate.burst
    for quota in QUOTAS.values():
        assert getattr(base, quota.setting) == quota.default
        assert getattr(settings, quota.setting) == quota.default  # the test settings keep the quotas' defaults


@pytest.mark.django_db
def test_the_schema_declares_rate_limits_and_quotas(api) -> None:
    schema = api.get("/openapi.json").json()
    default_security = schema.get("security")
    checked = 0
    for path, item in schema["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in item.items():
            if method not in {"get", "put", "post", "patch", "delete"}:
                continue
            if path == "/v1/events":  # a stream, bounded by SSE_MAX_CONNECTIONS_PER_USER instead
                assert "429" not in operation["responses"]
            elif any(operation.get("security", default_security) or []):
                limited = operation["responses"]["429"]
                assert "Retry-After" in limited["headers"], (method, path)
                checked += 1
    assert checked > 30
    for (method, path), quotas in QUOTA_OPERATIONS.items():
        description = schema["paths"][path][method]["responses"]["403"]["description"]
        assert "quota_exceeded" in description and all(quota in description for quota in quotas), (method, path)
