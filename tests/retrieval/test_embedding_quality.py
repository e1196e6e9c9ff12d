"""The quality gate of the local model's default runtime (onnxruntime on the ONNX export) against the model on
torch (sentence-transformers, fp32), which is what every stored vector was made with before the export existed:

* on 1,000 varied texts (short, long past the 256-token window, other scripts, code, blank) every vector has
  cosine >= 0.99999 to torch's (embedded together with the 1,000 other texts of the search corpus below);
* a query's vector in a batch (the query batcher) equals its vector alone;
* on a 2,000-text corpus, the 10 nearest texts of each of 100 queries are the same as torch's (recall@10 = 1.0);
* long texts are chunked exactly as before (the offsets of the ``tokenizers`` library equal those of the Hugging
  Face tokenizer sentence-transformers uses);
* the indexers' path (``embed_chunked``: each text tokenized once, its pieces' tokens taken from it) gives the
  vectors of chunking then embedding every piece, and torch's own document path (the GPU worker's) those of
  sentence-transformers' ``encode``.

torch's vectors are computed once and cached under var/test-cache/, keyed by the texts, the model's files and the
torch and sentence-transformers versions, so a run after the first does not run torch at all.
"""

from __future__ import annotations

import hashlib
import random
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.conf import settings

from apps.retrieval.embeddings import local, minilm

pytestmark = pytest.mark.model

SUBJECTS = ["Bob", "the user", "my manager", "Alice from finance", "the on-call engineer", "our biggest customer",
            "Grandma", "the landlord", "Dr. Patel", "the new intern", "the design team", "Bob's sister"]  # fmt: skip
VERBS = ["prefers", "asked for", "forgot", "ordered", "reviewed", "cancelled", "is allergic to", "wants", "deployed",
         "complained about", "booked", "paid for", "renamed", "archived", "scheduled"]  # fmt: skip
OBJECTS = ["oat milk in coffee", "the quarterly budget draft", "a window seat on the flight to Kyoto", "peanuts",
           "the billing service", "weekly status reports", "the dentist appointment", "a standing desk",
           "the Rust ingestion pipeline", "dark mode", "the 7:40 train", "a sourdough starter", "invoices in euros",
           "the kitchen renovation", "the vacation calendar", "a talk on vector databases", "the contract",
           "tomatoes and basil", "a new road bike", "the onboarding checklist"]  # fmt: skip
CONTEXTS = ["since last spring", "according to the March meeting notes", "when travelling for work", "yesterday",
            "during the retrospective", "for the foreseeable future", "after the incident review", "on Fridays",
            "until the end of the year", "as a long-standing habit", ""]  # fmt: skip
FOREIGN = ["Bob trinkt morgens einen Flat White.", "Le client préfère les réponses concises.", "東京で会議があります。",
           "Боб предпочитает чай после обеда.", "El informe trimestral está listo.", "naïve café résumé Zürich ☕🚀",
           "¿Dónde está la llave de repuesto?", "Η συνάντηση μεταφέρθηκε στις 9:30.", "오늘 회의는 취소되었습니다."]  # fmt: skip  # noqa: RUF001
ODD = ["", " ", "\n\t", "?", "ok", "SELECT * FROM memory_vectors WHERE field = 'text' LIMIT 10;",
       "https://example.com/a/b?c=d#e", "user@example.com", "+1 (555) 010-9999", "$12.50 / 3 = 4.1666…",
       "def f(x):\n    return x ** 2", "   padded with spaces   ", "ALL CAPS SHOUTING ABOUT THE DEPLOY",
       "a" * 300, "word " * 600]  # fmt: skip


def varied_texts(count: int, seed: int, *, long_share: float = 0.04, paragraph: int = 6) -> list[str]:
    """``count`` distinct, deterministic texts of every shape the service embeds: facts, questions, paragraphs of up
    to ``paragraph`` facts (a ``long_share`` of them past the model's 256-token window), other scripts, code and
    edge cases."""
    rng = random.Random(seed)

    def fact() -> str:
        return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(CONTEXTS)}".strip()

    texts = dict.fromkeys([*ODD, *FOREIGN])
    while len(texts) < count:
        kind = rng.random()
        if kind < long_share:
            text = " ".join(fact() + "." for _ in range(rng.randint(25, 45)))  # past the 256-token window
        elif kind < 0.5:
            text = fact() + rng.choice([".", "", "!", " ..."])
        elif kind < 0.7:
            text = f"what does {rng.choice(SUBJECTS).lower()} {rng.choice(['want', 'know', 'say'])} about {rng.choice(OBJECTS)}?"
        elif kind < 0.85:
            text = " ".join(fact() + "." for _ in range(rng.randint(2, paragraph)))
        else:
            text = f"{rng.choice(FOREIGN)} {fact()} #{rng.randint(0, 999)}"
        texts.setdefault(text)
    return list(texts)[:count]


