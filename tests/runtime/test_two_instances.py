"""Two instances of the service on one database and one Valkey (issue 32): each a host of its own (its own data
directory, so nothing is shared by accident) given what README "Several hosts" says hosts share: the secrets
(SECRET_KEY, MEMORY_ENCRYPTION_KEYS), the dev IdP's key file and issuer, and the attachment storage (one directory
standing for a volume both mount). Each instance is a web process (tests/live_service.py) and a Celery worker with
its beat (tests/celery_workers.py); the beats elect one leader.

What must hold: a token from either instance works on both; a memory PUT on one is read and found on the other; an
event published by one reaches a stream on the other, and a stream resumed on the other replays what was missed; a
signed link made on one downloads from the other; with both workers running each memory is embedded once; a killed
worker's claims are taken over by the other instance's worker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests
from django.conf import settings

from apps.identity.dev_idp import keys
from apps.memories.models import IndexStatus, Memory
from tests.celery_workers import broker_url, kill_group, start_worker, wait_for
from tests.events.conftest import SSEClient
from tests.live_service import LiveService

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]  # two web servers, workers and beats

NS = ["user", "bob", "hosts"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict:
    """What every process of both instances is given alike (README "Several hosts")."""
    keys.signing_key()  # the key file both instances read
    return {
        "broker": broker_url(),
        "env": {
            "SECRET_KEY": settings.SECRET_KEY,
            "MEMORY_ENCRYPTION_KEYS": settings.MEMORY_ENCRYPTION_KEYS,
            "DEV_IDP_SIGNING_KEY_FILE": str(keys.key_path()),
            "DEV_IDP_ISSUER": "http://memory.example/dev-idp",
            "ATTACHMENT_DIR": str(tmp_path_factory.mktemp("shared-attachments")),
            "MEMORY_EPISODIC_INDEXING_INTERVAL": "2",
        },
        "root": tmp_path_factory.mktemp("hosts"),
    }


def _worker(shared, name: str, **env: str):
    host = "a" if name.startswith("a") else "b"
    return start_worker(
        shared["root"], name, shared["broker"], **{**shared["env"], "DATA_DIR": str(shared["root"] / host), **env}
    )


@pytest.fixture(scope="module")
def instances(shared, django_db_setup, django_db_blocker) -> Iterator[tuple[LiveService, LiveService, tuple]]:
    """Both web processes, and instance a's first worker: one that claims a batch and then embeds "slowly" (a
    five-minute model), booted beside the web processes (for the first test, which kills it)."""
    webs, slow = [], None
    try:
        with django_db_blocker.unblock():
            for name in ("a", "b"):
                env = {**shared["env"], "DATA_DIR": str(shared["root"] / name), "REDIS_URL": shared["broker"]}
                webs.append(LiveService(extra_env=env).launch())
            slow = _worker(shared, "a-slow", EMBEDDING_HASH_DELAY_SECONDS="300")
        for web in webs:
            web.wait_ready()
        yield webs[0], webs[1], slow
    finally:
        if slow is not None:
            kill_group(slow[0])
        for web in webs:
            web.stop()
        redis.Redis.from_url(shared["broker"]).flushdb()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _put(web: LiveService, token: str, key: str, text: str) -> None:
    body = {"namespace": NS, "key": key, "value": {"text": text}, "index": {"text": text}}
    status, answer = web.request("PUT", "/v1/memories", body, headers=_auth(token))
    assert status == 200, answer


def _found(web: LiveService, token: str, query: str) -> set[str]:
    body = {"namespace_prefix": NS, "query": query, "search_type": "semantic", "limit": 100}  # what was embedded
    status, answer = web.request("POST", "/v1/memories/search", body, headers=_auth(token))
    assert status == 200, answer
    return {item["key"] for item in answer["items"]}


def test_a_killed_workers_claims_are_taken_over_and_each_memory_is_embedded_once(instances, shared) -> None:
    """First in the module: instance a's slow worker must have claimed nothing before."""
    a, b, (slow, slow_log) = instances
    bob = a.token("bob")
    workers = [slow]
    logs: list[Path] = [slow_log]
    try:
        # Instance a's worker claims what is pending at its next cycle, then embeds it "slowly" (a cycle may start
        # between two of these writes: the rest waits for a worker that is free).
        for index in range(5):
            _put(a, bob, f"crash-{index}", f"lighthouse keeper diary entry {index}")
        crash = Memory.objects.filter(key__startswith="crash-")
        wait_for(lambda: crash.filter(index_attempts=1).exists(), 90, "instance a's worker to claim a batch", logs)
        time.sleep(0.5)  # its claiming transaction is over: the worker now sleeps in the "model"
        claimed = set(crash.filter(index_attempts=1).values_list("key", flat=True))

        # Instance b's worker, and instance a's worker restarted: while the slow one lives, they leave its claims.
        for name in ("b", "a"):
            process, log = _worker(shared, name)
            workers.append(process)
            logs.append(log)
        wait_for(lambda: all(b"succeeded" in log.read_bytes() for log in logs[1:]), 90, "both workers to run", logs)
        assert not crash.filter(key__in=claimed, index_status=IndexStatus.INDEXED).exists()

        kill_group(slow)  # kill -9 mid-batch
        workers.remove(slow)
        recovered = wait_for(
            lambda: crash.filter(index_status=IndexStatus.INDEXED).count() == 5,
            30, "the other workers to take the dead worker's claims over", logs,
        )  # fmt: skip
        print(f"claims taken over {recovered:.1f}s after kill -9")
        # Claimed twice (by the dead worker, then another), the others once.
        assert {key: attempts for key, attempts in crash.values_list("key", "index_attempts")} == {
            f"crash-{index}": 2 if f"crash-{index}" in claimed else 1 for index in range(5)
        }

        # Both instances' workers running: memories written on both are each embedded once, and found on either.
        for index in range(20):
            web = (a, b)[index % 2]
            _put(web, web.token("bob"), f"note-{index}", f"harbour note number {index}")
        notes = Memory.objects.filter(key__startswith="note-")
        wait_for(lambda: notes.filter(index_status=IndexStatus.INDEXED).count() == 20, 60, "every note indexed", logs)
        assert set(notes.values_list("index_attempts", flat=True)) == {1}
        assert {f"note-{index}" for index in range(20)} <= _found(b, b.token("bob"), "harbour note")
        assert "crash-3" in _found(a, bob, "lighthouse keeper diary")
    finally:
        for process in workers:
            kill_group(process)


