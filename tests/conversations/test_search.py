"""Conversation search through HTTP (issue 9, D5): full-text, semantic and auto; access decided in SQL; paging;
bad input. The background indexer is run as a worker runs it (indexer.run_cycle); the embedder is the lexical
hashing one of the test settings except in the `real model` test."""

from __future__ import annotations

import uuid

import pytest

from apps.conversations import indexer
from tests.concurrency import meet
from tests.conversations.support import (
    ADMIN,
    CONVERSATIONS,
    SEARCH,
    add_member,
    append_ok,
    assert_validation_error,
    conv_path,
    conversation_ids,
    count,
    every_page,
    new_id,
    search,
    sql,
    url,
)

pytestmark = pytest.mark.django_db

UNINDEXED = f"{CONVERSATIONS}/unindexed"
INDEX = f"{CONVERSATIONS}/index"
@pytest.fixture
def bob(client_for):
    return client_for("bob")


@pytest.fixture
def charlie(client_for):
    return client_for("charlie")


@pytest.fixture
def indexer_client(client_for):
    return client_for("ivan", roles=("user", "indexer"))


@pytest.fixture(params=["exact", "hnsw"])
def plan(request, settings):
    """Semantic tests under both plans: small scopes are ranked exactly; threshold 0 forces the HNSW walk."""
    settings.MEMORY_VECTOR_EXACT_SCAN_THRESHOLD = 2000 if request.param == "exact" else 0
    return request.param


# --- Full-text ----------------------------------------------------------------------------------------------------


def test_indexed_content_is_searchable_at_once_with_highlights(bob):
    cid = new_id()
    entry = append_ok(bob, cid, "ignored text", indexedContent="Plan a trip to Lisbon in spring")
    body = search(bob, "lisbon trip", searchType="fulltext")
    assert conversation_ids(body) == [cid]
    hit = body["data"][0]
    assert hit["entryId"] == entry["id"]
    assert hit["entry"] == entry  # the decrypted entry as appended
    assert hit["conversationTitle"] == "ignored text"
    assert "**Lisbon**" in hit["highlights"] and "**trip**" in hit["highlights"]
    assert 0 < hit["score"] < 1


def test_appended_entry_is_found_after_background_indexing(bob):
    cid = new_id()
    append_ok(bob, cid, "The harbour of Valparaiso at dusk")
    assert search(bob, "valparaiso", searchType="fulltext")["data"] == []  # not indexed yet
    assert indexer.run_cycle().indexed == 1
    assert conversation_ids(search(bob, "valparaiso", searchType="fulltext")) == [cid]
    assert conversation_ids(search(bob, "valparaiso")) == [cid]  # auto


def test_exact_match_ranks_first_and_prefix_of_last_word_matches(bob):
    exact, loose, other = new_id(), new_id(), new_id()
    append_ok(bob, loose, "x", indexedContent="Yesterday we talked about many things: the weather, a garden, "
              "a long list of errands, and somewhere in there a quarterly budget review came up.")
    append_ok(bob, exact, "x", indexedContent="quarterly budget review")
    append_ok(bob, other, "x", indexedContent="gardening tips")
    assert conversation_ids(search(bob, "quarterly budget review", searchType="fulltext")) == [exact, loose]
    assert conversation_ids(search(bob, "quarterly budg", searchType="fulltext")) == [exact, loose]
    assert conversation_ids(search(bob, '"budget quarterly"', searchType="fulltext")) == []  # phrase order
    assert conversation_ids(search(bob, "budget -weather", searchType="fulltext")) == [exact]


def test_best_hit_per_conversation(bob):
    cid = new_id()
    append_ok(bob, cid, "x", indexedContent="a note about otters")
    best = append_ok(bob, cid, "x", indexedContent="otters otters: sea otters and river otters")
    body = search(bob, "otters", searchType="fulltext")
    assert conversation_ids(body) == [cid]
    assert body["data"][0]["entryId"] == best["id"]


# --- Access ---------------------------------------------------------------------------------------------------------


