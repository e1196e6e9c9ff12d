"""bench/recall.py's labelled set (bench/recall_data/) is what bench/recall_dataset.py generates: regenerated here in
memory and compared byte for byte, so a change to the generator comes with the regenerated files (and the other way
round)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _generator():
    if "recall_dataset" not in sys.modules:  # dataclasses look their module up there
        spec = importlib.util.spec_from_file_location("recall_dataset", BENCH / "recall_dataset.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["recall_dataset"] = module
        spec.loader.exec_module(module)
    return sys.modules["recall_dataset"]


@pytest.mark.slow
def test_the_committed_set_is_the_generators_output() -> None:
    generator = _generator()
    files = generator.generate(generator.SEED)
    committed = {name: (BENCH / "recall_data" / name).read_bytes() for name in generator.FILES}
    assert generator.digest(files) == generator.digest(committed), "run: python bench/recall_dataset.py"
    memories = [json.loads(line) for line in committed["memories.jsonl"].splitlines()]
    queries = [json.loads(line) for line in committed["memory_queries.jsonl"].splitlines()]
    assert len(memories) >= 2000 and len(queries) >= 300  # issue 30's floor
    keys = {memory["key"] for memory in memories}
    assert all(set(query["relevant"]) <= keys for query in queries)
    assert {query["category"] for query in queries} == {"paraphrase", "exact", "mixed"}
    assert generator.digest(generator.generate(generator.SEED + 1)) != generator.digest(files)  # the seed matters