def test_both_instances_are_ready_and_accept_each_others_tokens(instances) -> None:
    a, b, _ = instances
    for web in (a, b):
        status, body = web.request("GET", "/readyz")
        assert status == 200 and body["encryption_keys"]["ring"]["sound"] is True, body
    for issuer, verifier in ((a, b), (b, a)):
        status, me = verifier.request("GET", "/v1/me", headers=_auth(issuer.token("bob")))
        assert (status, me["userId"]) == (200, "bob"), me


def test_writes_events_and_links_cross_instances(instances) -> None:
    a, b, _ = instances
    bob_a, bob_b = a.token("bob"), b.token("bob")

    # PUT on one, GET on the other (decrypted with the shared key ring).
    _put(a, bob_a, "coffee", "bob likes a flat white")
    status, memory = b.request("GET", "/v1/memories?ns=user&ns=bob&ns=hosts&key=coffee", headers=_auth(bob_b))
    assert status == 200 and memory["value"] == {"text": "bob likes a flat white"}, memory

    # An event published by one instance reaches a stream on the other; a stream resumed on the first replays what
    # was published meanwhile.
    conversation = str(uuid.uuid4())
    status, _ = a.request("POST", f"/v1/conversations/{conversation}/entries",
                          {"content": [{"role": "USER", "text": "first"}]}, headers=_auth(bob_a))  # fmt: skip
    assert status == 201
    stream = SSEClient(b, "/v1/events?kinds=entry", _auth(bob_b))
    try:
        time.sleep(0.3)  # the stream's reader subscribed before the append below
        status, entry = a.request("POST", f"/v1/conversations/{conversation}/entries",
                                  {"content": [{"role": "USER", "text": "second"}]}, headers=_auth(bob_a))  # fmt: skip
        delivered = stream.next(timeout=10)
        while delivered.data["data"]["entryId"] != entry["id"]:  # the first append's event may come first
            delivered = stream.next(timeout=10)
    finally:
        stream.close()
    missed = []
    for text in ("third", "fourth"):
        status, entry = b.request("POST", f"/v1/conversations/{conversation}/entries",
                                  {"content": [{"role": "USER", "text": text}]}, headers=_auth(bob_b))  # fmt: skip
        missed.append(entry["id"])
    resumed = SSEClient(a, "/v1/events?kinds=entry", _auth(bob_a), last_event_id=delivered.id)
    try:
        assert [message.data["data"]["entryId"] for message in resumed.events(2, timeout=10)] == missed
    finally:
        resumed.close()

    # A signed link made on one instance downloads from the other (shared SECRET_KEY and attachment storage).
    upload = requests.post(f"{a.base_url}/v1/attachments", files={"file": ("notes.txt", b"shared notes")},
                           headers=_auth(bob_a), timeout=30)  # fmt: skip
    assert upload.status_code == 201, upload.text
    status, link = a.request("GET", f"/v1/attachments/{upload.json()['id']}/download-url", headers=_auth(bob_a))
    assert status == 200
    download = requests.get(b.base_url + link["url"], timeout=30)
    assert (download.status_code, download.content) == (200, b"shared notes"), download.text
