"""Documents per second of the local embedding model on a GPU, through the service's own document path, next to the
CPU: what a Celery worker with ``EMBEDDING_DEVICE=cuda`` gains (README, "Scaling").

Needs python with torch (a CUDA build for --device cuda), transformers, sentence-transformers, tokenizers,
onnxruntime and numpy; not Django nor the service's other dependencies (``apps.retrieval.embeddings`` imports without
them). The model directory is an argument: a sentence-transformers directory of all-MiniLM-L6-v2 (or a copy with
fp16 weights: ``--upcast`` converts them to fp32 first, into a temporary copy).

1. check: the pieces of the same documents through ``EMBEDDING_DEVICE``'s document path (fp32, then fp16), and
   through torch's on the CPU, against sentence-transformers' own ``encode`` on the CPU (fp32): cosine per
   piece, min and mean;
2. documents/s through ``LocalEmbeddingProvider`` as the worker's indexers use it (``provider.embed_chunked``:
   every document chunked into 128-token windows and tokenized once, every piece embedded), for each precision
   and ``--batches`` (the provider's batch size, ``EMBEDDING_BATCH_SIZE``), after a warm-up pass (on a GPU over
   all the documents: the first pass of each batch shape loads and picks its kernels, which a worker pays once;
   a first pass measured 3.8 s for 20,000 documents in fp16 on an H200, 1.3 s warm); then the same path with the
   forward pass replaced by a stub returning zeros ("forward stubbed"): what the CPU side alone
   (tokenizing, padding, copies, gathering the vectors) allows, and the seconds ``Chunker.split`` alone takes;
3. the CPU on one thread, the same path, torch and (where the ``onnx`` package is installed, for the export)
   onnxruntime;
4. ``--profile``: each CPU backend in a fresh process on one thread: import and load seconds, query p50,
   PSS after load and after embedding documents (Linux).

Prints a table; writes JSON to ``--json`` or ``$OUT/embeddings_gpu.json``. Well under 4 minutes on an H200 with the
defaults. Here (no GPU): ``python bench/embeddings_gpu.py --device cpu --docs 64 --batches 16``; the CPU side of the
GPU path alone, on any machine: ``--null-model --device cpu --docs 5000 --batches 512`` (torch's document path with
the forward pass stubbed; only those rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = (
    "the a to of and in that is for on with as it be at by this we you from or have not are but they our will "
    "can all about more when which their there one would so what up out if has been also into time only new some "
    "could these two may first then do any like my now over such after most other well where your just year "
    "meeting project budget report customer invoice deploy service database migration release schedule "
    "coffee lunch flight hotel booking Kyoto Berlin Lisbon doctor appointment dentist insurance contract "
    "review deadline Friday Monday morning evening weekly quarterly manager team engineer designer intern "
    "prefers wants asked forgot reminded noted confirmed cancelled moved renamed archived shipped fixed "
    "latency regression search index vector embedding pipeline Rust Python PostgreSQL Redis Kubernetes "
    "sourdough tomatoes basil bicycle marathon chess guitar novel lighthouse keeper garden balcony kitchen "
    "renovation apartment rent mortgage savings tax receipts euros dollars 2024 2025 9:30 7:40 15% #42"
).split()


def corpus(count: int, seed: int) -> list[str]:
    """Memory-like documents of varied lengths: 60% short (5-25 words), 30% medium (40-120), 9% long (150-400,
    one to three chunks), 1% very long (800-2000, up to ~20 chunks)."""
    rng = random.Random(seed)

    def sentence() -> str:
        words = rng.choices(WORDS, k=rng.randint(5, 18))
        return " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])

    def text(words: int) -> str:
        out: list[str] = []
        while sum(len(s.split()) for s in out) < words:
            out.append(sentence())
        return " ".join(out)

    documents = []
    for _ in range(count):
        kind = rng.random()
        size = (rng.randint(5, 25) if kind < 0.6 else rng.randint(40, 120) if kind < 0.9
                else rng.randint(150, 400) if kind < 0.99 else rng.randint(800, 2000))  # fmt: skip
        documents.append(text(size))
    return documents


def safetensors_dtype(path: Path) -> str:
    """The floating-point dtype(s) of a safetensors file's weights, from its JSON header (no torch): "F32", "F16"."""
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    return "+".join(sorted({v["dtype"] for k, v in header.items() if k != "__metadata__" and v["dtype"].startswith(("F", "BF"))}))


