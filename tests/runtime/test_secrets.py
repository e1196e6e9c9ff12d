"""Secrets across hosts (issue 32.2 and 32.4): next to a database other hosts may share, the service never generates a
secret of its own; production refuses to start without them; wherever they came from is said at start; the dev
IdP's signing key and issuer are settings several instances share."""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from apps.identity.dev_idp import keys
from apps.runtime import embedded_services
from tests.conftest import service_env

pytestmark = pytest.mark.slow  # each test starts Python processes that load the settings

EXTERNAL_DATABASE = "postgresql://memory@db.invalid:5432/memory_service"
KEYS = "k1:" + base64.b64encode(b"k" * 32).decode()


def _settings_process(module: str, data_dir: Path, code: str = "", **env: str) -> subprocess.CompletedProcess:
    """A fresh interpreter importing ``module`` with only ``env`` (and what a process needs) set."""
    script = f"import config.settings.{module} as s\n{code}"
    environment = service_env(
        DATA_DIR=str(data_dir), REDIS_URL="redis://redis.invalid:6379/0", DJANGO_SETTINGS_MODULE=f"config.settings.{module}",
        **env,
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", script], env=environment, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60
    )


def test_next_to_an_external_database_no_secret_is_generated(tmp_path) -> None:
    """Before: SECRET_KEY and MEMORY_ENCRYPTION_KEYS were generated into this host's data directory without a word,
    and the host then encrypted with a key no other host had."""
    refused = _settings_process("embedded", tmp_path, DATABASE_URL=EXTERNAL_DATABASE)
    assert refused.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is not set and DATABASE_URL names a database" in refused.stderr
    assert not list(tmp_path.iterdir())  # nothing written

    refused = _settings_process("embedded", tmp_path, DATABASE_URL=EXTERNAL_DATABASE, SECRET_KEY="s" * 50)
    assert refused.returncode != 0
    assert "ImproperlyConfigured: MEMORY_ENCRYPTION_KEYS is not set" in refused.stderr
    assert "the same on every host" in refused.stderr
    assert not list(tmp_path.iterdir())

    started = _settings_process(
        "embedded", tmp_path, "print(s.SECRET_SOURCES)", DATABASE_URL=EXTERNAL_DATABASE, SECRET_KEY="s" * 50,
        MEMORY_ENCRYPTION_KEYS=KEYS,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == str({"SECRET_KEY": "environment", "MEMORY_ENCRYPTION_KEYS": "environment"})


def test_files_of_the_data_directory_are_used_and_said_loudly(tmp_path) -> None:
    (tmp_path / "secret-key").write_text("s" * 50)
    (tmp_path / "encryption-keys").write_text(KEYS)
    code = (
        "import django\ndjango.setup()\nfrom apps.runtime import startup\nstartup.log_secret_sources()\n"
        "print(s.SECRET_KEY == 's' * 50, s.MEMORY_ENCRYPTION_KEYS == " + repr(KEYS) + ")\n"
    )
    started = _settings_process("embedded", tmp_path, code, DATABASE_URL=EXTERNAL_DATABASE, DEV_IDP_ENABLED="false")
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip().splitlines()[-1] == "True True"
    [line] = [json.loads(line) for line in started.stderr.splitlines() if "secret" in line]
    assert line["level"] == "WARNING" and "every host sharing this database needs the same values" in line["message"]
    assert line["secret_sources"] == {
        "SECRET_KEY": f"file {tmp_path / 'secret-key'}",
        "MEMORY_ENCRYPTION_KEYS": f"file {tmp_path / 'encryption-keys'}",
    }


def test_generate_secrets_true_generates_them_loudly(tmp_path) -> None:
    code = "import django\ndjango.setup()\nfrom apps.runtime import startup\nstartup.log_secret_sources()\n"
    started = _settings_process(
        "embedded", tmp_path, code, DATABASE_URL=EXTERNAL_DATABASE, GENERATE_SECRETS="true", DEV_IDP_ENABLED="false"
    )
    assert started.returncode == 0, started.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["encryption-keys", "secret-key"]
    [line] = [json.loads(line) for line in started.stderr.splitlines() if "secret" in line]
    assert line["level"] == "WARNING"
    assert line["secret_sources"]["SECRET_KEY"] == f"generated {tmp_path / 'secret-key'}"


@pytest.mark.django_db
def test_the_embedded_database_is_recognised_by_its_socket() -> None:
    from django.db import connection

    from tests.live_service import database_url

    host = connection.settings_dict.get("HOST") or ""
    if not host.startswith("/") or not embedded_services.is_embedded_database(database_url(connection.settings_dict)):
        pytest.skip("the tests run on an external DATABASE_URL")
    assert not embedded_services.is_embedded_database(EXTERNAL_DATABASE)
    assert not embedded_services.is_embedded_database("postgresql://x@/db?host=/tmp/elsewhere")
    assert not embedded_services.is_embedded_database("not a url ===")


def test_production_refuses_the_dev_idp_without_a_shared_key_and_issuer(tmp_path) -> None:
    essentials = {
        "DATABASE_URL": EXTERNAL_DATABASE, "SECRET_KEY": "s" * 50, "MEMORY_ENCRYPTION_KEYS": KEYS,
        "OIDC_AUDIENCE": "memory-service", "DEV_IDP_ENABLED": "true", "DEV_IDP_ALLOW_IN_PRODUCTION": "true",
    }  # fmt: skip
    refused = _settings_process("production", tmp_path, **essentials)
    assert "ImproperlyConfigured: DEV_IDP_ISSUER must be set in production" in refused.stderr
    key_file = tmp_path / "shared" / "dev-idp.pem"
    refused = _settings_process(
        "production", tmp_path, DEV_IDP_ISSUER="https://memory.example/dev-idp", DEV_IDP_SIGNING_KEY_FILE=str(key_file),
        **essentials,
    )  # fmt: skip
    assert "production never generates one" in refused.stderr
    made = subprocess.run(
        [sys.executable, "-m", "apps.identity.dev_idp.keys", "create", str(key_file)],
        env=service_env(), cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert key_file.stat().st_mode & 0o777 == 0o600
    started = _settings_process(
        "production", tmp_path, "print(s.SECRET_SOURCES['DEV_IDP_SIGNING_KEY_FILE'])",
        DEV_IDP_ISSUER="https://memory.example/dev-idp", DEV_IDP_SIGNING_KEY_FILE=str(key_file), **essentials,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == f"file {key_file}"


def test_instances_with_their_own_data_directories_share_the_dev_idp_key_file(tmp_path) -> None:
    """DEV_IDP_SIGNING_KEY_FILE: one key for instances whose data directories differ (issue 32.4)."""
    shared = tmp_path / "shared.pem"
    keys.create(shared)
    kids = set()
    try:
        for host in ("a", "b"):
            with override_settings(DATA_DIR=tmp_path / host, DEV_IDP_SIGNING_KEY_FILE=str(shared)):
                keys._loaded.clear()
                kids.add(keys.signing_key().kid)
                assert not (tmp_path / host).exists()  # nothing generated beside it
    finally:
        keys._loaded.clear()
    assert len(kids) == 1


def test_a_missing_dev_idp_key_is_not_generated_where_secrets_may_not_be(tmp_path, caplog) -> None:
    from apps.runtime import startup

    missing = tmp_path / "missing.pem"
    try:
        with override_settings(DEV_IDP_SIGNING_KEY_FILE=str(missing), SECRETS_MAY_BE_GENERATED=False):
            keys._loaded.clear()
            with pytest.raises(ImproperlyConfigured, match="DEV_IDP_SIGNING_KEY_FILE"):
                startup.check_dev_idp_key()  # the web process stops at start
            with pytest.raises(ImproperlyConfigured):
                keys.signing_key()
            assert not missing.exists()
        with override_settings(DEV_IDP_SIGNING_KEY_FILE=str(missing), SECRETS_MAY_BE_GENERATED=True):
            with caplog.at_level(logging.INFO, logger="apps.runtime.startup"):
                startup.check_dev_idp_key()
                assert keys.signing_key().kid
            assert missing.exists()
    finally:
        keys._loaded.clear()
