"""Conversation search's full-text ranking through HTTP (issue 30, D11 "words and meaning"): BM25 over any of the
query's words, rare words weighing more, idf computed over the caller's own scope; phrases, exclusions and the
last word's prefix as before; paging a fixed result set."""

from __future__ import annotations

import pytest

from apps.conversations import indexer
from tests.conversations.support import ADMIN, add_member, append_ok, conversation_ids, every_page, new_id, search

pytestmark = pytest.mark.django_db

CODES = ["SW8629", "KX1043", "PL7781", "QT5520", "ZB3308"]


def scores(body) -> dict[str, float]:
    return {item["conversationId"]: item["score"] for item in body["data"]}


@pytest.fixture
def bob(client_for):
    return client_for("bob")


@pytest.fixture
def charlie(client_for):
    return client_for("charlie")


def seed_orders(client) -> dict[str, str]:
    """20 conversations about order status and one per code (its text names no order or status)."""
    for index in range(20):
        append_ok(client, new_id(), "x", indexedContent=f"order status update {index}: the order status is shipped")
    by_code = {}
    for index, code in enumerate(CODES):
        by_code[code] = new_id()
        place = ["hallway closet", "garage shelf", "attic box", "kitchen drawer", "basement"][index]
        append_ok(client, by_code[code], "x", indexedContent=f"the router is in the {place}; reference {code}.")
    return by_code


def test_a_paraphrase_sharing_some_words_is_found(bob):
    trip, other = new_id(), new_id()
    append_ok(bob, trip, "x", indexedContent="We are planning a long weekend in Lisbon next spring, mostly for food.")
    append_ok(bob, other, "x", indexedContent="The quarterly budget review moved to Thursday.")
    # Not every word of the query is in the text ("ideas", "holiday"): any word counts, so it is still found.
    body = search(bob, "holiday ideas for Lisbon", searchType="fulltext")
    assert conversation_ids(body) == [trip]
    assert "**Lisbon**" in body["data"][0]["highlights"]
    assert 0 < body["data"][0]["score"] < 1


@pytest.mark.parametrize("search_type", ["fulltext", "auto"])
def test_a_rare_code_outranks_many_common_words(bob, search_type):
    by_code = seed_orders(bob)
    indexer.run_cycle()  # the vectors, for auto
    for code, conversation_id in by_code.items():
        body = search(bob, f"order status for reference {code}", searchType=search_type)
        assert conversation_ids(body)[0] == conversation_id, code
        ranked = body["data"]
        assert all(0 <= item["score"] <= 1 for item in ranked)
        assert [item["score"] for item in ranked] == sorted((item["score"] for item in ranked), reverse=True)
        if search_type == "fulltext":  # well above another code's entry ("reference") or an order-status one
            assert ranked[0]["score"] > 1.5 * ranked[1]["score"], code


def test_a_term_weighs_by_how_rare_it_is_in_the_callers_scope(bob):
    common, rare = new_id(), new_id()
    for _ in range(10):
        append_ok(bob, new_id(), "x", indexedContent="a note about the garden")
    append_ok(bob, common, "x", indexedContent="garden party")
    append_ok(bob, rare, "x", indexedContent="telescope party")
    # Both match one word of two; "telescope" is in one entry, "garden" in eleven.
    assert conversation_ids(search(bob, "garden telescope", searchType="fulltext"))[0] == rare


def test_other_tenants_texts_never_move_a_callers_scores(bob, charlie):
    mine = seed_orders(bob)
    before = scores(search(bob, "order status for reference SW8629", searchType="fulltext", limit=50))
    # Charlie writes the same words many times over (and the code itself): bob's df, N and mean length are his own.
    for index in range(30):
        append_ok(charlie, new_id(), "x", indexedContent=f"reference SW8629 order {index} status, reference again")
    after = scores(search(bob, "order status for reference SW8629", searchType="fulltext", limit=50))
    assert after == before
    theirs = search(charlie, "order status for reference SW8629", searchType="fulltext", limit=50)
    assert len(theirs["data"]) == 30 and not set(conversation_ids(theirs)) & set(mine.values())
    # Sharing one of charlie's conversations with bob puts it in his scope: then, and only then, it counts.
    add_member(charlie, theirs["data"][0]["conversationId"], "bob", "reader")
    shared = scores(search(bob, "order status for reference SW8629", searchType="fulltext", limit=50))
    assert shared[mine["SW8629"]] != before[mine["SW8629"]]