def upcast(model_dir: Path, work: Path) -> Path:
    """A copy of ``model_dir`` with fp32 weights (every other file linked)."""
    from safetensors.torch import load_file, save_file

    copy = work / "model-fp32"
    model_dir = model_dir.resolve()  # the links below must not be relative to the working directory
    shutil.copytree(model_dir, copy, copy_function=os.symlink, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = {name: tensor.float().contiguous() for name, tensor in load_file(str(model_dir / "model.safetensors")).items()}
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


def write_fp16_copy(model_dir: Path | None, destination: Path) -> None:
    """The model directory with its weights in fp16 (numpy only): 45 MB instead of 91 MB."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from apps.retrieval.embeddings import minilm

    source = model_dir or minilm.model_path()
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns("model.safetensors", "README.md", ".gitattributes"))
    tensors = load_file(str(source / "model.safetensors"))
    save_file({k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in tensors.items()},
              str(destination / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    (destination / "model.safetensors").chmod(0o644)
    size = sum(f.stat().st_size for f in destination.rglob("*") if f.is_file())
    print(f"{destination}: {size / 1e6:.1f} MB")


def cosines(a: Any, b: Any) -> dict[str, float]:
    import numpy as np

    values = (np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)).sum(axis=1)
    return {"min": float(values.min()), "mean": float(values.mean())}


def documents_per_second(provider: Any, documents: list[str], warm_up: int) -> dict[str, Any]:
    """The worker's path (``embed_chunked``: chunk every document, embed every piece), after a warm-up pass: wall
    time, and the CPU seconds of the whole process (every thread) in it."""
    provider.embed_chunked(documents[:warm_up])
    cpu = time.process_time()
    started = time.perf_counter()
    vectors = provider.embed_chunked(documents)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    pieces = sum(map(len, vectors))
    return {
        "docs": len(documents), "pieces": pieces, "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3),
        "docs_per_s": round(len(documents) / seconds, 1), "pieces_per_s": round(pieces / seconds, 1),
    }  # fmt: skip


@contextlib.contextmanager
def stubbed_forward(encoder: Any) -> Iterator[None]:
    """``encoder``'s forward pass replaced by zeros of the right shape, on the right device; everything around it
    (tokenizing, padding, copies to and from the device) runs as usual."""
    import numpy as np

    if encoder.backend == "torch":
        import torch

        def forward(ids: Any, mask: Any) -> Any:
            dtype = torch.float16 if encoder.precision == "fp16" else torch.float32
            return torch.zeros((ids.shape[0], 384), dtype=dtype, device=ids.device)

        encoder.forward = forward
        name = "forward"
    else:
        encoder.run = lambda ids, mask: np.zeros((ids.shape[0], 384), dtype=np.float32)
        name = "run"
    try:
        yield
    finally:
        delattr(encoder, name)  # the class's own method again


def split_seconds(chunker: Any, documents: list[str]) -> dict[str, Any]:
    """``Chunker.split`` alone: chunking and tokenizing every document (the tokenizers library's threads)."""
    cpu = time.process_time()
    started = time.perf_counter()
    chunks = chunker.split(documents)
    return {"docs": len(documents), "pieces": len(chunks.pieces), "seconds": round(time.perf_counter() - started, 3),
            "cpu_seconds": round(time.process_time() - cpu, 3)}  # fmt: skip


def profile_child(backend: str, model_dir: Path, onnx_dir: Path, documents: int) -> None:
    """One backend in this fresh process, one thread, with the service's malloc tuning: import, load, queries, PSS."""
    from apps.core.native import tune_malloc

    tune_malloc()
    started = time.perf_counter()
    if backend == "torch":
        import sentence_transformers  # noqa: F401
        import torch  # noqa: F401
    else:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    from apps.retrieval.embeddings.local import LocalEmbeddingProvider, load

    imported = time.perf_counter()
    provider = LocalEmbeddingProvider(backend=backend, threads=1, model_dir=model_dir, onnx_dir=onnx_dir)
    load(provider.queries)
    loaded = time.perf_counter()
    pss_loaded = _pss_mb()
    queries = [f"what does the user prefer about {w} {i}" for i, w in enumerate(WORDS * 2)][:200]
    for query in queries[:10]:
        provider.embed_query(query)
    latencies = []
    for query in queries:
        t = time.perf_counter()
        provider.embed_query(query)
        latencies.append(time.perf_counter() - t)
    provider.embed_chunked(corpus(documents, seed=11))
    print(json.dumps({
        "backend": backend, "import_s": round(imported - started, 2), "load_s": round(loaded - imported, 2),
        "query_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "query_p95_ms": round(sorted(latencies)[int(len(latencies) * 0.95)] * 1000, 2),
        "pss_mb_after_load": pss_loaded, f"pss_mb_after_{documents}_documents": _pss_mb(),
        "torch_imported": "torch" in sys.modules,
    }))  # fmt: skip


def _pss_mb() -> float | None:
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None, help="sentence-transformers model directory (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--upcast", choices=("auto", "yes", "no"), default="auto", help="convert the weights to fp32 first (auto: when they are not)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--docs", type=int, default=20000, help="documents per throughput run (default 20000)")
    parser.add_argument("--batches", default="128,256,512", help="provider batch sizes (default 128,256,512)")
    parser.add_argument("--precisions", default="fp32,fp16", help="on the GPU (default fp32,fp16; the CPU runs fp32)")
    parser.add_argument("--check-texts", type=int, default=1000, help="documents whose pieces are compared GPU vs CPU (default 1000)")
    parser.add_argument("--null-model", action="store_true", help="only the document path with the forward pass stubbed (torch): the CPU side alone")
    parser.add_argument("--cpu-docs", type=int, default=300, help="documents for the one-thread CPU rate (default 300)")
    parser.add_argument("--profile", action="store_true", help="also each CPU backend in a fresh process (import, load, query p50, PSS)")
    parser.add_argument("--profile-docs", type=int, default=2000, help="documents embedded before the second PSS reading (default 2000)")
    parser.add_argument("--json", type=Path, default=None, help="results file (default $OUT/embeddings_gpu.json when OUT is set)")
    parser.add_argument("--write-fp16-copy", type=Path, metavar="DIR", help="write a copy of the model directory with fp16 weights (half the size, to carry to a GPU machine) and exit")
    parser.add_argument("--profile-child", nargs=3, metavar=("BACKEND", "MODEL_DIR", "ONNX_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write_fp16_copy:
        write_fp16_copy(args.model_dir, args.write_fp16_copy)
        return 0
    if args.profile_child:
        backend, model_dir, onnx_dir = args.profile_child
        profile_child(backend, Path(model_dir), Path(onnx_dir), args.profile_docs)
        return 0

    started = time.monotonic()
    from apps.core.native import torch_environment
    from apps.retrieval.embeddings import minilm, onnx_export
    from apps.retrieval.embeddings.local import LocalEmbeddingProvider, load

    torch_environment()
    import torch

    work = Path(tempfile.mkdtemp(prefix="embeddings-gpu-"))
    results: dict[str, Any] = {"command": " ".join([Path(sys.argv[0]).name, *argv]), "notes": []}
    try:
        model_dir = args.model_dir or minilm.model_path()
        weights = safetensors_dtype(model_dir / "model.safetensors")
        if args.upcast == "yes" or (args.upcast == "auto" and weights != "F32"):
            model_dir = upcast(model_dir, work)
            results["notes"].append(f"weights {weights} upcast to F32 into a temporary copy")
        gpu = args.device != "cpu"
        versions = {name: _version(name) for name in ("torch", "transformers", "sentence-transformers", "tokenizers", "onnxruntime", "numpy", "onnx")}
        results["machine"] = {
            "python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "gpu": torch.cuda.get_device_name(0) if gpu and torch.cuda.is_available() else None,
            "torch_cuda": torch.version.cuda, "versions": versions, "weights": weights,
        }  # fmt: skip
        precisions = [p for p in args.precisions.split(",") if gpu or p == "fp32"]
        batches = [int(b) for b in args.batches.split(",")]

        # 1. The device's vectors, through the document path, against sentence-transformers' own encode on the CPU
        # (fp32, all cores): the model as published. Also torch's document path on the CPU (the runtime's code).
        if not args.null_model:
            check_documents = corpus(args.check_texts, seed=5)
            pieces = minilm.Chunker(minilm.ModelFiles(model_dir)).split(check_documents, tokens=False).pieces
            cpu_torch = minilm.TorchEncoder(minilm.ModelFiles(model_dir), device="cpu")
            reference = cpu_torch.model.encode(pieces, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            results["check"] = {"texts": len(pieces), "cpu_torch_fp32": cosines(cpu_torch.encode_tokens(cpu_torch.chunker.split(check_documents).tokens, 64), reference)}
            del cpu_torch
            for precision in precisions:
                provider = LocalEmbeddingProvider(backend="onnx", device=args.device, precision=precision, batch_size=256, model_dir=model_dir, onnx_dir=work)
                results["check"]["backend_" + precision] = provider.check_device("documents")
                vectors = [vector for of_document in provider.embed_chunked(check_documents) for vector in of_document]
                results["check"][f"{args.device}_{precision}"] = cosines(vectors, reference)

        # 2. Documents/s through the provider's document path; then with the forward pass stubbed (the largest batch).
        documents = corpus(args.docs, seed=1)
        results["throughput"] = []
        rows = [] if args.null_model else [(p, b, False) for p in precisions for b in batches]
        for precision, batch, stubbed in rows + [(p, max(batches), True) for p in precisions[:1 if gpu else None]]:
            provider = LocalEmbeddingProvider(backend="torch" if args.null_model else "onnx", device=args.device, precision=precision, batch_size=batch, model_dir=model_dir, onnx_dir=work)
            encoder = load(provider.documents)
            with stubbed_forward(encoder) if stubbed else contextlib.nullcontext():
                run = documents_per_second(provider, documents, warm_up=len(documents) if gpu else batch)
            device = f"{args.device}, forward stubbed" if stubbed else args.device
            results["throughput"].append({"device": device, "backend": encoder.backend, "precision": precision, "batch": batch, **run})
            print(f"  {device} {precision} batch {batch}: {run['docs_per_s']:,.0f} docs/s", file=sys.stderr, flush=True)
        results["split"] = split_seconds(encoder.chunker, documents)

        # 3. The CPU on one thread (the runtime's; tokenizers has its own), same path: onnxruntime (needs the export,
        # which needs the onnx package) and torch.
        cpu_documents = documents[: args.cpu_docs]
        results["cpu_one_thread"] = []
        backends = [] if args.null_model else ["torch"]
        try:
            if not args.null_model:
                onnx_export.ensure_export(work, model_dir, progress=lambda line: print(" ", line, file=sys.stderr, flush=True))
                backends.insert(0, "onnx")
        except Exception as exc:
            results["notes"].append(f"no onnxruntime CPU rate: the ONNX export failed ({str(exc)[:200]})")
        for backend in backends:
            provider = LocalEmbeddingProvider(backend=backend, threads=1, model_dir=model_dir, onnx_dir=work)
            results["cpu_one_thread"].append({"backend": backend, "batch": provider.batch_size, **documents_per_second(provider, cpu_documents, warm_up=8)})

        # 4. Each CPU backend in a fresh process.
        if args.profile and backends:
            results["profile"] = []
            for backend in backends:
                done = subprocess.run(
                    [sys.executable, __file__, "--profile-docs", str(args.profile_docs), "--profile-child", backend, str(model_dir), str(work)],
                    capture_output=True, text=True, timeout=900, cwd=ROOT,
                )  # fmt: skip
                if done.returncode != 0:
                    results["notes"].append(f"profile {backend} failed: {done.stderr[-500:]}")
                    continue
                results["profile"].append(json.loads(done.stdout.strip().splitlines()[-1]))
        results["seconds"] = round(time.monotonic() - started, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(report(results))
    out = args.json or (Path(os.environ["OUT"]) / "embeddings_gpu.json" if os.environ.get("OUT") else None)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
        print(f"\nJSON: {out}")
    return 0


def report(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        f"Machine: {machine['gpu'] or 'no GPU'}, {machine['cpus']} CPUs, python {machine['python']}, "
        + ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v),
        "",
        "Check against sentence-transformers' encode on the CPU (fp32), cosine per text: "
        + "; ".join(f"{k} min {v['min']:.6f} mean {v['mean']:.7f}" for k, v in results["check"].items() if isinstance(v, dict))
        + f" ({results['check']['texts']} texts)" if "check" in results else "No check (--null-model)",
        "",
        "| device | backend | precision | batch | docs | pieces | docs/s | pieces/s | seconds (CPU seconds) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["throughput"] + [{**r, "device": "cpu, 1 thread", "precision": "fp32"} for r in results["cpu_one_thread"]]:
        lines.append(
            f"| {row['device']} | {row['backend']} | {row['precision']} | {row['batch']} | {row['docs']:,} | {row['pieces']:,} | "
            f"{row['docs_per_s']:,.1f} | {row['pieces_per_s']:,.1f} | {row['seconds']} ({row['cpu_seconds']}) |"
        )
    split = results["split"]
    lines += ["", f"Chunker.split alone (chunking and tokenizing): {split['docs']:,} docs, {split['pieces']:,} pieces in "
                  f"{split['seconds']} s ({split['cpu_seconds']} CPU seconds)"]  # fmt: skip
    if results.get("profile"):
        lines += ["", "| CPU backend, fresh process, 1 thread | import s | load s | query p50 / p95 ms | PSS MB after load / after documents | torch imported |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for p in results["profile"]:
            after = next(v for k, v in p.items() if k.startswith("pss_mb_after_") and k != "pss_mb_after_load")
            lines.append(f"| {p['backend']} | {p['import_s']} | {p['load_s']} | {p['query_p50_ms']} / {p['query_p95_ms']} | "
                         f"{p['pss_mb_after_load']} / {after} | {p['torch_imported']} |")  # fmt: skip
    lines += ["", *[f"Note: {note}" for note in results["notes"]], f"Total: {results.get('seconds')} s"]
    return "\n".join(lines)


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
