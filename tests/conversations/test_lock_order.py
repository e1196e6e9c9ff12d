"""Fork trees are locked in one order (apps.conversations.trees), so deleting a conversation, accepting a transfer,
appending, forking and the conversation indexer never deadlock (issue 28 item 5: a DELETE racing appends, forks and
an accept got 503 "database is unavailable" from a deadlock while the database was healthy).

The first tests stop a tree write right after it took the tree lock, let the indexer's store run into it, and then
let the write go on: before the indexer took the tree lock first, it held forks' rows and waited for the root while
the write held the root and waited for those forks (PostgreSQL aborted one of them, 40P01). The last one races
DELETE, appends, forks and an accept from 32+ real HTTP clients, with indexer cycles running, over many rounds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections

from apps.conversations import indexer, trees
from apps.retrieval.embeddings import get_provider
from apps.retrieval.vectors import model_tag
from apps.sharing import access
from tests.concurrency import run_concurrently
from tests.conversations.support import (
    CONVERSATIONS,
    TRANSFERS,
    add_member,
    append_ok,
    conv_path,
    create,
    new_id,
    sql,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _pending_tree(bob) -> tuple[str, str, list[str]]:
    """A root and a fork of it, each with an entry waiting for the indexer's vectors, the fork's sorting first (the
    indexer's store statement took entries, and their conversations' rows, in id order); (root, fork, the two
    entries' ids)."""
    root = create(bob, title="tree")["id"]
    first = append_ok(bob, root, "root entry", indexedContent="root text")["id"]
    fork = new_id()
    append_ok(bob, fork, "fork entry", indexedContent="fork text", forkedAtConversationId=root, forkedAtEntryId=first)
    root_ids, fork_ids = [first], sql("SELECT id::text FROM conversation_entries WHERE conversation_id = %s", [fork])
    fork_ids = [row[0] for row in fork_ids]
    while not min(fork_ids) < max(root_ids):
        root_ids.append(append_ok(bob, root, "more", indexedContent="more root text")["id"])
    return root, fork, [min(fork_ids), max(root_ids)]


def _prepared_store(entry_ids: list[str]) -> tuple[list, str]:
    """What a cycle hands ``store`` for these entries: their work and one vector each."""
    provider = get_provider()
    rows = indexer.INDEXER.load(entry_ids)
    assert len(rows) == len(entry_ids)
    vector = [1.0] + [0.0] * (int(provider.dimension) - 1)
    return [(indexer.INDEXER.work(row), [(None, 0, vector)]) for row in rows], model_tag(provider)


def _waiting_on_locks() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0]


