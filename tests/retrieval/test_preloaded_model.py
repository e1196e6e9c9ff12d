"""The real stack with the local model: gunicorn's master loads the query runtime (onnxruntime, one thread, never
run) and its forked workers adopt it; the Celery worker embeds documents. Semantic searches embed in every web
worker, concurrently, and no process of the stack maps libtorch (only the one-off ONNX export imports torch)."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from django.conf import settings

from tests.celery_workers import broker_url, kill_group, start_worker, wait_for
from tests.live_service import LiveService

# Web servers and workers of their own, embedding with the real model.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live, pytest.mark.model]

NS = ["user", "bob", "kitchen"]


def mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_web_and_worker_embed_on_onnxruntime_without_torch(django_db_setup, tmp_path) -> None:
    from django.db import connection

    broker = broker_url()
    log_path = tmp_path / "web.log"
    service = LiveService(
        db_settings=connection.settings_dict,
        log_path=log_path,
        # The web server and the worker on one broker: each PUT's indexing request reaches the worker at once.
        # Searches find only what the worker embedded (none embeds what is still waiting for it: read your writes),
        # so the worker's encoder is the one that made the documents' vectors.
        extra_env={"EMBEDDING_PROVIDER": "local", "LOG_LEVEL": "INFO", "REDIS_URL": broker,
                   "MEMORY_SEARCH_PENDING_LIMIT": "0"},
        workers=2,
    )
    worker = None
    service.start(timeout=120)
    try:
        worker, worker_log = start_worker(
            tmp_path, "embedder", broker, beat=False, procfile_command=True,
            EMBEDDING_PROVIDER="local", EMBEDDING_ONNX_DIR=str(settings.EMBEDDING_ONNX_DIR),
        )  # fmt: skip
        headers = {"Authorization": f"Bearer {service.token('bob')}"}
        texts = {
            "cooking": "Boil the spaghetti for nine minutes, then toss it with garlic and olive oil.",
            "finance": "Shares of technology companies dropped after the central bank raised interest rates.",
            "sport": "The striker scored twice in the second half to win the championship match.",
        }
        for key, text in texts.items():
            body = {"namespace": NS, "key": key, "value": {"t": 1}, "index": {"text": text}}
            assert requests.put(f"{service.base_url}/v1/memories", json=body, headers=headers, timeout=30).ok

        def search(query: str) -> list[str]:
            response = requests.post(
                f"{service.base_url}/v1/memories/search",
                json={"namespace_prefix": ["user", "bob"], "query": query},
                headers=headers,
                timeout=60,
            )
            assert response.status_code == 200, response.text[:300]
            return [item["key"] for item in response.json()["items"]]

        # The worker embedded the documents, a web worker the query: the paraphrase ranks first.
        wait_for(lambda: len(search("how do I prepare noodles for dinner?")) == 3, 120, "the worker to index",
                 [worker_log, log_path])  # fmt: skip
        assert search("how do I prepare noodles for dinner?")[0] == "cooking"
        assert search("stock prices fell because of monetary policy")[0] == "finance"
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(search, [f"football game result {i}" for i in range(48)]))
        assert all(keys[0] == "sport" for keys in results), results[:3]

        web = [service.process.pid, *service.worker_pids()]
        for pid in [*web, worker.pid]:
            maps = mapped_libraries(pid)
            assert "libtorch" not in maps, f"process {pid} maps libtorch"
        for pid in [*service.worker_pids(), worker.pid]:
            assert "libonnxruntime" in mapped_libraries(pid), f"process {pid} does not embed with onnxruntime"
    finally:
        if worker is not None:
            kill_group(worker)
        service.stop()
    loads = [json.loads(line) for line in log_path.read_text().splitlines() if '"embedding model loaded"' in line]
    # Both workers adopted the master's session (no worker read the model again), and no worker loaded twice.
    assert len(loads) == 2, loads
    assert all(entry["inherited"] is True and entry["backend"] == "onnx" for entry in loads), loads


def test_a_process_that_embeds_imports_no_torch(django_db_setup) -> None:
    """The service's own import path (Django set up, policies evaluated, then queries, chunks and documents
    embedded) in a fresh process: torch is neither imported nor mapped."""
    from django.db import connection

    from tests.live_service import database_url

    script = """
import json, os, sys
import django
django.setup()
from apps.policy import get_engine
get_engine().authorize({"operation": "get", "namespace": ["user", "bob"], "user": {"id": "bob", "roles": []}})
from apps.retrieval.embeddings import get_provider
provider = get_provider()
assert provider.name == "local", provider
vector = provider.embed_query("what coffee does bob drink?")
pieces = provider.chunk("a long text about coffee. " * 200)
documents = provider.embed_documents(pieces)
maps = open("/proc/self/maps").read()
print(json.dumps({"torch": "torch" in sys.modules, "libtorch": "libtorch" in maps,
                  "onnxruntime": "libonnxruntime" in maps, "pieces": len(pieces), "dim": len(vector)}))
"""
    from tests.conftest import service_env

    env = service_env(
        DJANGO_SETTINGS_MODULE="config.settings.embedded",
        DATABASE_URL=database_url(connection.settings_dict),
        REDIS_URL=settings.REDIS_URL,
        DATA_DIR=str(settings.DATA_DIR),
        EMBEDDING_PROVIDER="local",
        EMBEDDING_ONNX_DIR=str(settings.EMBEDDING_ONNX_DIR),
    )
    done = subprocess.run(
        [settings.BASE_DIR / ".venv/bin/python", "-c", script], env=env, cwd=settings.BASE_DIR,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"torch": False, "libtorch": False, "onnxruntime": True, "pieces": report["pieces"], "dim": 384}
    assert report["pieces"] > 1


def test_a_gpu_device_without_cuda_stops_the_worker_and_the_web_server(django_db_setup, tmp_path) -> None:
    """This machine has no usable GPU: a worker told to embed on one refuses to start, saying why, and so does a
    web server told to embed queries on one (by default it stays on the CPU)."""
    from django.db import connection

    worker, log = start_worker(
        tmp_path, "gpu", broker_url(), beat=False, procfile_command=True,
        EMBEDDING_PROVIDER="local", EMBEDDING_DEVICE="cuda",
    )  # fmt: skip
    try:
        worker.wait(timeout=120)
    except subprocess.TimeoutExpired:
        kill_group(worker)
        pytest.fail(f"the worker kept running:\n{log.read_text()[-3000:]}")
    output = log.read_text()
    assert worker.returncode != 0
    assert "embedding device 'cuda' is not available on this machine" in output, output[-3000:]
    assert "CPU-only build" in output or "sees no GPU" in output or "not installed" in output, output[-3000:]

    service = LiveService(
        db_settings=connection.settings_dict,
        log_path=tmp_path / "web.log",
        extra_env={"EMBEDDING_PROVIDER": "local", "EMBEDDING_QUERY_DEVICE": "cuda"},
    )
    with pytest.raises(RuntimeError, match="embedding device 'cuda' is not available"):
        service.start(timeout=120)