def torch_reference(texts: list[str]) -> np.ndarray:
    """sentence-transformers on torch, fp32, CPU: the model as published. Cached by everything that decides it."""
    path = minilm.model_path()
    key = hashlib.sha256(
        "\0".join([minilm.model_digest(path), version("torch"), version("sentence-transformers"), *texts]).encode()
    ).hexdigest()[:24]
    cache = Path(settings.DATA_DIR) / "test-cache" / f"embeddings-torch-{key}.npy"
    if cache.exists():
        return np.load(cache)
    model = minilm.TorchEncoder(minilm.ModelFiles(path)).model
    vectors = model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    cache.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache.with_suffix(f".{threading.get_ident()}.tmp.npy")
    np.save(temporary, vectors)
    temporary.replace(cache)
    return vectors


@pytest.fixture(scope="module")
def provider() -> local.LocalEmbeddingProvider:
    """The default local provider: what the web processes and the worker run."""
    return local.LocalEmbeddingProvider(onnx_dir=settings.EMBEDDING_ONNX_DIR)


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return varied_texts(1000, seed=23)


@pytest.fixture(scope="module")
def corpus(sentences: list[str]) -> list[str]:
    """2,000 texts: the 1,000 varied sentences, then 1,000 memory-sized ones. Embedded once by each runtime for both
    the cosine gate (the first 1,000) and the search comparison (all of them)."""
    seen = set(sentences)
    memory_sized = [t for t in varied_texts(2000, seed=2000, long_share=0.005, paragraph=3) if t not in seen]
    return [*sentences, *memory_sized[:1000]]