def _paused_after(module: Any, name: str, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make ``module.name`` (a tree-lock taker) stop once it returned, until released; (holding, release)."""
    holding, release = threading.Event(), threading.Event()
    real = getattr(module, name)

    def paused(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        holding.set()
        assert release.wait(30)
        return result

    monkeypatch.setattr(module, name, paused)
    return holding, release


def _race_with_indexer_store(write, entry_ids, holding, release) -> tuple[int, list[BaseException]]:
    """Run the tree write; once it holds the tree lock, the indexer's store of ``entry_ids``; once that waits on a
    lock, let the write go on. The write's status and the store's errors."""
    done, model = _prepared_store(entry_ids)
    statuses: list[int] = []
    failures: list[BaseException] = []

    def store() -> None:
        try:
            indexer.INDEXER.store(done, model)
        except BaseException as exc:  # reported to the test
            failures.append(exc)
        finally:
            connection.close()

    def run_write() -> None:
        try:
            statuses.append(write())
        finally:
            connection.close()

    writer = threading.Thread(target=run_write)
    writer.start()
    assert holding.wait(30)
    storing = threading.Thread(target=store)
    storing.start()
    deadline = time.monotonic() + 10
    while _waiting_on_locks() == 0 and storing.is_alive():
        assert time.monotonic() < deadline, "the indexer never waited for the tree"
        time.sleep(0.02)
    release.set()
    writer.join(30)
    storing.join(30)
    assert not writer.is_alive() and not storing.is_alive()
    return statuses[0], failures


def test_accepting_a_transfer_while_the_indexer_stores_the_trees_vectors_does_not_deadlock(client_for, monkeypatch):
    bob, carol = client_for("bob"), client_for("carol")
    root, _fork, entry_ids = _pending_tree(bob)
    add_member(bob, root, "carol", "writer")
    transfer = bob.post(TRANSFERS, {"conversationId": root, "newOwnerUserId": "carol"}, format="json").json()["id"]
    holding, release = _paused_after(trees, "lock_root", monkeypatch)

    status, failures = _race_with_indexer_store(
        lambda: carol.post(f"{TRANSFERS}/{transfer}/accept").status_code, entry_ids, holding, release
    )
    assert status == 204
    assert failures == []
    assert sql("SELECT DISTINCT owner_user_id FROM conversations WHERE root_id = %s", [root]) == [("carol",)]
    assert sql("SELECT count(*) FROM conversation_entries WHERE id = ANY(%s::uuid[]) AND embedding_pending",
               [entry_ids]) == [(0,)]


def test_deleting_a_tree_while_the_indexer_stores_its_vectors_does_not_deadlock(client_for, monkeypatch):
    bob = client_for("bob")
    root, _fork, entry_ids = _pending_tree(bob)
    holding, release = _paused_after(access, "lock_tree", monkeypatch)

    status, failures = _race_with_indexer_store(
        lambda: bob.delete(conv_path(root)).status_code, entry_ids, holding, release
    )
    assert status == 204
    assert failures == []
    # The delete went first: the indexer found the tree deleted and stored nothing for it.
    assert sql("SELECT count(*) FROM conversation_entry_vectors WHERE root_id = %s", [root]) == [(0,)]


ROUNDS = 12
WRITERS = 18  # appending to the root and to the forks
FORKERS = 12  # forking the root
INDEXERS = 3  # indexer cycles running in this process meanwhile


def test_delete_racing_appends_forks_and_an_accept_answers_no_5xx(http):
    """Over many rounds, one tree: its owner deletes it while 18 clients append (to the root and to forks), 12 fork
    it and the new owner accepts a transfer (32 HTTP clients), while 3 indexer workers store vectors. Every answer
    is a success or a 4xx, never a 5xx; of the delete and the accept, whichever comes second loses (an accept after
    the delete finds no transfer: 404; a delete after the accept is no longer the owner's: 403)."""
    answers: list[tuple[str, int, str]] = []
    for round_number in range(ROUNDS):
        found = _one_round(http, round_number)
        outcome = tuple(status for kind, status, _ in found if kind in ("delete", "accept"))
        assert outcome in {(204, 404), (403, 204)}, found
        answers += found
    failures = [answer for answer in answers if answer[1] >= 500]
    assert failures == [], failures[:10]
    assert {kind for kind, status, _ in answers if status < 300} >= {"append", "fork"}  # the race did take place


def _one_round(http, round_number: int) -> list[tuple[str, int, str]]:
    bob = http("bob")
    root = bob.post(CONVERSATIONS, {"title": f"round {round_number}"}).json()["id"]
    first = bob.post(conv_path(root, "entries"), {"content": [{"role": "USER", "text": "first"}],
                                                  "indexedContent": "first"}).json()["id"]
    assert bob.post(conv_path(root, "memberships"), {"userId": "carol", "accessLevel": "writer"}).status_code == 201
    forks = [new_id() for _ in range(3)]
    for fork in forks:
        response = bob.post(conv_path(fork, "entries"), {
            "content": [{"role": "USER", "text": "fork"}], "indexedContent": "fork",
            "forkedAtConversationId": root, "forkedAtEntryId": first,
        })
        assert response.status_code == 201, response.text
    transfer = bob.post(TRANSFERS, {"conversationId": root, "newOwnerUserId": "carol"}).json()["id"]
    writers = [http("bob") for _ in range(WRITERS)]
    forkers = [http("carol") for _ in range(FORKERS)]
    owner, recipient = http("bob"), http("carol")
    stop = threading.Event()

    def appender(client, index: int) -> list[tuple[str, int, str]]:
        target = root if index % 2 else forks[index % len(forks)]
        out = []
        for _ in range(3):
            response = client.post(conv_path(target, "entries"), {
                "content": [{"role": "USER", "text": f"w{index}"}], "indexedContent": f"w{index}"})
            out.append(("append", response.status_code, response.text[:200]))
        return out

    def forker(client, index: int) -> list[tuple[str, int, str]]:
        response = client.post(conv_path(new_id(), "entries"), {
            "content": [{"role": "USER", "text": f"f{index}"}], "indexedContent": f"f{index}",
            "forkedAtConversationId": forks[index % len(forks)] if index % 2 else root, "forkedAtEntryId": first,
        })
        return [("fork", response.status_code, response.text[:200])]

    def deleter() -> list[tuple[str, int, str]]:
        time.sleep(0.01 * (round_number % 4))  # now early, now amid the other writes
        response = owner.delete(conv_path(root))
        return [("delete", response.status_code, response.text[:200])]

    def accepter() -> list[tuple[str, int, str]]:
        response = recipient.post(f"{TRANSFERS}/{transfer}/accept")
        return [("accept", response.status_code, response.text[:200])]

    found: list[tuple[str, int, str]] = []

    def indexing() -> None:
        try:
            while not stop.is_set():
                try:
                    indexer.INDEXER.run_cycle(batch_size=8, max_batches=4)
                except Exception as exc:  # an indexer failure is a finding too
                    found.append(("indexer", 500, repr(exc)[:200]))
                time.sleep(0.005)
        finally:
            connections.close_all()

    clients = (
        [lambda c=c, i=i: appender(c, i) for i, c in enumerate(writers)]
        + [lambda c=c, i=i: forker(c, i) for i, c in enumerate(forkers)]
        + [deleter, accepter]
    )
    indexers = [threading.Thread(target=indexing) for _ in range(INDEXERS)]
    for thread in indexers:
        thread.start()
    try:
        for result in run_concurrently(clients):
            found += result
    finally:
        stop.set()
        for thread in indexers:
            thread.join(60)
    return found
