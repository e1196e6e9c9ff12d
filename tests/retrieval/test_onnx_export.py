"""The one-off ONNX export: made once under a file lock by whichever process starts first, renamed into place only
after its check against torch, never used when the check fails, keyed by the model's files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from functools import partial
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings

from apps.retrieval.embeddings import minilm, onnx_export
from tests.concurrency import run_concurrently


@pytest.fixture
def fake_export(monkeypatch):
    """export() writes a placeholder slowly (a wide race window), check() passes unless told to fail."""
    calls: list[Path] = []
    state = {"reject": False}

    def export(model_dir: Path, destination: Path) -> None:
        calls.append(destination)
        with destination.open("wb") as handle:
            for _ in range(5):
                handle.write(b"x" * 1000)
                handle.flush()
                time.sleep(0.02)

    def check(model_dir: Path, onnx_file: Path) -> dict[str, float]:
        assert onnx_file.stat().st_size == 5000  # complete before it is checked
        if state["reject"]:
            raise onnx_export.ExportRejected("vectors differ")
        return {"min_cosine": 1.0, "batch_drift": 0.0}

    monkeypatch.setattr(onnx_export, "export", export)
    monkeypatch.setattr(onnx_export, "check", check)
    return calls, state


def test_concurrent_first_starts_export_once(tmp_path, fake_export) -> None:
    calls, _ = fake_export
    # Every start must get the file: a waiter's failure is re-raised, a start stuck on the lock times out.
    results = run_concurrently([partial(onnx_export.ensure_export, tmp_path, progress=lambda line: None)] * 16, timeout=60)
    assert len(calls) == 1  # one exporter; the others waited on the lock and found its file
    assert len(set(results)) == 1 and results[0].stat().st_size == 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == [".export.lock", results[0].name]  # no temporary left


def test_a_rejected_export_is_never_used(tmp_path, fake_export) -> None:
    calls, state = fake_export
    state["reject"] = True
    with pytest.raises(onnx_export.ExportRejected):
        onnx_export.ensure_export(tmp_path, progress=lambda line: None)
    assert onnx_export.cached_export(tmp_path, minilm.model_path()) is None
    assert [p.name for p in tmp_path.iterdir()] == [".export.lock"]
    state["reject"] = False  # the next start tries again
    assert onnx_export.ensure_export(tmp_path, progress=lambda line: None).is_file()
    assert len(calls) == 2


def test_a_temporary_file_left_by_a_killed_export_is_removed(tmp_path, fake_export) -> None:
    target = onnx_export.export_path(tmp_path, minilm.model_path())
    stale = tmp_path / f".{target.name}.99999.tmp"
    stale.write_bytes(b"half")
    onnx_export.ensure_export(tmp_path, progress=lambda line: None)
    assert not stale.exists() and target.is_file()


def test_other_model_files_get_another_export(tmp_path) -> None:
    model = tmp_path / "model"
    shutil.copytree(minilm.model_path(), model, ignore=shutil.ignore_patterns("model.safetensors"))
    (model / "model.safetensors").symlink_to(minilm.model_path() / "model.safetensors")
    same = onnx_export.export_path(tmp_path, model)
    assert same == onnx_export.export_path(tmp_path, minilm.model_path())  # same files, same key
    (model / "tokenizer.json").write_text((model / "tokenizer.json").read_text().replace("[UNK]", "[unk]"))
    minilm._digests.clear()
    assert onnx_export.export_path(tmp_path, model) != same
    minilm._digests.clear()


@pytest.mark.slow
@pytest.mark.model
def test_processes_starting_together_share_one_real_export(tmp_path) -> None:
    """The real export (torch, then the check against torch) in three processes started at once: one exports, the
    others wait for the lock and load its file; each then embeds with it."""
    script = (
        "import sys; from pathlib import Path; from apps.retrieval.embeddings import minilm, onnx_export as o\n"
        "p = o.ensure_export(Path(sys.argv[1]), progress=lambda line: print('PROGRESS', line, flush=True))\n"
        "e = minilm.OnnxEncoder(minilm.ModelFiles(minilm.model_path()), p, threads=1)\n"
        "print('DIM', e.encode(['hello world'], 1).shape[1], 'TORCH', 'torch' in sys.modules)\n"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=settings.BASE_DIR, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]  # fmt: skip
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    exporters = [out for out, _ in outputs if "PROGRESS exporting" in out]
    assert len(exporters) == 1, outputs
    assert "exported and checked" in exporters[0] and "min cosine to torch 0.99999" in exporters[0]
    assert all("DIM 384" in out for out, _ in outputs)
    # Only the exporting process imported torch.
    assert sorted("TORCH True" in out for out, _ in outputs) == [False, False, True]
    assert len(list(tmp_path.glob("*.onnx"))) == 1


def test_manage_py_up_exports_before_it_starts_the_processes(tmp_path, settings, monkeypatch) -> None:
    """`make run`'s start-up step: the export is made (in a subprocess) with a progress line before the supervisor
    starts anything, once (a GPU that cannot run stops `up` with the reason: the test below)."""
    from apps.retrieval import embeddings
    from apps.runtime.management.commands.up import Command

    made: list[Path] = []

    def export_in_subprocess(cache_dir: Path, model_dir: Path) -> Path:
        made.append(cache_dir)
        path = onnx_export.export_path(cache_dir, model_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"onnx")
        return path

    monkeypatch.setattr(onnx_export, "export_in_subprocess", export_in_subprocess)
    settings.EMBEDDING_PROVIDER = "local"
    settings.EMBEDDING_ONNX_DIR = tmp_path
    out = StringIO()
    command = Command(stdout=out)
    command._prepare_embeddings()
    command._prepare_embeddings()  # a second start finds the export
    lines = out.getvalue().splitlines()
    assert made == [tmp_path]
    assert lines[0].startswith(f"exporting all-MiniLM-L6-v2 to ONNX under {tmp_path}")
    assert lines[1].startswith("embedding model ready: queries on cpu (all-MiniLM-L6-v2-") and "documents on cpu" in lines[1]
    assert len(lines) == 3 and lines[2].startswith("embedding model ready")
    embeddings.reset_provider()


@pytest.mark.slow  # probing a CUDA device imports torch in this process: seconds
def test_manage_py_up_stops_with_the_reason_when_the_gpu_cannot_run(tmp_path, settings, monkeypatch) -> None:
    from django.core.management.base import CommandError

    from apps.retrieval import embeddings
    from apps.runtime.management.commands.up import Command

    # The queries' export (on the CPU) as the test above makes it: no real export before the documents' GPU check.
    path = onnx_export.export_path(tmp_path, minilm.model_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"onnx")
    monkeypatch.setattr(onnx_export, "export_in_subprocess", lambda *args: pytest.fail("no export expected"))
    settings.EMBEDDING_PROVIDER = "local"
    settings.EMBEDDING_ONNX_DIR = tmp_path
    settings.EMBEDDING_DEVICE = "cuda"
    with pytest.raises(CommandError, match="embedding device 'cuda' is not available on this machine"):
        Command(stdout=StringIO())._prepare_embeddings()
    embeddings.reset_provider()