def test_only_readable_conversations_and_membership_removal(bob, charlie, client_for):
    mine, shared, foreign = new_id(), new_id(), new_id()
    append_ok(bob, mine, "x", indexedContent="penguin colony census")
    append_ok(charlie, shared, "x", indexedContent="penguin migration notes")
    append_ok(charlie, foreign, "x", indexedContent="penguin feeding schedule")
    add_member(charlie, shared, "bob", "reader")
    indexer.run_cycle()
    for search_type in ("fulltext", "semantic", "auto"):
        assert set(conversation_ids(search(bob, "penguin", searchType=search_type))) == {mine, shared}, search_type

    response = charlie.delete(conv_path(shared, "memberships", "bob"))
    assert response.status_code == 204, response.content
    for search_type in ("fulltext", "semantic", "auto"):
        assert conversation_ids(search(bob, "penguin", searchType=search_type)) == [mine], search_type

    # A deleted conversation leaves search at once, for everyone.
    assert charlie.delete(conv_path(foreign)).status_code == 204
    for search_type in ("fulltext", "semantic", "auto"):
        assert conversation_ids(search(charlie, "penguin", searchType=search_type)) == [shared], search_type


def test_forks_share_the_trees_members(bob, charlie):
    root = new_id()
    first = append_ok(bob, root, "x", indexedContent="kayak route planning")
    fork = new_id()
    append_ok(bob, fork, "x", indexedContent="kayak rental prices",
              forkedAtConversationId=root, forkedAtEntryId=first["id"])
    add_member(bob, root, "charlie", "reader")
    assert set(conversation_ids(search(charlie, "kayak", searchType="fulltext"))) == {root, fork}


def test_pages_are_full_despite_many_unreadable_matches(bob, charlie):
    readable = []
    for index in range(7):
        cid = new_id()
        append_ok(bob, cid, "x", indexedContent=f"walrus sighting number {index}")
        readable.append(cid)
    for index in range(30):  # matches bob may not read: a post-filter would make bob's pages short
        append_ok(charlie, new_id(), "x", indexedContent=f"walrus walrus walrus {index}")
    indexer.run_cycle()
    for search_type in ("fulltext", "semantic", "auto"):
        first = search(bob, "walrus", searchType=search_type, limit=5)
        assert len(first["data"]) == 5 and first["afterCursor"], search_type
        second = search(bob, "walrus", searchType=search_type, limit=5, afterCursor=first["afterCursor"])
        assert len(second["data"]) == 2 and second["afterCursor"] is None, search_type
        assert set(conversation_ids(first)) | set(conversation_ids(second)) == set(readable)


# --- Paging ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("search_type", ["fulltext", "semantic", "auto"])
def test_paging_has_no_duplicates_and_misses_nothing(bob, plan, search_type):
    expected = set()
    for index in range(23):
        cid = new_id()
        # Ties on purpose (identical texts): the keyset must break them by conversation id.
        text = "lighthouse keeper diary" if index % 3 else f"lighthouse keeper diary page {index % 5}"
        append_ok(bob, cid, "x", indexedContent=text)
        if index % 4 == 0:
            append_ok(bob, cid, "x", indexedContent="the lighthouse again")
        expected.add(cid)
    indexer.run_cycle()
    pages = every_page(bob, "lighthouse keeper", searchType=search_type, limit=4)
    assert all(len(body["data"]) == 4 for body in pages[:-1])
    seen = [cid for body in pages for cid in conversation_ids(body)]
    scores = [item["score"] for body in pages for item in body["data"]]
    assert len(seen) == len(set(seen)) == 23
    assert set(seen) == expected
    assert scores == sorted(scores, reverse=True)


