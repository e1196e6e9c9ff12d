"""Terms of a text for keyword search, and their keyed hashes (D11 "words and meaning").

A memory's keyword index may not hold its index text (the interface keeps the vector store free of plaintext), so it
holds each term's keyed hash: HMAC-SHA256 under a key derived from the encryption key ring (crypto.derive_key,
purpose ``TERM_KEY_PURPOSE``), cut to a signed 64-bit integer. Equal terms hash equal under one key, so a query's
terms find the documents' by equality; without the key nobody can test a guess. Term frequencies and document
lengths stay (BM25 needs them; apps.retrieval.lexical).

Normalisation: Unicode NFKC, casefolded, split on anything that is not a letter or a digit (so ``SW-8629`` is two
terms and ``SW8629`` one: codes are kept whole as typed), English stop words dropped, and a light suffix stemmer so
``shipped``, ``shipping`` and ``ships`` meet, and ``note``, ``notes`` and ``noted``. Numbers and tokens holding a digit are
never stemmed. Changing any of this changes the stored hashes: a migration then rebuilds the index
(``keyword_index.rebuild``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator

from apps.encryption import crypto

TERM_KEY_PURPOSE = "memory-service keyword terms v1"
MAX_QUERY_TERMS = 16  # a query's distinct terms beyond these are ignored (bounds the lookup)
MAX_TERM_CHARS = 64  # longer runs are cut (no word is longer; a base64 blob is not worth more)

_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between both
    but by can did do does doing down during each few for from further had has have having he her here hers herself him
    himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their theirs them themselves then
    there these they this those through to too under until up very was we were what when where which while who whom
    why will with would you your yours yourself yourselves""".split()
)
_SUFFIXES = ("ingly", "edly", "ings", "ing", "ies", "ied", "ed", "es", "s", "ly")
_ES_AFTER = ("s", "x", "z", "ch", "sh", "o")  # "boxes", "wishes", "potatoes": the plural adds "es"


def _stem(term: str) -> str:
    """``term`` without its inflection, so that its forms meet: ``ship``, ``ships``, ``shipped``, ``shipping``;
    and, by dropping a final "e", ``note``, ``notes``, ``noted``, ``noting`` (all ``not``: a stop word never is a
    term, so no real word collides with it)."""
    if any(ch.isdigit() for ch in term) or len(term) <= 3:
        return term
    stem = term
    for suffix in _SUFFIXES:
        if term.endswith(suffix) and len(term) - len(suffix) >= 3:
            stem = term[: -len(suffix)]
            if suffix in ("ies", "ied"):
                return stem + "y"
            if suffix == "es" and not stem.endswith(_ES_AFTER):  # "notes" is "note" + "s"
                stem = term[:-1]
            if suffix == "s" and stem.endswith("s"):  # "glass" is not a plural
                return term
            if suffix[0] in "ei" and len(stem) >= 4 and stem[-1] == stem[-2] and stem[-1] not in "aeioulsz":
                stem = stem[:-1]  # "shipp" -> "ship"
            break
    while len(stem) >= 4 and stem.endswith("e"):  # "agree", "agreed": "agr"
        stem = stem[:-1]
    return stem


def terms(text: str) -> list[str]:
    """The terms of ``text`` in order, repeats kept (their count is the term frequency)."""
    return [term for _token, term in _tokens(text)]


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    """Each (token, term) of ``text`` in order: the normalised word as written, and the term it gives."""
    normalized = unicodedata.normalize("NFKC", text).casefold()
    for token in _TOKEN.findall(normalized):
        if token not in STOP_WORDS:
            yield token, _stem(token[:MAX_TERM_CHARS])


def query_terms(text: str) -> list[str]:
    """A query's distinct terms, in order of appearance, at most MAX_QUERY_TERMS."""
    return list(dict.fromkeys(terms(text)))[:MAX_QUERY_TERMS]


def common_query_terms(text: str) -> set[str]:
    """Those of ``query_terms(text)`` that are common words: every token of the query that gives the term, or the
    term itself ("closets": "closet"), is a whole word of the local model's vocabulary, letters only. Codes, ids,
    anything holding a digit, most names and rare words are not: the encoder reads them as pieces, not as a word."""
    vocabulary = _vocabulary()
    common: dict[str, bool] = {}
    for token, term in _tokens(text):
        known = token.isalpha() and (token in vocabulary or term in vocabulary)  # "closets": "closet"
        common[term] = common.get(term, True) and known
    return {term for term, is_common in common.items() if is_common}


@functools.cache
def _vocabulary() -> frozenset[str]:
    """The whole words of all-MiniLM-L6-v2's WordPiece vocabulary (about 22,500), shipped with its package; empty
    without the package (then no term is common)."""
    from apps.retrieval.embeddings import EmbeddingError, minilm

    try:
        lines = (minilm.model_path() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    except (EmbeddingError, OSError):  # the package is needed by the local provider only
        return frozenset()
    return frozenset(line for line in lines if line.isalpha())


def term_key(kid: str) -> bytes:
    return crypto.derive_key(kid, TERM_KEY_PURPOSE)


def term_hash(key: bytes, term: str) -> int:
    digest = hmac.new(key, term.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def hashed_document(key: bytes, texts: Iterable[str]) -> tuple[list[int], list[int], int]:
    """(term hashes, their frequencies, document length in terms) of a document made of ``texts``."""
    counts = Counter(term for text in texts for term in terms(text))
    hashes = [term_hash(key, term) for term in counts]
    return hashes, list(counts.values()), sum(counts.values())