def test_admin_search_ranks_over_every_live_conversation(bob, charlie, client_for):
    mine = seed_orders(bob)
    append_ok(charlie, new_id(), "x", indexedContent="order status for the spring sale")
    auditor = client_for("aude", roles=("user", "auditor"))
    body = search(auditor, "order status for reference KX1043", path=f"{ADMIN}/search", searchType="fulltext", limit=50)
    assert conversation_ids(body)[0] == mine["KX1043"]
    assert len(body["data"]) == 20 + len(CODES) + 1  # every conversation with any of the words
    # Its idf is the whole service's, not bob's: the same entry scores differently than in bob's own search.
    own = scores(search(bob, "order status for reference KX1043", searchType="fulltext", limit=50))
    assert scores(body)[mine["KX1043"]] != own[mine["KX1043"]]


def test_phrases_exclusions_and_prefix_with_any_word_ranking(bob):
    budget, weather, lisbon = new_id(), new_id(), new_id()
    append_ok(bob, budget, "x", indexedContent="the quarterly budget review is on Monday")
    append_ok(bob, weather, "x", indexedContent="budget for rain gear given the weather this quarter")
    append_ok(bob, lisbon, "x", indexedContent="flights to Lisbon are cheap in March")
    assert set(conversation_ids(search(bob, "budget lisbon", searchType="fulltext"))) == {budget, weather, lisbon}
    # A quoted phrase must be there, in order; the other words still only rank.
    assert conversation_ids(search(bob, '"quarterly budget" lisbon', searchType="fulltext")) == [budget]
    assert conversation_ids(search(bob, '"budget quarterly"', searchType="fulltext")) == []
    # An excluded word removes an entry that other words match; a stop word alone excludes nothing.
    assert set(conversation_ids(search(bob, "budget lisbon -weather", searchType="fulltext"))) == {budget, lisbon}
    assert set(conversation_ids(search(bob, 'budget -"rain gear"', searchType="fulltext"))) == {budget}
    assert set(conversation_ids(search(bob, "budget -the", searchType="fulltext"))) == {budget, weather}
    # The last bare word is also a prefix (of three letters or more); a quoted or excluded one is not.
    assert conversation_ids(search(bob, "lisb", searchType="fulltext")) == [lisbon]
    assert conversation_ids(search(bob, "cheap flights lisb", searchType="fulltext"))[0] == lisbon
    assert conversation_ids(search(bob, '"lisb"', searchType="fulltext")) == []
    assert conversation_ids(search(bob, "li", searchType="fulltext")) == []
    # Stop words and exclusions alone rank nothing.
    assert search(bob, "the of and", searchType="fulltext")["data"] == []
    assert search(bob, "-budget", searchType="fulltext")["data"] == []


def test_long_and_odd_queries_are_answered(bob):
    cid = new_id()
    append_ok(bob, cid, "x", indexedContent="it's O'Brien's back\\slash report: a&b | c:* !d")
    words = " ".join(f"w{index}" for index in range(150))  # far more terms than are ranked
    assert search(bob, f"{words} report", searchType="fulltext")["data"] == []  # the cap keeps the first ones
    assert conversation_ids(search(bob, f"report {words}", searchType="fulltext")) == [cid]
    for query in ["o'brien", "back\\slash", "a&b | c:*", "'report'", "report:*", "!d & report"]:
        assert conversation_ids(search(bob, query, searchType="fulltext")) == [cid], query
    assert search(bob, '"unclosed report', searchType="fulltext")["data"] == []  # a phrase to the end, as websearch


@pytest.mark.parametrize("search_type", ["fulltext", "auto"])
def test_a_fixed_result_set_pages_without_repeats(bob, search_type):
    expected = set()
    for index in range(17):
        cid = new_id()
        # Scores spread by length and repetition, with ties (index % 4 == 0 texts are identical).
        filler = " ".join(["harbour"] * (index % 5))
        text = (
            "ferry timetable" if index % 4 == 0 else f"ferry {filler} timetable notes {index} {'ferry ' * (index % 3)}"
        )
        append_ok(bob, cid, "x", indexedContent=text)
        expected.add(cid)
    unrelated = new_id()
    append_ok(bob, unrelated, "x", indexedContent="nothing to do with boats")
    indexer.run_cycle()
    if search_type == "auto":  # the semantic half ranks every conversation
        expected.add(unrelated)
    pages = every_page(bob, "ferry timetable harbour", searchType=search_type, limit=3)
    seen = [cid for body in pages for cid in conversation_ids(body)]
    ranked = [item["score"] for body in pages for item in body["data"]]
    assert len(seen) == len(set(seen)) == len(expected) and set(seen) == expected
    assert ranked == sorted(ranked, reverse=True)
    whole = search(bob, "ferry timetable harbour", searchType=search_type, limit=50)
    assert conversation_ids(whole) == seen