def test_foreign_and_malformed_cursors_are_400(bob):
    for index in range(3):
        append_ok(bob, new_id(), "x", indexedContent=f"glacier {index}")
    cursor = search(bob, "glacier", searchType="fulltext", limit=1)["afterCursor"]
    assert cursor
    # Another query's, another method's and another list's cursors.
    for body in (
        {"query": "glaciers", "searchType": "fulltext", "afterCursor": cursor},
        {"query": "glacier", "searchType": "semantic", "afterCursor": cursor},
        {"query": "glacier", "afterCursor": "not-a-cursor"},
        {"query": "glacier", "afterCursor": "W251bGwsIm51bGwiXQ"},
    ):
        assert_validation_error(bob.post(SEARCH, body, format="json"), "afterCursor")
    entries_cursor = bob.get(url(conv_path(new_id_with_entries(bob), "entries"), limit=1)).json()["afterCursor"]
    assert_validation_error(
        bob.post(SEARCH, {"query": "glacier", "afterCursor": entries_cursor}, format="json"), "afterCursor"
    )


def new_id_with_entries(client) -> str:
    cid = new_id()
    append_ok(client, cid, "one")
    append_ok(client, cid, "two")
    return cid


# --- Bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "query"),
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "x" * 1001}, "query"),
        ({"query": 5}, "query"),
        ({"query": "a\u0000b"}, "query"),
        ({"query": "ok", "searchType": "fuzzy"}, "searchType"),
        ({"query": "ok", "limit": 0}, "limit"),
        ({"query": "ok", "limit": 201}, "limit"),
        ({"query": "ok", "limit": "5"}, "limit"),
        ({"query": "ok", "limit": True}, "limit"),
        ({"query": "ok", "afterCursor": 7}, "afterCursor"),
        ({"query": "ok", "offset": 7}, "offset"),
    ],
)
def test_bad_search_input_is_400(bob, body, field):
    assert_validation_error(bob.post(SEARCH, body, format="json"), field)


def test_lone_surrogates_and_nul_are_400_not_500(bob):
    for raw in ('{"query": "ok", "searchType": "\\ud800"}', '{"query": "\\ud800"}', '{"query": "ok", "afterCursor": "\\ud800"}',
                '{"query": "ok", "afterCursor": "a\\u0000"}'):
        response = bob.post(SEARCH, raw, content_type="application/json")
        assert response.status_code == 400, (raw, response.content)
        assert response.json()["code"] == "validation_error"


def test_search_needs_authentication_and_a_json_object(api, bob):
    response = api.post(SEARCH, {"query": "x"}, format="json")
    assert response.status_code == 401
    response = bob.post(SEARCH, ["x"], format="json")
    assert response.status_code == 400


def test_odd_queries_never_fail(bob):
    append_ok(bob, new_id(), "x", indexedContent="the cat sat on the mat")
    for query in ["the", "!!!", "'", '"', "a & b | !c", "cat:*", "-", "or", "(((", "ü ß 漢字", "cat -", '"cat']:
        for search_type in ("fulltext", "auto", "semantic"):
            search(bob, query, searchType=search_type)


def test_embedding_outage_auto_falls_back_to_fulltext_and_semantic_is_503(bob, monkeypatch):
    from apps.retrieval.embeddings import EmbeddingError, get_provider

    cid = new_id()
    append_ok(bob, cid, "x", indexedContent="volcano eruption report")
    indexer.run_cycle()

    def down(_text):
        raise EmbeddingError("provider down")

    monkeypatch.setattr(get_provider(), "embed_query", down)
    assert conversation_ids(search(bob, "volcano")) == [cid]
    response = bob.post(SEARCH, {"query": "volcano", "searchType": "semantic"}, format="json")
    assert response.status_code == 503, response.content
    assert response.json()["code"] == "unavailable"


def test_auto_reads_the_words_while_the_query_is_embedded(bob, monkeypatch):
    """As memory search: the words half runs while the encoder embeds the query (apps.retrieval.embeddings.meanwhile)."""
    from apps.conversations import search as conversation_search
    from apps.retrieval.embeddings import get_provider

    cid = new_id()
    append_ok(bob, cid, "x", indexedContent="volcano eruption report")
    indexer.run_cycle()
    met = meet(monkeypatch, (conversation_search, "fulltext_hits"), (get_provider(), "embed_query"))
    assert conversation_ids(search(bob, "volcano")) == [cid]
    assert met == [True, True]


# --- Admin ----------------------------------------------------------------------------------------------------------


