"""The shipped docker/compose.yaml is a multi-process deployment (issue 32): what its processes must share, they
share; what must run once, runs once. No Docker engine runs here, so the file is read as data; `docker-compose config`
and a check against the Compose Specification's JSON schema were run by hand (README "Several hosts")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.conf import settings

DOCKER = Path(settings.BASE_DIR) / "docker"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _env_file() -> dict[str, str]:
    """production.env as the example ships it (compose.yaml's env_file)."""
    values = {}
    for line in (DOCKER / "production.env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def _environment(service: dict) -> dict[str, str]:
    assert service.get("env_file") == "production.env"
    return {**_env_file(), **(service.get("environment") or {})}


def _mounts(service: dict) -> dict[str, str]:
    """Container path -> named volume."""
    mounts = {}
    for spec in service.get("volumes") or []:
        source, _, target = spec.partition(":")
        mounts[target.split(":")[0]] = source
    return mounts


def test_web_and_worker_share_the_attachment_storage(compose) -> None:
    """Web stores blobs, the worker's expiry sweep deletes them, and every web replica serves them: one volume
    mounted by both at ATTACHMENT_DIR, or S3 for both (issue 32.1: each container had a disk of its own)."""
    services = compose["services"]
    web, worker = _environment(services["web"]), _environment(services["worker"])
    if web.get("ATTACHMENT_STORAGE") == "s3" or worker.get("ATTACHMENT_STORAGE") == "s3":
        assert web.get("ATTACHMENT_STORAGE") == worker.get("ATTACHMENT_STORAGE") == "s3"
        assert web["ATTACHMENT_S3_BUCKET"] and web["ATTACHMENT_S3_BUCKET"] == worker["ATTACHMENT_S3_BUCKET"]
        return
    directory = web.get("ATTACHMENT_DIR")
    assert directory, "web keeps attachments in the container's own data directory"
    assert worker.get("ATTACHMENT_DIR") == directory
    volume = _mounts(services["web"]).get(directory)
    assert volume in (compose.get("volumes") or {}), f"{directory} of web is not a named volume"
    assert _mounts(services["worker"]).get(directory) == volume


def test_the_image_lets_the_service_user_write_the_shared_attachment_directory(compose) -> None:
    environment = _environment(compose["services"]["web"])
    if environment.get("ATTACHMENT_STORAGE") == "s3":
        pytest.skip("attachments on S3")
    directory = environment.get("ATTACHMENT_DIR")
    assert directory, "web keeps attachments in the container's own data directory"
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert f"mkdir -p {directory}" in dockerfile and "chown -R memory" in dockerfile


def test_migrations_run_once_before_any_process_starts(compose) -> None:
    services = compose["services"]
    migrate = services["migrate"]
    assert migrate["command"][-1] == "migrate" and migrate.get("restart") == "no"
    assert migrate["depends_on"]["db"] == {"condition": "service_healthy"}
    for name in ("web", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}, name
        assert "migrate" not in " ".join(services[name].get("command") or []), name
    # The image's default command (web) is gunicorn, never `manage.py up` (which would migrate again).
    assert "gunicorn" in (DOCKER / "Dockerfile").read_text().splitlines()[-1]


def test_every_process_reads_the_same_secrets(compose) -> None:
    """SECRET_KEY and MEMORY_ENCRYPTION_KEYS come from the one env file, never from a service of its own."""
    for name, service in compose["services"].items():
        if "build" not in service:
            continue
        assert service["env_file"] == "production.env", name
        own = service.get("environment") or {}
        assert not {"SECRET_KEY", "MEMORY_ENCRYPTION_KEYS", "ATTACHMENT_SIGNING_KEY"} & set(own), name