@pytest.fixture(scope="module")
def corpus_vectors(provider: local.LocalEmbeddingProvider, corpus: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ours, torch's) for ``corpus``; ours through the worker's path."""
    return np.asarray(provider.embed_documents(corpus), dtype=np.float32), torch_reference(corpus)


def test_default_backend_is_onnxruntime(provider: local.LocalEmbeddingProvider) -> None:
    encoder = local.load(provider.queries)
    assert encoder.backend == "onnx" and local.load(provider.documents) is encoder


def test_vectors_match_torch_on_1000_varied_texts(
    sentences: list[str], corpus_vectors: tuple[np.ndarray, np.ndarray]
) -> None:
    ours, reference = (vectors[: len(sentences)] for vectors in corpus_vectors)
    cosines = (ours * reference).sum(axis=1)
    worst = int(cosines.argmin())
    assert cosines.min() >= 0.99999, (cosines.min(), sentences[worst][:80])
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_a_batched_query_equals_a_lone_encode(provider: local.LocalEmbeddingProvider, sentences: list[str]) -> None:
    texts = sentences[:48]
    alone = {text: provider.embed_query(text) for text in texts}
    encoder = local.load(provider.queries)
    batch_sizes: list[int] = []
    original = encoder.encode

    def recording(batch: list[str], batch_size: int) -> Any:
        batch_sizes.append(len(batch))
        return original(batch, batch_size)

    together: dict[str, list[float]] = {}
    barrier = threading.Barrier(len(texts))

    def search(text: str) -> None:
        barrier.wait()
        together[text] = provider.embed_query(text)

    encoder.encode = recording  # type: ignore[method-assign]
    try:
        workers = [threading.Thread(target=search, args=(text,)) for text in texts]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        del encoder.encode
    assert max(batch_sizes) > 1, batch_sizes  # the queries were batched...
    for text in texts:  # ...and each got the vector it gets alone
        assert np.abs(np.subtract(alone[text], together[text])).max() < 1e-6, text[:80]


def test_search_results_match_torch_on_a_2000_text_corpus(
    provider: local.LocalEmbeddingProvider, corpus: list[str], corpus_vectors: tuple[np.ndarray, np.ndarray]
) -> None:
    assert len(corpus) == 2000
    queries = [text for text in varied_texts(400, seed=7, long_share=0) if 8 < len(text) < 120][:100]
    ours, reference = corpus_vectors
    our_queries = np.asarray([provider.embed_query(q) for q in queries], dtype=np.float32)
    reference_queries = torch_reference(queries)
    ours_top = np.argsort(-(our_queries @ ours.T), axis=1, kind="stable")[:, :10]
    torch_top = np.argsort(-(reference_queries @ reference.T), axis=1, kind="stable")[:, :10]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ours_top, torch_top, strict=True)])
    assert recall == 1.0


def test_chunking_is_unchanged(provider: local.LocalEmbeddingProvider) -> None:
    """The chunks are those the provider cut with sentence-transformers' Hugging Face tokenizer before."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(minilm.model_path()), local_files_only=True)
    window, stride = 128, 96

    def chunk_before(text: str) -> list[str]:  # the torch-era implementation, verbatim but for the tokenizer call
        offsets = hf(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        if len(offsets) <= window:
            return [text]
        chunks, start = [], 0
        while True:
            end = min(start + window, len(offsets))
            begin = 0 if start == 0 else offsets[start][0]
            finish = len(text) if end == len(offsets) else offsets[end][0]
            chunks.append(text[begin:finish])
            if end == len(offsets):
                return chunks
            start += stride

    long_texts = [t for t in varied_texts(300, seed=5, long_share=0.3) if len(t) > 600][:60]
    long_texts.append("  " + "".join(f"Zürich 東京 naïve café, line {i}; " for i in range(300)) + " the end.  ")
    assert len(long_texts) > 40
    for text in long_texts:
        assert provider.chunk(text) == chunk_before(text)


def long_texts() -> list[str]:
    """Past the window, cut inside words and between them, in several scripts."""
    texts = [t for t in varied_texts(300, seed=5, long_share=0.3) if len(t) > 600][:40]
    texts.append("  " + "".join(f"Zürich 東京 naïve café, line {i}; " for i in range(120)) + " the end.  ")
    texts.append(" ".join(["unbelievably", "tokenization", "antidisestablishmentarianism"] * 60))
    return texts


def test_the_document_path_tokenizes_each_text_once(provider: local.LocalEmbeddingProvider) -> None:
    """``embed_chunked`` equals chunking then embedding every piece, and tokenizes again only the pieces cut
    inside a word (never a text that fits the window)."""
    long = long_texts()
    texts = [*long[:-2:4], *long[-2:], *varied_texts(100, seed=9)]
    encoder = local.load(provider.documents)
    tokenizer = encoder.chunker.model_tokenizer
    again: list[str] = []

    class Recording:
        def __getattr__(self, name: str) -> Any:
            return getattr(tokenizer, name)

        def encode_batch(self, pieces: list[str], *args: Any, **kwargs: Any) -> Any:
            again.extend(pieces)
            return tokenizer.encode_batch(pieces, *args, **kwargs)

    encoder.chunker.model_tokenizer = Recording()
    try:
        chunked = provider.embed_chunked(texts)
    finally:
        encoder.chunker.model_tokenizer = tokenizer
    pieces = [provider.chunk(text) for text in texts]
    assert [len(vectors) for vectors in chunked] == [len(p) for p in pieces]
    cut = [piece for of_text in pieces if len(of_text) > 1 for piece in of_text]
    assert 0 < len(again) < len(cut) / 2 and set(again) <= set(cut)
    ours = np.asarray([vector for vectors in chunked for vector in vectors], dtype=np.float32)
    separately = np.asarray(provider.embed_documents([piece for of_text in pieces for piece in of_text]), dtype=np.float32)
    assert np.abs(ours - separately).max() < 1e-5


def test_torch_document_path_matches_sentence_transformers(
    sentences: list[str], corpus_vectors: tuple[np.ndarray, np.ndarray]
) -> None:
    """TorchEncoder's own passes (the GPU worker's path: token ids padded with numpy, the model's modules called
    directly) against sentence-transformers' ``encode``, on the CPU."""
    encoder = minilm.TorchEncoder(minilm.ModelFiles(minilm.model_path()))
    pieces = [piece for text in long_texts()[-3:] for piece in encoder.chunker.chunk(text)]
    texts = sentences[:150] + pieces
    ours = encoder.encode_tokens(encoder.chunker.tokenize(texts), 32)
    reference = np.concatenate([corpus_vectors[1][:150], torch_reference(pieces)])  # the corpus starts with sentences
    cosines = (ours * reference).sum(axis=1)
    assert cosines.min() >= 0.99999


def test_torch_keeps_its_thread_count_on_the_encode_thread() -> None:
    """EMBEDDING_THREADS holds where torch runs, the encode thread, also after another runtime ran parallel work on
    that thread first (its OpenMP thread count then stayed at every core: a one-thread bench row used them all)."""
    import torch

    everywhere = local.LocalEmbeddingProvider(backend="torch", batch_size=8)
    everywhere.embed_chunked(["a first runtime runs parallel work on the encode thread"])
    original = torch.get_num_threads()
    one = local.LocalEmbeddingProvider(backend="torch", threads=1, batch_size=8)
    encoder = local.load(one.documents)
    seen: list[int] = []

    def forward(ids: Any, mask: Any) -> Any:
        seen.append(torch.get_num_threads())
        return minilm.TorchEncoder.forward(encoder, ids, mask)

    encoder.forward = forward  # type: ignore[method-assign]
    try:
        one.embed_chunked(["one thread"])
    finally:
        del encoder.forward
        torch.set_num_threads(original)  # for the tests after this one, on both threads
        local._encode_thread().submit(torch.set_num_threads, original).result()
    assert seen == [1]