def test_admin_search_sees_everything_and_is_audited(bob, charlie, client_for):
    first, second = new_id(), new_id()
    append_ok(bob, first, "x", indexedContent="aurora borealis photos")
    append_ok(charlie, second, "x", indexedContent="aurora forecast")
    indexer.run_cycle()
    auditor = client_for("aude", roles=("user", "auditor"))
    before = count("admin_audit_log", "action = %s", ["admin.conversations.search"])
    body = search(auditor, "aurora", path=f"{ADMIN}/search", searchType="fulltext")
    assert set(conversation_ids(body)) == {first, second}
    assert count("admin_audit_log", "action = %s", ["admin.conversations.search"]) == before + 1
    assert search(auditor, "aurora", path=SEARCH)["data"] == []  # the user endpoint: only their own
    response = bob.post(f"{ADMIN}/search", {"query": "aurora"}, format="json")
    assert response.status_code == 403
    assert_validation_error(auditor.post(f"{ADMIN}/search", {"query": "a", "limit": 1001}, format="json"), "limit")
    response = auditor.post(f"{ADMIN}/search", {"query": "aurora", "limit": 1000}, format="json")
    assert response.status_code == 200


# --- Unindexed and index ------------------------------------------------------------------------------------------


def test_unindexed_lists_exactly_the_entries_without_text(bob, indexer_client, settings):
    settings.CONVERSATION_AUTO_INDEX = False
    cid = new_id()
    pending = [append_ok(bob, cid, f"entry {index}") for index in range(5)]
    append_ok(bob, cid, "given", indexedContent="given text")
    listed = []
    cursor = None
    while True:
        response = indexer_client.get(url(UNINDEXED, limit=2, afterCursor=cursor))
        assert response.status_code == 200, response.content
        body = response.json()
        listed += body["data"]
        cursor = body["afterCursor"]
        if cursor is None:
            break
    assert [item["entry"] for item in listed] == pending
    assert {item["conversationId"] for item in listed} == {cid}

    assert indexer.run_cycle().indexed == 1  # auto-index off: only the given text is embedded
    response = indexer_client.post(
        INDEX,
        [{"conversationId": cid, "entryId": pending[0]["id"], "indexedContent": "sunflower field"},
         {"conversationId": cid, "entryId": pending[1]["id"], "indexedContent": ""}],
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"indexed": 2}
    body = indexer_client.get(UNINDEXED).json()
    assert [item["entry"]["id"] for item in body["data"]] == [entry["id"] for entry in pending[2:]]
    assert conversation_ids(search(bob, "sunflower", searchType="fulltext")) == [cid]
    assert search(bob, "sunflower", searchType="semantic")["data"] == []  # vectors follow from the indexer
    assert indexer.run_cycle().indexed == 2
    assert conversation_ids(search(bob, "sunflower", searchType="semantic")) == [cid]


def test_index_replaces_text_and_vectors(bob, indexer_client):
    cid = new_id()
    entry = append_ok(bob, cid, "tulips in the rain")
    indexer.run_cycle()
    assert conversation_ids(search(bob, "tulips")) == [cid]
    response = indexer_client.post(
        INDEX, [{"conversationId": cid, "entryId": entry["id"], "indexedContent": "orchids indoors"}], format="json"
    )
    assert response.status_code == 200, response.content
    indexer.run_cycle()
    for search_type in ("fulltext", "semantic", "auto"):
        assert search(bob, "tulips", searchType=search_type)["data"] == [], search_type
        assert conversation_ids(search(bob, "orchids", searchType=search_type)) == [cid], search_type
    assert count("conversation_entry_vectors", "entry_id = %s", [entry["id"]]) == 1


def test_index_and_unindexed_need_the_indexer_role(bob, client_for):
    cid = new_id()
    entry = append_ok(bob, cid, "hello")
    item = [{"conversationId": cid, "entryId": entry["id"], "indexedContent": "x"}]
    assert bob.get(UNINDEXED).status_code == 403
    assert bob.post(INDEX, item, format="json").status_code == 403
    admin = client_for("alice")  # admin implies indexer
    assert admin.get(UNINDEXED).status_code == 200
    assert admin.post(INDEX, item, format="json").status_code == 200


