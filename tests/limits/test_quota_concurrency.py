"""Quotas under 40 real concurrent HTTP clients against the live server (issue 28 item 2: "concurrent writers cannot
overshoot"): exactly as many writes succeed as the quota admits, the rest are 403 quota_exceeded, never a 5xx,
and the kept totals equal what is stored."""

# ruff: noqa: B008 - each call binds its own client (own connection) as a default argument, on purpose

from __future__ import annotations

import random
import uuid

import pytest
import requests

from apps.limits import services
from tests.concurrency import run_concurrently
from tests.conversations.support import assert_no_5xx, count, statuses

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 40


def _refusals_are_quota(responses: list[requests.Response], quota: str) -> None:
    for response in responses:
        if response.status_code == 403:
            assert response.json()["code"] == "quota_exceeded" and response.json()["details"]["quota"] == quota


def _put(client, user: str, key: str, value: object) -> requests.Response:
    return client.request("PUT", "/v1/memories", {"namespace": ["user", user, "c"], "key": key, "value": value})


def test_concurrent_new_memories_stop_exactly_at_the_quota(http, fresh_user) -> None:
    user = fresh_user("racer")
    services.set_limits(user, {"memories": 10})
    responses = run_concurrently([lambda i=i, c=http(user): _put(c, user, f"k{i}", {"i": i}) for i in range(CLIENTS)])
    assert_no_5xx(responses)
    assert statuses(responses) == [200] * 10 + [403] * (CLIENTS - 10)
    _refusals_are_quota(responses, "memories")
    assert count("memories", "state = 'active' AND namespace[2] = %s", [user]) == 10
    assert services.recount(user)["memories"] == (10, 10)


def test_concurrent_memory_bytes_stop_exactly_at_the_quota(http, client_for, fresh_user) -> None:
    user = fresh_user("bytes")
    # In this process: the live server reads the user's limits (and keeps them LIMITS_CACHE_SECONDS) only once
    # they are set.
    probe = client_for(user).put(
        "/v1/memories", {"namespace": ["user", user, "c"], "key": "probe", "value": {"text": "p" * 2000}}, format="json"
    )
    assert probe.status_code == 200
    size = services.usage(user)["memory_bytes"]
    services.set_limits(user, {"memory_bytes": 6 * size + size // 2})  # the probe and five more
    responses = run_concurrently(
        [lambda i=i, c=http(user): _put(c, user, f"k{i}", {"text": "v" * 2000}) for i in range(CLIENTS)]
    )
    assert_no_5xx(responses)
    assert statuses(responses) == [200] * 5 + [403] * (CLIENTS - 5)
    _refusals_are_quota(responses, "memory_bytes")
    assert services.recount(user)["memory_bytes"] == (6 * size, 6 * size)


def test_concurrent_churn_keeps_the_totals_exact(http, fresh_user) -> None:
    """Adds, replacements of other sizes and deletes of a few shared keys, at once: the kept totals never drift."""
    user = fresh_user("churn")

    def churn(seed: int, client) -> None:
        rng = random.Random(seed)
        for _ in range(8):
            key = f"k{rng.randrange(6)}"
            if rng.random() < 0.3:
                client.delete(f"/v1/memories?ns=user&ns={user}&ns=c&key={key}")
            else:
                _put(client, user, key, {"text": "x" * rng.randrange(1, 3000)})

    run_concurrently([lambda i=i, c=http(user): churn(i, c) for i in range(32)])
    before_and_counted = services.recount(user)
    assert before_and_counted["memories"][0] == before_and_counted["memories"][1]
    assert before_and_counted["memory_bytes"][0] == before_and_counted["memory_bytes"][1]


def test_concurrent_conversation_creates_stop_exactly_at_the_quota(http, fresh_user) -> None:
    user = fresh_user("creator")
    services.set_limits(user, {"conversations": 7})
    responses = run_concurrently([
        lambda i=i, c=http(user): (
            c.post("/v1/conversations", {"title": f"c{i}"}) if i % 2
            else c.post(f"/v1/conversations/{uuid.uuid4()}/entries", {"content": [{"role": "USER", "text": "hi"}]})
        )
        for i in range(CLIENTS)
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * 7 + [403] * (CLIENTS - 7)
    _refusals_are_quota(responses, "conversations")
    assert count("conversations", "owner_user_id = %s AND deleted_at IS NULL", [user]) == 7


def test_concurrent_entries_stop_exactly_at_the_bytes_quota(http, client_for, fresh_user) -> None:
    user = fresh_user("chatty")
    client = client_for(user)  # in this process, as above
    conversation = client.post("/v1/conversations", {}, format="json").json()["id"]
    path = f"/v1/conversations/{conversation}/entries"
    assert client.post(path, {"content": [{"role": "USER", "text": "e" * 3000}]}, format="json").status_code == 201
    size = services.usage(user)["entry_bytes"]
    services.set_limits(user, {"entry_bytes": 4 * size + size // 2})
    responses = run_concurrently([
        lambda c=http(user): c.post(path, {"content": [{"role": "USER", "text": "e" * 3000}]}) for _ in range(CLIENTS)
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * 3 + [403] * (CLIENTS - 3)
    _refusals_are_quota(responses, "entry_bytes")
    assert count("conversation_entries", "conversation_id = %s", [conversation]) == 4


def test_concurrent_member_adds_stop_exactly_at_the_quota(http, fresh_user) -> None:
    owner = fresh_user("host")
    services.set_limits(owner, {"members_per_conversation": 10})
    conversation = http(owner).post("/v1/conversations", {}).json()["id"]
    path = f"/v1/conversations/{conversation}/memberships"
    responses = run_concurrently([
        lambda i=i, c=http(owner): c.post(path, {"userId": f"guest-{i}", "accessLevel": "reader"})
        for i in range(CLIENTS)
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * 9 + [403] * (CLIENTS - 9)  # the owner is the tenth
    _refusals_are_quota(responses, "members_per_conversation")
    assert count("conversation_memberships m JOIN conversations c ON c.root_id = m.root_id", "c.id = %s",
                 [conversation]) == 10


def test_concurrent_uploads_stop_exactly_at_the_quotas(live_service, http, fresh_user) -> None:
    user = fresh_user("uploader")
    services.set_limits(user, {"attachments": 6, "attachment_bytes": 5 * 1000 + 500})
    token = http(user).session.headers["Authorization"]

    def upload() -> requests.Response:
        files = {"file": ("f.bin", b"\x02" * 1000, "application/octet-stream")}
        return requests.post(f"{live_service.base_url}/v1/attachments", files=files,
                             headers={"Authorization": token}, timeout=60)

    responses = run_concurrently([upload for _ in range(32)])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * 5 + [403] * 27
    refused = {response.json()["details"]["quota"] for response in responses if response.status_code == 403}
    assert refused <= {"attachments", "attachment_bytes"}
    assert count("attachments", "user_id = %s", [user]) == 5
    assert services.recount(user)["attachment_bytes"] == (5000, 5000)
