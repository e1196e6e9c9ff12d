"""README "Several hosts" (issue 32.4 and 32.6): what hosts must share and run once, and the connection budget per
instance, stated with the defaults the code has (a changed default that the README does not follow fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings

BASE = Path(settings.BASE_DIR)


@pytest.fixture(scope="module")
def readme() -> str:
    return (BASE / "README.md").read_text()


def _section(readme: str, title: str) -> str:
    start = readme.index(f"### {title}\n")
    end = readme.find("\n## ", start)
    following = readme.find("\n### ", start + 1)
    return readme[start : min(value for value in (end, following) if value != -1)]


def _configuration_table(readme: str) -> str:
    return readme[readme.index("## Configuration\n") :]


def test_the_section_says_what_hosts_share_and_what_runs_once(readme: str) -> None:
    section = _section(readme, "Several hosts")
    for needle in (
        "DATABASE_URL", "REDIS_URL", "ATTACHMENT_STORAGE=s3", "ATTACHMENT_DIR", "SECRET_KEY", "MEMORY_ENCRYPTION_KEYS",
        "DEV_IDP_ISSUER", "DEV_IDP_SIGNING_KEY_FILE", "migrate", "--no-migrate", "Beat", "no sticky sessions",
        "/metrics", "per instance", "encryption_key_ring", "blob_missing",
    ):  # fmt: skip
        assert needle in section, needle


def test_the_connection_budget_matches_the_defaults(readme: str) -> None:
    """Finding 6: each instance holds WEB_CONCURRENCY x WSGI_THREADS + CELERY_CONCURRENCY sessions, kept
    DB_CONN_MAX_AGE, and neither the budget nor the setting was written down."""
    section = _section(readme, "Several hosts")
    procfile = (BASE / "Procfile").read_text()
    web = int(re.search(r"\$\{WEB_CONCURRENCY:-(\d+)\}", procfile).group(1))
    celery = int(re.search(r"\$\{CELERY_CONCURRENCY:-(\d+)\}", procfile).group(1))
    threads = int(re.search(r'env_int\("WSGI_THREADS", (\d+)\)', (BASE / "config" / "asgi.py").read_text()).group(1))
    assert "`WEB_CONCURRENCY` \N{MULTIPLICATION SIGN} `WSGI_THREADS`" in section and "`CELERY_CONCURRENCY`" in section
    assert f"{web} \N{MULTIPLICATION SIGN} {threads} + {celery} = {web * threads + celery}" in section
    assert f"`DB_CONN_MAX_AGE` ({settings.DB_CONN_MAX_AGE} s)" in section
    for needle in ("transaction mode", "DB_PREPARED_STATEMENTS=false", "session mode"):
        assert needle in section, needle


def test_every_setting_of_several_hosts_is_in_the_configuration_table(readme: str) -> None:
    table = _configuration_table(readme)
    for name in (
        "DB_CONN_MAX_AGE", "GENERATE_SECRETS", "DEV_IDP_ISSUER", "DEV_IDP_SIGNING_KEY_FILE", "BEAT_LEADER_LOCK_TTL_SECONDS",
        "BEAT_LEADER_LOCK_KEY", "ENCRYPTION_KEY_RING_HEARTBEAT_SECONDS",
    ):  # fmt: skip
        assert f"`{name}`" in table, name
        assert hasattr(settings, name), name


def test_key_rotation_is_documented_in_two_phases(readme: str) -> None:
    section = _section(readme, "Key rotation")
    assert "1. **Add**" in section and "2. **Promote**" in section and "rotate_encryption_key" in section