def test_index_bad_input(bob, indexer_client):
    cid = new_id()
    entry = append_ok(bob, cid, "hello")
    good = {"conversationId": cid, "entryId": entry["id"], "indexedContent": "x"}
    for raw in ("null", "5", '"x"', "[null]", "[[]]"):
        response = indexer_client.post(INDEX, raw, content_type="application/json")
        assert response.status_code == 400, (raw, response.content)
    for raw in ("null", "[]", "5"):
        response = bob.post(SEARCH, raw, content_type="application/json")
        assert response.status_code == 400, (raw, response.content)
    for body in ([], {"conversationId": cid}, [{**good, "extra": 1}], [{**good, "entryId": "nope"}],
                 [{**good, "indexedContent": None}], [{**good, "indexedContent": "x" * 65537}],
                 [good] * 1001):
        response = indexer_client.post(INDEX, body, format="json")
        assert response.status_code == 400, (body if len(str(body)) < 200 else "big", response.content[:300])
    # An entry of another conversation, or an unknown one: 404 for the whole batch, nothing written.
    other = new_id()
    append_ok(bob, other, "elsewhere")
    unknown = str(uuid.uuid4())
    response = indexer_client.post(
        INDEX, [good, {**good, "conversationId": other}, {**good, "entryId": unknown}], format="json"
    )
    assert response.status_code == 404, response.content
    assert set(response.json()["details"]["entryIds"]) == {entry["id"], unknown}
    assert sql("SELECT indexed_content FROM conversation_entries WHERE id = %s", [entry["id"]]) == [(None,)]


def test_index_text_is_plaintext_and_content_stays_encrypted(bob):
    cid = new_id()
    append_ok(bob, cid, "my secret diary words")
    indexer.run_cycle()
    ((content, indexed),) = sql(
        "SELECT content, indexed_content FROM conversation_entries WHERE conversation_id = %s", [cid]
    )
    assert b"secret diary" not in bytes(content)
    assert indexed == "my secret diary words"  # D5: the search index text is plaintext, like titles


# --- Semantic with the real model ---------------------------------------------------------------------------------


@pytest.mark.model
def test_real_model_finds_paraphrases(bob, settings, plan):
    settings.EMBEDDING_PROVIDER = "local"  # the provider is rebuilt on the setting change
    cooking, finance, sport = new_id(), new_id(), new_id()
    append_ok(bob, cooking, "I simmered a pot of tomato sauce with fresh basil for the spaghetti tonight")
    append_ok(bob, finance, "Shares dropped sharply after the central bank raised interest rates")
    append_ok(bob, sport, "The striker scored in the last minute and the crowd went wild")
    assert indexer.run_cycle().indexed == 3
    # No word in common with the entries.
    body = search(bob, "making an Italian pasta dinner", searchType="semantic")
    assert conversation_ids(body)[0] == cooking
    body = search(bob, "stock market slump", searchType="semantic")
    assert conversation_ids(body)[0] == finance
    assert conversation_ids(search(bob, "football match ending", searchType="auto"))[0] == sport


def test_readyz_and_metrics_show_the_conversation_indexer_backlog(bob, api):
    cid = new_id()
    append_ok(bob, cid, "waiting to be indexed")
    append_ok(bob, cid, "x", indexedContent="vectors pending")
    body = api.get("/readyz").json()
    assert body["conversation_indexer"]["backlog"] == 2, body
    assert bob.delete(conv_path(cid)).status_code == 204  # a deleted conversation's entries wait for nothing
    assert api.get("/readyz").json()["conversation_indexer"]["backlog"] == 0
    append_ok(bob, new_id(), "another")
    api.get("/readyz")
    assert "conversation_indexer_backlog 1.0" in api.get("/metrics").content.decode()
    indexer.run_cycle()
    assert "conversation_indexer_backlog 0.0" in api.get("/metrics").content.decode()
