"""GET /v1/events (D8) against the production web stack (two servers): delivery, scoping, filters, keepalive,
resume, limits, Redis restarts."""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request
from functools import partial

import pytest
from django.conf import settings

from apps.core.redis_client import get_client
from tests.concurrency import run_concurrently
from tests.conftest import _mint
from tests.events.conftest import SSEClient, assert_silent, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _events(stream, count, timeout=5.0):
    return [message.data for message in stream.events(count, timeout)]


# --- Authentication and request validation ----------------------------------------------------------------------


def next_entry_event(stream, timeout: float = 5.0):
    """The next entry event, past the events of the setup writes just before the stream opened (the conversation's
    created event, bob's membership): a request's events are sent after its response (apps.events.middleware), so a
    stream opened right after that response may still get them."""
    deadline = time.monotonic() + timeout
    while True:
        message = stream.next(timeout=max(0.1, deadline - time.monotonic()))
        assert message is not None, "the stream ended"
        if message.data["kind"] == "entry":
            return message
        assert message.data["kind"] in ("conversation", "membership") and message.data["event"] == "created", message.data


def test_without_credentials_is_401_json(server):
    stream = SSEClient(server, "/v1/events", {})
    assert stream.status == 401
    assert stream.content_type.startswith("application/json")
    assert stream.body["code"] == "unauthenticated" and stream.body["requestId"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer not-a-jwt"},
        {"Authorization": "Basic YWxpY2U6YWxpY2U="},
        {"X-API-Key": "test-api-key-0123456789"},  # a key names a client, never a user
    ],
)
def test_bad_credentials_are_401(server, headers):
    stream = SSEClient(server, "/v1/events", headers)
    assert stream.status == 401
    assert stream.body["code"] == "unauthenticated"


@pytest.mark.parametrize(
    "claims",
    [{"preferred_username": "bob\ud800"}, {"preferred_username": "bob\x00"}, {"exp": 10**400}, {"x": 2**64}],
    ids=["lone_surrogate_user_id", "nul_user_id", "exp_overflow", "integer_over_64_bits"],
)
def test_odd_claims_are_401_and_leave_the_process_serving_everyone(make_user, server, claims):
    """Issue 21.6: a lone surrogate in the user id was a 500 that left the process's one Redis reader unable to
    subscribe anybody: every later stream on it got 503 until a restart."""
    odd = SSEClient(server, "/v1/events", {"Authorization": f"Bearer {_mint('bob', roles=('user',), claims=claims)}"})
    assert odd.status == 401 and odd.body["code"] == "unauthenticated"
    alice = make_user("alice")
    stream = alice.stream()
    assert stream.status == 200, stream.body
    conversation = alice.create_conversation()
    assert {"event": "created", "kind": "conversation", "data": {"conversationId": conversation}} in _events(stream, 2)
    stream.close()


def test_api_key_is_checked_like_every_endpoint(make_user, api_key):
    alice = make_user()
    bad = SSEClient(alice.server, "/v1/events", {**alice.headers, "X-API-Key": "wrong-key-0123456789"})
    assert bad.status == 401
    good = SSEClient(alice.server, "/v1/events", {**alice.headers, "X-API-Key": api_key})
    assert good.status == 200
    good.close()


def test_unknown_kind_is_400_and_other_methods_405(make_user, server):
    alice = make_user()
    stream = alice.stream("?kinds=entry,bogus")
    assert stream.status == 400
    assert stream.body["code"] == "validation_error" and "kinds" in stream.body["details"]["fields"]
    status, body = alice.call("POST", "/v1/events", {})
    assert status == 405 and body["code"] == "method_not_allowed"


# --- Delivery and scoping ---------------------------------------------------------------------------------------


