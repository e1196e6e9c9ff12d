"""The one-off ONNX export of the local model, cached on disk: the only code of the service that imports torch
when ``EMBEDDING_BACKEND=onnx``.

``python -m apps.retrieval.embeddings.onnx_export [--cache-dir DIR]`` exports all-MiniLM-L6-v2 from the package's own
files (nothing is downloaded) with the stack the service pins: ``torch.onnx.export(..., dynamo=False)`` of the
transformer with the model's pooling (mean over the attention mask) and L2 normalisation inside the graph, fp32.
Before the file is used it is checked against sentence-transformers on torch, the model as published: every probe
text's vector must have cosine >= MIN_COSINE to torch's, and a text's vector in a padded batch must equal its
vector alone. An export that fails the check is deleted and the command fails: a service never embeds with it.

The file is ``<cache dir>/all-MiniLM-L6-v2-<digest>-v<format>.onnx``, the digest over the model's files
(``minilm.model_digest``), so other weights never reuse it. Processes that start together (web workers, the worker,
beat) take an exclusive lock on ``<cache dir>/.export.lock``: one exports, the others wait and find the file. It is
written to a temporary name, flushed, and renamed into place only after the check, so a reader sees either no file
or a complete, checked one; a process killed mid-export leaves a temporary file the next export removes.

``manage.py up`` runs this before it starts the web server and the worker; the service's processes otherwise run it
(in a subprocess, so torch never enters them) when they find no export. Runs without Django.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .base import EmbeddingError
from .minilm import MODEL_NAME, ModelFiles, OnnxEncoder, TorchEncoder, model_digest, model_path

logger = logging.getLogger(__name__)

# Bump when the graph changes (inputs, outputs, opset, what is inside): older files are then left alone.
EXPORT_FORMAT = 1
OPSET = 17
MIN_COSINE = 0.99999
MAX_BATCH_DRIFT = 1e-5  # largest |difference| between a text's vector in a padded batch and alone

# What the check embeds: short and long, empty, punctuation, other scripts, a text far past the 256-token window.
PROBES = [
    "",
    " ",
    "hello",
    "bob likes a flat white in the morning",
    "What coffee does Bob drink?",
    "Deploy the Rust ingestion service on Friday after the 9:30 standup.",
    "Zürich, 東京, naïve café ☕ — résumé; 12.5% off!!!",
    "   leading and trailing spaces   ",
    "SELECT id FROM memories WHERE namespace @> '{user,bob}' ORDER BY 1 LIMIT 10;",
    "The quarterly report lists office supplies, printer toner and meeting room bookings. " * 40,
    "Боб предпочитает чай после обеда.",
    "https://example.com/a/b?c=d#e user@example.com +1 (555) 010-9999",
]


class ExportRejected(EmbeddingError):
    """The exported graph's vectors differ from the model's on torch: it is not used."""


def export_path(cache_dir: Path, model_dir: Path) -> Path:
    return Path(cache_dir) / f"{MODEL_NAME}-{model_digest(model_dir)[:16]}-v{EXPORT_FORMAT}.onnx"


def cached_export(cache_dir: Path, model_dir: Path) -> Path | None:
    """The checked export of ``model_dir`` under ``cache_dir``, or None when there is none yet. No torch, no lock:
    the file appears only complete and checked (atomic rename)."""
    path = export_path(cache_dir, model_dir)
    return path if path.is_file() else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_export(
    cache_dir: Path, model_dir: Path | None = None, *, progress: Callable[[str], Any] = logger.info
) -> Path:
    """The export's path, exporting and checking it first when there is none (in this process: imports torch)."""
    model_dir = Path(model_dir or model_path())
    cache_dir = Path(cache_dir)
    target = export_path(cache_dir, model_dir)
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / ".export.lock"):
        if target.is_file():  # another process exported it while this one waited for the lock
            return target
        for stale in cache_dir.glob(f".{target.name}.*.tmp"):  # left by a process killed mid-export
            stale.unlink(missing_ok=True)
        temporary = cache_dir / f".{target.name}.{os.getpid()}.tmp"
        try:
            started = time.monotonic()
            progress(f"exporting {MODEL_NAME} to ONNX (once; cached as {target})")
            export(model_dir, temporary)
            report = check(model_dir, temporary)
            with temporary.open("rb") as handle:
                os.fsync(handle.fileno())
            os.replace(temporary, target)
            directory = os.open(cache_dir, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        finally:
            temporary.unlink(missing_ok=True)
        progress(
            f"exported and checked in {time.monotonic() - started:.1f}s: min cosine to torch "
            f"{report['min_cosine']:.7f}, batch drift {report['batch_drift']:.1e}"
        )
    return target


def export(model_dir: Path, destination: Path) -> None:
    """Trace the transformer plus pooling and normalisation to ONNX (TorchScript exporter, fp32)."""
    from apps.core.native import torch_environment

    torch_environment()
    import torch
    from transformers import AutoModel

    files = ModelFiles(Path(model_dir))
    files.check()
    # Eager attention: plain MatMul/Softmax in the graph, the same arithmetic on every onnxruntime provider.
    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager", local_files_only=True)
    model = model.float().eval()

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self, transformer: torch.nn.Module) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.transformer(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            # sentence-transformers' Pooling (mean tokens) and Normalize modules.
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            mean = summed / torch.clamp(mask.sum(dim=1), min=1e-9)
            return torch.nn.functional.normalize(mean, p=2, dim=1)

    # Traced on a padded batch (the second row's mask ends in zeros), so no branch that skips the mask for
    # all-ones input is recorded; the check below runs padded batches through the result.
    long, short = (e.ids for e in files.tokenizer(truncate=True).encode_batch(["a padded example for tracing", "hi"]))
    ids = torch.zeros((2, len(long)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, tokens in enumerate((long, short)):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    types = torch.zeros_like(ids)
    axes = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings about constant shapes and the legacy exporter's notice
        torch.onnx.export(
            SentenceEmbedding(model),
            (ids, mask, types),
            str(destination),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["sentence_embedding"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes, "sentence_embedding": {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def check(model_dir: Path, onnx_file: Path) -> dict[str, float]:
    """Compare the export with sentence-transformers on torch (fp32, CPU); raise ExportRejected on a difference."""
    import numpy as np

    files = ModelFiles(Path(model_dir))
    reference = TorchEncoder(files).encode(PROBES, batch_size=len(PROBES))
    candidate = OnnxEncoder(files, onnx_file)
    batched = candidate.encode(PROBES, batch_size=len(PROBES))  # one padded batch
    alone = np.stack([candidate.encode([text], batch_size=1)[0] for text in PROBES])
    cosines = (reference * batched).sum(axis=1)
    report = {"min_cosine": float(cosines.min()), "batch_drift": float(np.abs(batched - alone).max())}
    if report["min_cosine"] < MIN_COSINE or report["batch_drift"] > MAX_BATCH_DRIFT:
        raise ExportRejected(
            f"the ONNX export of {MODEL_NAME} differs from the model on torch (min cosine {report['min_cosine']:.7f}, "
            f"need >= {MIN_COSINE}; a text in a batch vs alone {report['batch_drift']:.1e}, need <= "
            f"{MAX_BATCH_DRIFT}): not used"
        )
    return report


def start_export_subprocess(cache_dir: Path, model_dir: Path | None = None, **popen: Any) -> subprocess.Popen:
    """``ensure_export`` in a child process, started and not waited for, so torch is never imported by the caller
    (a web or worker process). ``popen``: subprocess.Popen's options for its output."""
    model_dir = Path(model_dir or model_path())
    command = [sys.executable, "-m", __name__, "--cache-dir", str(cache_dir), "--model-dir", str(model_dir)]
    root = Path(__file__).resolve().parents[3]  # the repository: `apps` must be importable by the child
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(command, cwd=root, env=environment, **popen)


def export_in_subprocess(cache_dir: Path, model_dir: Path | None = None, *, timeout: float = 600) -> Path:
    """``ensure_export`` in a child process, waited for; its path."""
    model_dir = Path(model_dir or model_path())
    child = start_export_subprocess(cache_dir, model_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        child.kill()
        child.communicate()
        raise EmbeddingError(f"the ONNX export of {MODEL_NAME} did not finish within {timeout:.0f}s") from exc
    if child.returncode != 0:
        raise EmbeddingError(f"the ONNX export of {MODEL_NAME} failed: {stderr.strip()[-2000:]}")
    return export_path(cache_dir, model_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m apps.retrieval.embeddings.onnx_export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the export is kept (default: $EMBEDDING_ONNX_DIR, else $DATA_DIR/models, else var/models)")
    parser.add_argument("--model-dir", type=Path, default=None, help="the sentence-transformers model directory (default: the bundled all-MiniLM-L6-v2)")
    args = parser.parse_args(argv)
    cache_dir = args.cache_dir or default_cache_dir()
    try:
        path = ensure_export(cache_dir, args.model_dir, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except EmbeddingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def default_cache_dir() -> Path:
    """Without Django: the same default the settings compute (EMBEDDING_ONNX_DIR, else DATA_DIR/models)."""
    if os.environ.get("EMBEDDING_ONNX_DIR"):
        return Path(os.environ["EMBEDDING_ONNX_DIR"])
    data_dir = os.environ.get("DATA_DIR") or str(Path(__file__).resolve().parents[3] / "var")
    return Path(data_dir).resolve() / "models"


if __name__ == "__main__":
    sys.exit(main())
