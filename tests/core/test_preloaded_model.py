"""gunicorn's master loads the local embedding model (on one torch thread, never running it) and its forked
workers adopt it: semantic searches embed in every worker, concurrently, without torch's thread pool hanging."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.live_service import LiveService

pytestmark = pytest.mark.django_db(transaction=True)


def test_forked_workers_embed_with_the_model_their_master_loaded(django_db_setup, tmp_path) -> None:
    from django.db import connection

    log_path = tmp_path / "web.log"
    service = LiveService(
        db_settings=connection.settings_dict,
        log_path=log_path,
        extra_env={"EMBEDDING_PROVIDER": "local", "LOG_LEVEL": "INFO"},
        workers=2,
    )
    service.start(timeout=120)
    try:
        headers = {"Authorization": f"Bearer {service.token('bob')}"}

        def search(i: int) -> tuple[int, str]:
            response = requests.post(
                f"{service.base_url}/v1/memories/search",
                json={"namespace_prefix": ["user", "bob"], "query": f"where do I keep my notes {i}"},
                headers=headers,
                timeout=60,
            )
            return response.status_code, response.text[:200]

        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(search, range(48)))
        assert {status for status, _ in results} == {200}, results[:3]
    finally:
        service.stop()
    loads = [json.loads(line) for line in log_path.read_text().splitlines() if '"embedding model loaded"' in line]
    # Both workers adopted the master's model (no worker read the weights again), and no worker loaded twice.
    assert len(loads) == 2, loads
    assert all(entry["inherited"] is True for entry in loads), loads
