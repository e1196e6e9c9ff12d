"""apps.events.publisher in-process: who receives what, after commit only, and a failing Redis never fails a write.
Also the OpenAPI description of GET /v1/events."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import redis
from django.db import connection, transaction

from apps.core.redis_client import get_client
from apps.events import publisher, streams
from tests.events.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_publisher")]


def _conversation(members: dict[str, str]) -> str:
    """A conversation row and its memberships, inserted like the conversations and sharing apps do."""
    conversation_id = str(uuid.uuid4())
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO conversations (id, root_id, owner_user_id, title, metadata, created_at, updated_at) "
            "VALUES (%s, %s, %s, 't', '{}'::jsonb, now(), now())",
            [conversation_id, conversation_id, next(iter(members))],
        )
        for user, level in members.items():
            cursor.execute(
                "INSERT INTO conversation_memberships (id, root_id, user_id, access_level, created_at) "
                "VALUES (gen_random_uuid(), %s, %s, %s, now())",
                [conversation_id, user, level],
            )
    return conversation_id


def _user(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _received(user: str) -> list[dict]:
    return [json.loads(streams.payload_of(fields)) for _id, fields in get_client().xrange(streams.stream_key(user))]


def _fail_pipelines(monkeypatch, failures: list[Exception]) -> None:
    """The next Redis pipelines raise ``failures`` from execute(), one each, in order (popped); later ones work."""
    real_pipeline = redis.Redis.pipeline

    def failing_pipeline(self, *args, **kwargs):
        pipe = real_pipeline(self, *args, **kwargs)
        if failures:
            error = failures.pop(0)
            pipe.execute = lambda: (_ for _ in ()).throw(error)
        return pipe

    monkeypatch.setattr(redis.Redis, "pipeline", failing_pipeline)


def test_entry_events_reach_every_member_after_commit_only():
    owner, reader, stranger = _user("owner"), _user("reader"), _user("stranger")
    conversation = _conversation({owner: "owner", reader: "reader"})
    with transaction.atomic():
        publisher.publish("created", "entry", {"conversationId": conversation, "entryId": "e1"})
        assert _received(owner) == []  # nothing before commit
    expected = {"event": "created", "kind": "entry", "data": {"conversationId": conversation, "entryId": "e1"}}
    assert _received(owner) == [expected]
    assert _received(reader) == [expected]
    assert _received(stranger) == []


def test_rolled_back_write_sends_nothing():
    owner = _user("owner")
    conversation = _conversation({owner: "owner"})
    with pytest.raises(RuntimeError), transaction.atomic():
        publisher.publish("updated", "conversation", {"conversationId": conversation})
        raise RuntimeError("the write fails")
    assert _received(owner) == []


def test_membership_events_reach_the_affected_user_owners_and_managers():
    owner, manager, writer, newcomer = _user("o"), _user("m"), _user("w"), _user("n")
    conversation = _conversation({owner: "owner", manager: "manager", writer: "writer"})
    with transaction.atomic():
        publisher.publish(
            "created", "membership", {"conversationId": conversation, "userId": newcomer, "accessLevel": "reader"}
        )
    for user in (owner, manager, newcomer):
        assert [event["kind"] for event in _received(user)] == ["membership"]
    assert _received(writer) == []


def test_a_removed_member_resolved_before_the_delete_still_gets_the_event():
    owner, leaving = _user("o"), _user("l")
    conversation = _conversation({owner: "owner", leaving: "reader"})
    with transaction.atomic():
        publisher.publish(
            "deleted", "membership", {"conversationId": conversation, "userId": leaving, "accessLevel": "reader"}
        )
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM conversation_memberships WHERE user_id = %s", [leaving])
    assert [event["event"] for event in _received(leaving)] == ["deleted"]


def test_contract_violations_raise():
    with pytest.raises(ValueError):
        publisher.publish("renamed", "entry", {"conversationId": str(uuid.uuid4())})
    with pytest.raises(ValueError):
        publisher.publish("created", "attachment", {"conversationId": str(uuid.uuid4())})
    with pytest.raises(ValueError):
        publisher.publish("created", "entry", {"entryId": "x"})


def test_redis_failure_never_fails_the_write_and_the_recipients_get_invalidate_once_redis_answers(monkeypatch):
    owner = _user("owner")
    conversation = _conversation({owner: "owner"})
    real_pipeline = redis.Redis.pipeline

    def broken_pipeline(self, *args, **kwargs):
        pipe = real_pipeline(self, *args, **kwargs)

        def fail():
            raise redis.ConnectionError("Redis is down")

        pipe.execute = fail
        return pipe

    monkeypatch.setattr(redis.Redis, "pipeline", broken_pipeline)
    with transaction.atomic():
        publisher.publish("created", "entry", {"conversationId": conversation, "entryId": "lost"})
        with connection.cursor() as cursor:
            cursor.execute("UPDATE conversations SET title = 'kept' WHERE id = %s", [conversation])
    with connection.cursor() as cursor:
        cursor.execute("SELECT title FROM conversations WHERE id = %s", [conversation])
        assert cursor.fetchone()[0] == "kept"  # the write committed
    monkeypatch.setattr(redis.Redis, "pipeline", real_pipeline)
    # Redis answers again: the invalidate goes out by itself, without waiting for another write (issue 21.14: after
    # an outage with no later write, the client used to hear nothing).
    wait_until(lambda: _received(owner))
    assert _received(owner) == [{"event": "invalidate", "kind": "stream", "data": {}}]
    [(_id, fields)] = get_client().xrange(streams.stream_key(owner))
    assert abs(int(fields[b"i"]) - time.time() * 1000) < 30_000  # stamped with the newest missed event's time
    wait_until(lambda: not publisher._recovering)
    with transaction.atomic():
        publisher.publish("created", "entry", {"conversationId": conversation, "entryId": "next"})
    assert _received(owner) == [
        {"event": "invalidate", "kind": "stream", "data": {}},
        {"event": "created", "kind": "entry", "data": {"conversationId": conversation, "entryId": "next"}},
    ]


def test_publishing_pauses_after_a_failure_instead_of_timing_out_every_write(monkeypatch, settings):
    owner = _user("owner")
    conversation = _conversation({owner: "owner"})
    calls = []
    real_pipeline = redis.Redis.pipeline

    def broken_pipeline(self, *args, **kwargs):
        calls.append(threading.current_thread() is threading.main_thread())
        pipe = real_pipeline(self, *args, **kwargs)
        pipe.execute = lambda: (_ for _ in ()).throw(redis.TimeoutError("slow"))
        return pipe

    monkeypatch.setattr(redis.Redis, "pipeline", broken_pipeline)
    settings.SSE_PUBLISH_BACKOFF_SECONDS = 60
    for index in range(5):
        with transaction.atomic():
            publisher.publish("created", "entry", {"conversationId": conversation, "entryId": f"e{index}"})
    assert calls.count(True) == 1  # only the first write tried Redis; the recovery thread tries for the others



def test_a_write_racing_the_end_of_recovery_is_not_left_owed_with_no_recovery_running(monkeypatch):
    """The recovery thread ends, under the publisher's lock, when nothing is owed. A write that had seen it running
    and remembered its recipients after it ended left them owed with nobody to send it: no invalidate until some
    later write. The write now checks and remembers under that same lock, so it either stays owed to a running
    recovery or, as here, finds it over and sends its event itself."""
    owner = _user("owner")
    conversation = _conversation({owner: "owner"})
    payload = streams.encode_event("created", "entry", {"conversationId": conversation, "entryId": "e1"})
    monkeypatch.setattr(publisher, "_recovering", True)
    with publisher._lock:
        writer = threading.Thread(target=publisher._send, args=([([owner], payload, "entry")],))
        writer.start()
        time.sleep(0.2)  # the write reaches the lock
        publisher._recovering = False  # what the recovery thread does once nothing is owed, holding the lock
    writer.join(5)
    assert _received(owner) == [json.loads(payload)]
    assert publisher._missed == {}


def test_the_recovery_outlives_an_error_that_is_not_redis(monkeypatch):
    """Publishing waits for the recovery thread while it runs: a thread ended by an unexpected error (not a
    RedisError) would leave every later write of the process owing an invalidate that nothing sends."""
    owner = _user("owner")
    conversation = _conversation({owner: "owner"})
    failures = [redis.ConnectionError("Redis is down"), RuntimeError("unexpected")]
    _fail_pipelines(monkeypatch, failures)
    with transaction.atomic():
        publisher.publish("created", "entry", {"conversationId": conversation, "entryId": "lost"})
    wait_until(lambda: _received(owner))
    assert failures == []  # the write, then the recovery's first try, failed
    assert _received(owner) == [{"event": "invalidate", "kind": "stream", "data": {}}]

def test_owed_invalidates_survive_a_send_that_fails_with_an_error_that_is_not_redis(monkeypatch, settings):
    """Issue 28 item 12: a send takes the owed invalidates to add to its own pipeline; one that failed with anything
    but a RedisError dropped them (and its own event) unsent and unremembered. They stay owed and go out once Redis
    answers."""
    owed, writer = _user("owed"), _user("writer")
    conversation = _conversation({writer: "owner"})
    monkeypatch.setattr(publisher, "_missed", {owed: int(time.time() * 1000)})
    settings.SSE_PUBLISH_BACKOFF_SECONDS = 0.2
    failures = [ValueError("a bug, or a library surprise")]
    _fail_pipelines(monkeypatch, failures)
    with transaction.atomic():
        publisher.publish("created", "entry", {"conversationId": conversation, "entryId": "e1"})
    assert failures == []
    wait_until(lambda: _received(owed) and _received(writer))
    assert _received(owed) == [{"event": "invalidate", "kind": "stream", "data": {}}]
    assert _received(writer) == [{"event": "invalidate", "kind": "stream", "data": {}}]


# --- OpenAPI ----------------------------------------------------------------------------------------------------


def test_openapi_describes_the_stream(api):
    schema = api.get("/openapi.json").json()
    operation = schema["paths"]["/v1/events"]["get"]
    assert "text/event-stream" in operation["responses"]["200"]["content"]
    assert {parameter["name"] for parameter in operation["parameters"]} >= {"kinds", "Last-Event-ID"}
    for status in ("400", "401", "503"):  # D1's body, as on every other operation
        assert operation["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }
        assert operation["responses"][status]["description"]
    assert operation["operationId"] == "events_stream" and operation["security"]


def test_only_the_asgi_consumer_serves_the_stream(client_for):
    """Django's own application (WSGI, the test client) has no /v1/events: config.asgi routes it to the Channels
    consumer before Django, and a second implementation with other semantics (no token expiry, no connection limit)
    must not come back."""
    response = client_for("bob").get("/v1/events")
    assert response.status_code == 404 and response.json()["code"] == "not_found"

    from apps.events.consumer import EventStreamConsumer
    from apps.events.routing import native_routes  # what config.asgi serves before Django

    assert native_routes["/v1/events"].consumer_class is EventStreamConsumer


def test_an_append_over_http_publishes_once_its_response_is_out(client_for, monkeypatch):
    """The events of a write request are sent when the server closes its response (request_finished), not inside
    the view: the response never waits for Redis or for the fan-out."""
    import inspect

    owner = _user("http")
    conversation = _conversation({owner: "owner"})
    sent_from_close: list[bool] = []
    real_send = publisher._send

    def recording_send(batch):
        sent_from_close.append(
            any(f.function == "close" and f.filename.endswith("django/http/response.py") for f in inspect.stack())
        )
        real_send(batch)

    monkeypatch.setattr(publisher, "_send", recording_send)
    response = client_for(owner).post(
        f"/v1/conversations/{conversation}/entries", {"content": [{"role": "USER", "text": "hi"}]}, format="json"
    )
    assert response.status_code == 201
    assert sent_from_close and all(sent_from_close)
    assert [event["data"].get("entryId") for event in _received(owner)][-1] == response.json()["id"]
    # Outside a request (a task, a command) the send happens at commit.
    sent_from_close.clear()
    with transaction.atomic():
        publisher.publish("updated", "conversation", {"conversationId": conversation})
    assert sent_from_close == [False] and _received(owner)[-1]["event"] == "updated"


def test_an_event_to_many_members_is_one_call_per_batch_not_one_per_member(settings, tmp_path):
    """Issue 28 item 3: an append published one EVAL per member, so its cost grew with the member count (2,000
    invented members: ~100 ms of the worker per append). Now one call per FAN_OUT_BATCH members, on a Valkey of the
    test's own so that its command counts are this test's."""
    from apps.runtime.embedded_services import RestartableValkey

    valkey = RestartableValkey(tmp_path)
    valkey.start()
    try:
        settings.REDIS_URL = valkey.url
        members = {_user("owner"): "owner", **{_user(f"m{i}"): "reader" for i in range(streams.FAN_OUT_BATCH + 99)}}
        conversation = _conversation(members)
        before = get_client().info("commandstats").get("cmdstat_eval", {}).get("calls", 0)
        with transaction.atomic():
            publisher.publish("created", "entry", {"conversationId": conversation, "entryId": "e1"})
        calls = get_client().info("commandstats")["cmdstat_eval"]["calls"] - before
        assert calls == 2, calls
        expected = {"event": "created", "kind": "entry", "data": {"conversationId": conversation, "entryId": "e1"}}
        assert all(_received(user) == [expected] for user in members)
        # Each member's stream and channel agree on the entry id, as with a single append.
        user = next(iter(members))
        [(entry_id, _fields)] = get_client().xrange(streams.stream_key(user))
        assert streams.valid_entry_id(entry_id.decode())
    finally:
        valkey.stop()

# --- One delivery per write (issue 29) ----------------------------------------------------------------------------


def _count_pipelines(monkeypatch) -> list[int]:
    """The number of stream appends (EVAL of apps.events.streams' script) of every Redis pipeline that carries any,
    executed from now on (an indexer wake-up, say, is not counted)."""
    executed: list[int] = []
    real_execute = redis.client.Pipeline.execute

    def counting(self, *args, **kwargs):
        appends = sum(1 for command, _options in self.command_stack if command[0] == "EVAL")
        if appends:
            executed.append(appends)
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting)
    return executed


def test_an_append_that_creates_its_conversation_is_delivered_in_one_round_trip(client_for, monkeypatch):
    """Its three events (the conversation, the owner's membership, the entry) are resolved together after commit and
    sent in one pipeline; it used to be three publishes, each resolving the members again and sending alone."""
    owner = _user("one")
    executed = _count_pipelines(monkeypatch)
    conversation = str(uuid.uuid4())
    response = client_for(owner).post(
        f"/v1/conversations/{conversation}/entries", {"content": [{"role": "USER", "text": "hi"}]}, format="json"
    )
    assert response.status_code == 201
    assert executed == [3]
    assert [(event["event"], event["kind"]) for event in _received(owner)] == [
        ("created", "conversation"), ("created", "membership"), ("created", "entry")
    ]


def test_deleting_a_tree_tells_the_members_it_had(client_for):
    """Recipients are resolved after the delete committed, when the tree's memberships are gone (archived): its
    members still hear that its conversations and their memberships are deleted; nobody else does."""
    owner, manager, reader, stranger = _user("o"), _user("m"), _user("r"), _user("s")
    root = _conversation({owner: "owner", manager: "manager", reader: "reader"})
    assert client_for(owner).delete(f"/v1/conversations/{root}").status_code == 204
    deleted = {"event": "deleted", "kind": "conversation", "data": {"conversationId": root}}
    for user in (owner, manager, reader):
        assert deleted in _received(user)
    membership_events = {user: [e["data"]["userId"] for e in _received(user) if e["kind"] == "membership"]
                         for user in (owner, manager, reader)}
    assert sorted(membership_events[owner]) == sorted(membership_events[manager]) == sorted([owner, manager, reader])
    assert membership_events[reader] == [reader]
    assert _received(stranger) == []


def test_a_failed_recipients_lookup_never_fails_the_write(client_for, monkeypatch):
    owner = _user("owner")
    conversation = _conversation({owner: "owner"})

    def broken(_conversation_ids):
        raise RuntimeError("the database went away after the commit")

    monkeypatch.setattr(publisher, "_audience", broken)
    response = client_for(owner).post(
        f"/v1/conversations/{conversation}/entries", {"content": [{"role": "USER", "text": "kept"}]}, format="json"
    )
    assert response.status_code == 201
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM conversation_entries WHERE conversation_id = %s", [conversation])
        assert cursor.fetchone()[0] == 1
    assert _received(owner) == []