def test_member_receives_conversation_and_entry_events_within_a_second(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    stream = alice.stream()
    assert stream.status == 200 and stream.content_type.startswith("text/event-stream")
    conversation = alice.create_conversation()
    created = _events(stream, 2)
    assert {"event": "created", "kind": "conversation", "data": {"conversationId": conversation}} in created
    assert {
        "event": "created",
        "kind": "membership",
        "data": {"conversationId": conversation, "userId": alice.name, "accessLevel": "owner"},
    } in created

    alice.share(conversation, bob, "writer")
    assert stream.next().data["kind"] == "membership"
    bob_stream = bob.stream()
    started = time.monotonic()
    entry = bob.append(conversation, "secret words")
    for receiver in (stream, bob_stream):
        message = receiver.next(timeout=1.0)
        assert message.data == {
            "event": "created",
            "kind": "entry",
            "data": {"conversationId": conversation, "entryId": entry["id"]},
        }
        assert message.id  # resumable
        # One block: an id: line, one data: line, a blank line.
        assert message.raw.startswith(f"id: {message.id}\ndata: {{") and message.raw.endswith("}\n\n")
        assert message.raw.count("\n") == 3
        assert message.received_at - started < 1.0
        assert "secret" not in str(message.data)  # ids only, never content
    stream.close()
    bob_stream.close()


def test_non_member_receives_nothing(make_user):
    alice, mallory = make_user("alice"), make_user("mallory")
    watcher = mallory.stream()
    conversation = alice.create_conversation()
    alice.append(conversation)
    status, _ = alice.call("PATCH", f"/v1/conversations/{conversation}", {"title": "renamed"})
    assert status == 200
    alice.wait_published(lambda events: any(event["event"] == "updated" for event in events))
    assert_silent(mallory.name, watcher)
    watcher.close()


def test_removed_member_stops_receiving(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    conversation = alice.create_conversation()
    alice.share(conversation, bob)
    stream = bob.stream()
    alice.append(conversation, "one")
    next_entry_event(stream)
    status, _ = alice.call("DELETE", f"/v1/conversations/{conversation}/memberships/{bob.name}")
    assert status == 204
    # Bob learns he was removed (the affected user receives membership events), then nothing more.
    assert stream.next().data == {
        "event": "deleted",
        "kind": "membership",
        "data": {"conversationId": conversation, "userId": bob.name, "accessLevel": "reader"},
    }
    two = alice.append(conversation, "two")
    alice.wait_published(lambda events: any(event["data"].get("entryId") == two["id"] for event in events))
    assert_silent(bob.name, stream)
    stream.close()


def test_membership_events_go_to_the_affected_user_and_managers_only(make_user):
    alice, bob, carol, dave = (make_user(n) for n in ("alice", "bob", "carol", "dave"))
    conversation = alice.create_conversation()
    alice.share(conversation, bob, "manager")
    alice.share(conversation, carol, "reader")
    streams = {user.name: user.stream("?kinds=membership") for user in (alice, bob, carol, dave)}
    alice.share(conversation, dave, "writer")
    for name in (alice.name, bob.name, dave.name):
        assert streams[name].next().data["data"]["userId"] == dave.name
    assert_silent(carol.name, streams[carol.name])  # a reader does not see who else joins
    for stream in streams.values():
        stream.close()


def test_kinds_filter(make_user):
    alice = make_user()
    entries_only = alice.stream("?kinds=entry")
    conversations_only = alice.stream("?kinds=conversation")
    conversation = alice.create_conversation()
    entry = alice.append(conversation)
    assert conversations_only.next().data["kind"] == "conversation"
    assert entries_only.next().data == {
        "event": "created",
        "kind": "entry",
        "data": {"conversationId": conversation, "entryId": entry["id"]},
    }
    status, _ = alice.call("PATCH", f"/v1/conversations/{conversation}", {"title": "renamed"})
    assert status == 200
    assert conversations_only.next().data["event"] == "updated"
    assert_silent(alice.name, entries_only, conversations_only)
    entries_only.close()
    conversations_only.close()


def test_keepalive_comment_arrives(make_user):
    stream = make_user().stream()
    message = stream.next(timeout=2.0, events_only=False)
    assert message.comment == "keepalive" and message.data is None and message.raw == ": keepalive\n\n"
    stream.close()


# --- Resume -----------------------------------------------------------------------------------------------------


def test_last_event_id_resume_has_no_loss_and_no_duplicate(make_user):
    """Appends never stop while the client disconnects and resumes: the two connections together see every entry
    exactly once, in commit order."""
    alice = make_user()
    conversation = alice.create_conversation()
    first = alice.stream("?kinds=entry")
    appended: list[str] = []
    stop = threading.Event()

    def writer():
        while not stop.is_set() and len(appended) < 500:
            appended.append(alice.append(conversation)["id"])

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        seen = [first.next(), first.next(), first.next()]
        first.close()
        seen += first.received()  # whatever was already read before the close
        closed_at = len(appended)
        wait_until(lambda: len(appended) >= closed_at + 3 or not thread.is_alive(), what="appends while nobody listens")
        second = alice.stream("?kinds=entry", last_event_id=seen[-1].id)
        resumed_at = len(appended)
        wait_until(lambda: len(appended) >= resumed_at + 3 or not thread.is_alive(), what="appends after the resume")
    finally:
        stop.set()
        thread.join()
    while len(seen) < len(appended):
        message = second.next()
        assert message is not None, "the stream ended"
        seen.append(message)
    assert_silent(alice.name, second)  # and no duplicate after them
    second.close()

    received = [message.data["data"]["entryId"] for message in seen]
    assert received == appended, "every entry exactly once, in order"
    ids = [message.id for message in seen]
    assert ids == sorted(ids, key=lambda value: tuple(map(int, value.split("-"))))


def _write_past_retention(user: str) -> str:
    """An event in the user's stream older than SSE_RETENTION_SECONDS, as if delivered that long ago: its id."""
    from apps.events import streams

    old = int(time.time() * 1000) - (settings.SSE_RETENTION_SECONDS + 1) * 1000
    payload = streams.encode_event("created", "entry", {"conversationId": "c", "entryId": "long-ago"})
    return get_client().xadd(streams.stream_key(user), {"e": payload}, id=f"{old}-0").decode()


@pytest.mark.parametrize("last_event_id", ["past-retention", "garbage", "1-0", "99999999999999-0"])
def test_a_last_event_id_past_retention_or_unknown_gets_one_invalidate_then_the_live_stream(make_user, last_event_id):
    """Past retention (a real id, received longer ago than SSE_RETENTION_SECONDS), not one of ours, from the future:
    one ``invalidate`` instead of a replay (nothing written since is sent), then the stream goes on."""
    alice = make_user()
    if last_event_id == "past-retention":
        last_event_id = _write_past_retention(alice.name)
    conversation = alice.create_conversation()
    first = alice.append(conversation)  # after the last id: not replayed
    # Its events go out after its response: wait for them, or the resumed stream may get this entry live.
    alice.wait_published(lambda events: any(event["data"].get("entryId") == first["id"] for event in events))
    resumed = alice.stream("?kinds=entry", last_event_id=last_event_id)
    assert resumed.next().data == {"event": "invalidate", "kind": "stream", "data": {}}
    entry = alice.append(conversation)
    assert resumed.next().data["data"]["entryId"] == entry["id"]
    assert_silent(alice.name, resumed)
    resumed.close()


# --- Fan-out across processes -----------------------------------------------------------------------------------


def test_two_web_processes_both_deliver_an_event_published_by_either(make_user, web_servers):
    one, two = web_servers
    alice, bob = make_user("alice"), make_user("bob")
    conversation = alice.create_conversation()
    alice.share(conversation, bob)
    streams = [alice.stream("?kinds=entry", on=one), alice.stream("?kinds=entry", on=two)]
    streams += [bob.stream("?kinds=entry", on=one), bob.stream("?kinds=entry", on=two)]
    for origin in (one, two):
        entry = alice.append(conversation, on=origin)
        for stream in streams:
            message = stream.next(timeout=3.0)
            assert message.data["data"]["entryId"] == entry["id"]
    for stream in streams:
        stream.close()


def test_32_concurrent_appends_each_delivered_once_in_one_order_on_both_processes(make_user, web_servers):
    one, two = web_servers
    alice = make_user()
    conversation = alice.create_conversation()
    listeners = [alice.stream("?kinds=entry", on=one), alice.stream("?kinds=entry", on=two)]
    appended = [
        entry["id"]
        for entry in run_concurrently(
            [partial(alice.append, conversation, f"message {i}", on=(one, two)[i % 2]) for i in range(32)]
        )
    ]
    status, page = alice.call("GET", f"/v1/conversations/{conversation}/entries?limit=50")
    assert status == 200
    commit_order = [entry["id"] for entry in page["data"]]
    assert sorted(commit_order) == sorted(appended)
    orders = []
    for listener in listeners:
        received = [m.data["data"]["entryId"] for m in listener.events(32)]
        assert sorted(received) == sorted(commit_order)  # every append, once
        orders.append(received)
    assert_silent(alice.name, *listeners)
    for listener in listeners:
        listener.close()
    # Events are sent after commit, so two appends committing together may be published in either order; but the
    # user's stream has one order, and every process delivers it.
    assert orders[0] == orders[1]


# --- Limits -----------------------------------------------------------------------------------------------------


def test_connection_limit_closes_the_oldest_with_an_event(make_user, web_servers):
    one, two = web_servers
    alice = make_user()
    # The limit is 3 in tests. A stream has claimed its slot, in order, when its response starts.
    streams = [alice.stream(on=one), alice.stream(on=two), alice.stream(on=one)]
    newest = alice.stream(on=two)
    evicted = streams[0].next(timeout=2.0)
    assert evicted.data == {"event": "evicted", "kind": "stream", "data": {"reason": "connection_limit"}}
    assert evicted.id is None
    assert streams[0].next(timeout=2.0) is None  # then the server ends the response
    conversation = alice.create_conversation()
    for stream in (*streams[1:], newest):
        assert stream.next(timeout=2.0).data["data"]["conversationId"] == conversation
        stream.close()


def test_stream_ends_when_the_token_expires(make_user, server):
    alice = make_user()
    conversation = alice.create_conversation()
    # Accepted for about 2 more seconds: exp is in the past, within the leeway every endpoint allows.
    lifetime = 2.0
    exp = int(time.time() + lifetime - settings.OIDC_LEEWAY_SECONDS)
    short = _mint(alice.name, roles=("user",), claims={"exp": exp})
    stream = SSEClient(server, "/v1/events", {"Authorization": f"Bearer {short}"})
    opened = time.monotonic()
    alice.append(conversation, "before expiry")
    next_entry_event(stream, timeout=2.0)  # a live stream until then
    evicted = stream.next(timeout=lifetime + 3)
    assert evicted.data == {"event": "evicted", "kind": "stream", "data": {"reason": "token_expired"}}
    assert evicted.id is None
    assert time.monotonic() - opened >= lifetime - 1.1  # not before the token stopped being accepted
    assert stream.next(timeout=2.0) is None  # then the response ends
    status, _body = server.request("GET", "/v1/me", headers={"Authorization": f"Bearer {short}"})
    assert status == 401  # the same token is refused everywhere from then on
    fresh = alice.stream()  # a new token gets a new stream
    alice.append(conversation, "after")
    assert fresh.next(timeout=2.0).data["kind"] == "entry"


def test_slow_consumer_is_evicted_without_slowing_other_clients(make_user, server):
    """A client that stops reading fills its socket, then its SSE_BUFFER_EVENTS (32 in tests) buffer, and is cut
    off with an ``evicted`` event, while the other streams keep up. The burst is written straight into the users'
    Redis streams (the publisher's format) because the kernel absorbs megabytes before a loopback socket blocks."""
    from apps.events import streams

    alice, bob = make_user("alice"), make_user("bob")
    slow = bob.stream("?kinds=entry", receive_buffer=2048, read=False)
    fast = [bob.stream("?kinds=entry"), alice.stream("?kinds=entry")]  # subscribed once their responses start
    total, batch = 3_000, 1_000
    redis = get_client()
    started = time.monotonic()
    for first in range(0, total, batch):
        pipe = redis.pipeline(transaction=False)
        for index in range(first, first + batch):
            payload = streams.encode_event("created", "entry", {"conversationId": "c", "entryId": f"e{index}"})
            for user in (alice, bob):
                pipe.eval(*streams.append_args(user.name, "e", payload))
        pipe.execute()
    published = time.monotonic()
    for stream in fast:
        received = stream.events(total, timeout=30)
        assert [m.data["data"]["entryId"] for m in received] == [f"e{i}" for i in range(total)]
    # The stuck client is still not reading: a new event reaches the others at once.
    probe = streams.encode_event("created", "entry", {"conversationId": "c", "entryId": "probe"})
    sent = time.monotonic()
    redis.eval(*streams.append_args(bob.name, "e", probe))
    message = fast[0].next(timeout=2.0)
    assert message.data["data"]["entryId"] == "probe" and message.received_at - sent < 1.0
    slow.start_reading()
    tail = []
    while (message := slow.next(timeout=10)) is not None:
        tail.append(message.data)
    assert tail[-1] == {"event": "evicted", "kind": "stream", "data": {"reason": "slow_consumer"}}
    assert len(tail) - 1 < total  # it was cut off, not fed everything
    assert published - started < 30
    for stream in fast:
        stream.close()


# --- Clean close ------------------------------------------------------------------------------------------------


def _gauge(server, name: str) -> float:
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def _hub_connections(server) -> int:
    [worker] = server.worker_pids()
    return sum(1 for client in get_client().client_list() if client.get("name", "").startswith(f"sse-hub:{worker}:"))


def test_disconnect_leaves_no_stream_or_redis_reader_behind(make_user, web_servers):
    server = web_servers[1]
    wait_until(lambda: _gauge(server, "sse_connections") == 0, what="earlier tests' streams to go")
    alice = make_user()
    streams = [alice.stream(on=server) for _ in range(3)]
    wait_until(lambda: _gauge(server, "sse_connections") == 3, what="three streams")
    assert _hub_connections(server) == 1  # one reader for the whole process, not one per client
    for stream in streams:
        stream.close()
    wait_until(lambda: not _gauge(server, "sse_connections") and not _hub_connections(server), what="the streams to go")
    assert get_client().zcard(f"{settings.SSE_REDIS_PREFIX}c:{alice.name}") == 0


def _abrupt_stream(server, headers: dict[str, str], when: str) -> None:
    """A stream request whose client goes away ``when``: at once, at the response's headers, or after its first
    bytes; the socket is reset (SO_LINGER 0), as a killed client's is."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        sock.sendall(f"GET /v1/events HTTP/1.1\r\nHost: localhost\r\n{head}\r\n".encode())
        if when != "at_once":
            data = b""
            while b"\r\n\r\n" not in data:
                data += sock.recv(4096)
            if when == "after_body" and not data.split(b"\r\n\r\n", 1)[1]:
                sock.recv(4096)
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def test_bursts_of_streams_that_come_and_go_leave_the_gauge_at_zero(make_user, web_servers):
    """Issue 28 item 10: the ``sse_connections`` gauge read 84 with no stream open after bursts. Streams opened
    and dropped at every moment of their start, beyond the per-user limit (evictions) too, leave no stream counted,
    registered with the hub, or holding a slot."""
    server = web_servers[1]
    wait_until(lambda: _gauge(server, "sse_connections") == 0, what="earlier tests' streams to go")
    users = [make_user() for _ in range(4)]
    moments = ["at_once", "after_headers", "after_body"]
    for _burst in range(3):
        run_concurrently([
            partial(_abrupt_stream, server, user.headers, moments[index % 3])
            for index, user in enumerate(users * 8)
        ])  # fmt: skip
    wait_until(lambda: _gauge(server, "sse_connections") == 0 and not _hub_connections(server), timeout=30,
               what="the gauge to come back to 0 and the hub to let go")  # fmt: skip
    for user in users:
        assert get_client().zcard(f"{settings.SSE_REDIS_PREFIX}c:{user.name}") == 0


# --- Redis restarts -----------------------------------------------------------------------------------------------


def test_streams_opened_right_after_a_redis_restart_are_served(make_user, event_valkey):
    """The server's pooled Redis connections all died with the restart; the next streams must not pay for it with a
    503 (each dead connection is replaced transparently), and they deliver again."""
    alice = make_user()
    conversation = alice.create_conversation()
    # Several streams at once: the server's pool holds several connections, every one of them dead afterwards.
    warm = [alice.stream() for _ in range(3)]
    alice.append(conversation, "before")
    for stream in warm:
        next_entry_event(stream, timeout=3.0)
        stream.close()
    event_valkey.stop()
    event_valkey.start()
    after = [alice.stream() for _ in range(3)]
    assert [stream.status for stream in after] == [200, 200, 200], [getattr(s, "body", None) for s in after]
    alice.append(conversation, "after")
    for stream in after:
        next_entry_event(stream, timeout=5.0)
