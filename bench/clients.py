"""The Python client's cost per call against bare httpx, and the LangGraph adapters against their floors (issue 22).

    python bench/clients.py [--calls N] [--rounds R] [--batch-rounds B] [--checkpoint-calls C]
                            [--sweep-lengths 10,50,...] [--sweep-calls S] [--only-sweep]

Starts the Procfile's web server (gunicorn + uvicorn worker, 1 worker) on a private benchmark database and seeds one
memory. Then, in one process and one run, it times the memory GET (GET /v1/memories, the hottest point read) two
ways over the same kind of keep-alive connection with the same token:

- bare: ``httpx.Client.get(url, params, headers)``, status check, ``response.json()``: the floor a user of plain
  httpx would have;
- sdk: ``memory_service.Client.get_memory(namespace, key)``: request built from the operation, token resolved,
  retry bookkeeping, error mapping, the answer parsed into a ``Memory`` dataclass.

The two are interleaved call by call (``--rounds`` x ``--calls`` calls each, the order flipped every call), so load
changes on a shared machine hit both alike. It reports p50/p95/p99 of both and the SDK's p50 overhead against bare (goal: within 10%), and the
client-side cost alone (both against an in-process transport with a canned answer: no network, no server).

Then the LangGraph adapters (needs ``pip install -r requirements/bench.txt``):

- store: ``MemoryServiceStore.batch`` of 100 ``GetOp`` (sent concurrently, 16 at a time) against 100 sequential
  ``store.get`` calls, wall time per 100, ``--batch-rounds`` rounds alternating which goes first;
- checkpointer: ``MemoryServiceCheckpointSaver.put`` and ``get_tuple`` against LangGraph's own ``PostgresSaver``
  (langgraph-checkpoint-postgres) on its own database of the same embedded PostgreSQL: the floor a LangGraph user
  would otherwise pick. Both put the same checkpoints (a 10-message ``messages`` channel that changes every step and
  two that do not) interleaved call by call; ``get_tuple`` reads the latest checkpoint of a thread of
  ``--thread-length`` checkpoints;
- the thread-length sweep (issue 31): one thread per saver grown to each of ``--sweep-lengths`` checkpoints (each
  step a put_writes and a put, as a graph makes them), and at each length ``get_tuple`` of the latest checkpoint, of
  one by id (the thread's middle), ``list(limit=5)`` and ``put``, the two savers interleaved call by call. The goal:
  each of our calls costs the same at 10 and at 5,000 checkpoints (within 1.5x); ``put`` within 2x PostgresSaver's
  and ``get_tuple`` within 3x.

Results: a markdown report on stdout, JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness as h

# The client from this checkout, whether or not the venv has it installed.
sys.path.insert(0, str(h.REPO_ROOT / "clients" / "python" / "src"))

import httpx
from memory_service import Client

DB_NAME = "memory_service_bench_clients"
LANGGRAPH_DB = "memory_service_bench_clients_langgraph"
API_KEY = "bench-clients-api-key-0123456789"  # seeded into the bench server (API_KEYS): the checkpointer needs one
USER, PASSWORD = "bob", "bob"
NAMESPACE = ("user", "bob", "bench")
KEY = "coffee"
GOAL_OVERHEAD = 0.10


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {f"p{q}": h.percentile(ordered, q) * 1000 for q in (50, 95, 99)} | {"calls": len(ordered)}


def bare_get(http: httpx.Client, base_url: str, token: str) -> Callable[[], Any]:
    url = f"{base_url}/v1/memories"
    params = [*(("ns", segment) for segment in NAMESPACE), ("key", KEY)]
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def call() -> Any:
        response = http.get(url, params=params, headers=headers)
        if response.status_code != 200:
            raise h.BenchError(f"bare GET answered {response.status_code}: {response.text[:200]}")
        return response.json()

    return call


def sdk_get(client: Client) -> Callable[[], Any]:
    return lambda: client.get_memory(NAMESPACE, KEY)


def alternate(
    calls: dict[str, Callable[[], Any]], *, rounds: int, per_round: int, warmup: int = 50,
) -> dict[str, list[float]]:
    """Per-call seconds of each callable (each called ``warmup`` times first), interleaved call by call with the
    order flipped every call, so a load change on a shared machine lands on both alike."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    items = list(calls.items())
    for index in range(rounds * per_round):
        for name, fn in items if index % 2 == 0 else reversed(items):
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    return samples


def canned_transport(body: bytes) -> httpx.MockTransport:
    headers = {"Content-Type": "application/json", "X-Request-ID": "bench"}
    return httpx.MockTransport(lambda request: httpx.Response(200, headers=headers, content=body))


def measure_overhead(server: h.WebServer, token: str, *, rounds: int, per_round: int) -> dict[str, Any]:
    with Client(server.base_url, token=token) as client, httpx.Client(timeout=30) as http:
        client.put_memory(NAMESPACE, KEY, {"likes": "flat white", "milk": "oat", "shots": 2},
                          index={"text": "bob likes a flat white"})
        h.log(f"live: {rounds * per_round} calls each, bare httpx and the SDK interleaved")
        live = alternate({"bare": bare_get(http, server.base_url, token), "sdk": sdk_get(client)},
                         rounds=rounds, per_round=per_round)
        body = json.dumps(bare_get(http, server.base_url, token)()).encode()

    h.log("client side only: both against an in-process transport with the same answer")
    with httpx.Client(transport=canned_transport(body)) as bare_http, \
            Client(server.base_url, token=token, http_client=httpx.Client(transport=canned_transport(body))) as sdk:
        local = alternate({"bare": bare_get(bare_http, server.base_url, token), "sdk": sdk_get(sdk)},
                          rounds=rounds, per_round=per_round)
    result = {"live": {name: percentiles(values) for name, values in live.items()},
              "client_side": {name: percentiles(values) for name, values in local.items()}}
    result["p50_overhead"] = result["live"]["sdk"]["p50"] / result["live"]["bare"]["p50"] - 1
    result["client_side_p50_extra_us"] = (result["client_side"]["sdk"]["p50"] - result["client_side"]["bare"]["p50"]) * 1000
    return result


# --- The LangGraph adapters ----------------------------------------------------------------------------------------


def measure_store_batch(server: h.WebServer, token: str, *, rounds: int, size: int = 100) -> dict[str, Any]:
    from langgraph.store.base import GetOp, PutOp
    from memory_service.langgraph import MemoryServiceStore

    namespace = (*NAMESPACE, "store")
    keys = [f"k{i:03}" for i in range(size)]
    with MemoryServiceStore(server.base_url, token=token, max_concurrency=16) as store:
        store.batch([PutOp(namespace, key, {"i": i, "text": f"memory number {i}"}, index=False)
                     for i, key in enumerate(keys)])
        gets = [GetOp(namespace, key, refresh_ttl=False) for key in keys]

        def batch() -> None:
            results = store.batch(gets)
            if any(result is None for result in results):
                raise h.BenchError("a batched get found nothing")

        def sequential() -> None:
            for key in keys:
                if store.get(namespace, key) is None:
                    raise h.BenchError("a get found nothing")

        h.log(f"store: {rounds} rounds of a batch of {size} gets against {size} sequential gets")
        # One warm-up call each (connections, the thread pool): a call here is already 100 gets.
        times = alternate({"batch": batch, "sequential": sequential}, rounds=1, per_round=rounds, warmup=1)
    result = {name: {"median_ms": h.percentile(sorted(values), 50) * 1000,
                     "min_ms": min(values) * 1000, "rounds": len(values)} for name, values in times.items()}
    result["speedup"] = result["sequential"]["median_ms"] / result["batch"]["median_ms"]
    result["ops"] = size
    return result


def _first_checkpoint(stream: CheckpointStream) -> tuple[Any, Any, Any]:
    """(checkpoint, metadata, new_versions) of a stream's next put, without putting it."""
    captured: dict[str, Any] = {}

    class Capture:
        get_next_version = stream.saver.get_next_version

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            captured.update(checkpoint=checkpoint, metadata=metadata, new_versions=new_versions)
            return config

    CheckpointStream(Capture(), "capture").put()
    return captured["checkpoint"], captured["metadata"], captured["new_versions"]


class CheckpointStream:
    """Successive checkpoints of one thread on one saver, as a graph makes them: ``messages`` (10 messages) changes
    every step, ``topic`` and ``settings`` keep the blobs of the first step."""

    def __init__(self, saver: Any, thread_id: str) -> None:
        self.saver = saver
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.versions: dict[str, Any] = {}
        self.step = 0
        self.stored: list[dict[str, Any]] = []  # the configs advance() put

    def put(self) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        changed = ["messages"] if self.step else ["messages", "topic", "settings"]
        for channel in changed:
            self.versions[channel] = self.saver.get_next_version(self.versions.get(channel), None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {
            "messages": [{"role": "user" if n % 2 else "assistant", "content": f"message {self.step}.{n} " * 8}
                         for n in range(10)],
            "topic": "Lisbon", "settings": {"temperature": 0.2, "tools": ["weather", "booking"]},
        }
        checkpoint["channel_versions"] = dict(self.versions)
        self.config = self.saver.put(self.config, checkpoint, {"source": "loop", "step": self.step, "parents": {}},
                                     {channel: self.versions[channel] for channel in changed})
        self.step += 1

    def get_latest(self) -> None:
        thread = self.config["configurable"]
        found = self.saver.get_tuple({"configurable": {"thread_id": thread["thread_id"], "checkpoint_ns": ""}})
        if found is None or len(found.checkpoint["channel_values"]["messages"]) != 10:
            raise h.BenchError("get_tuple lost the state")

    def advance(self) -> None:
        """A graph step: a task's writes on the current checkpoint, then the next checkpoint."""
        if self.step:
            self.saver.put_writes(self.config, [("messages", [{"role": "assistant", "content": "reply"}])],
                                  f"task-{self.step}")
        self.put()
        self.stored.append(self.config)

    def get_by_id(self, config: dict[str, Any]) -> None:
        found = self.saver.get_tuple(config)
        if found is None or found.config["configurable"]["checkpoint_id"] != config["configurable"]["checkpoint_id"]:
            raise h.BenchError("get_tuple by id found another checkpoint")

    def list_recent(self, limit: int = 5) -> None:
        thread = self.config["configurable"]["thread_id"]
        found = list(self.saver.list({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, limit=limit))
        if len(found) != limit:
            raise h.BenchError(f"list(limit={limit}) found {len(found)}")


def measure_checkpointer(
    server: h.WebServer, token: str, langgraph_url: str, *, calls: int, thread_length: int,
) -> dict[str, Any]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from memory_service.langgraph import MemoryServiceCheckpointSaver

    with MemoryServiceCheckpointSaver(server.base_url, token=token, api_key=API_KEY) as ours, \
            PostgresSaver.from_conn_string(langgraph_url) as floor:
        floor.setup()
        run_id = time.strftime("%H%M%S")
        streams = {"memory_service": CheckpointStream(ours, f"put-{run_id}"),
                   "postgres_saver": CheckpointStream(floor, f"put-{run_id}")}
        # The service's own cost of a put: one append of the same content with the plain client (no adapter).
        probe = CheckpointStream(ours, "probe")
        flow = ours._put(probe.config, *_first_checkpoint(probe))
        append = next(flow)
        conversation = str(uuid.uuid4())
        with Client(server.base_url, token=token, api_key=API_KEY) as client:
            def append_only() -> None:
                client.append_entry(conversation, append.json["content"], channel="context",
                                    content_type=append.json["contentType"])

            h.log(f"checkpointer: {calls} puts each, ours, PostgresSaver and a bare append, interleaved")
            puts = alternate({**{name: stream.put for name, stream in streams.items()}, "append_entry": append_only},
                             rounds=1, per_round=calls)
        readers = {"memory_service": CheckpointStream(ours, f"get-{run_id}"),
                   "postgres_saver": CheckpointStream(floor, f"get-{run_id}")}
        for stream in readers.values():
            for _ in range(thread_length):
                stream.put()
        h.log(f"checkpointer: {calls} get_tuple each on a thread of {thread_length} checkpoints")
        gets = alternate({name: stream.get_latest for name, stream in readers.items()}, rounds=1, per_round=calls)
        long_thread = streams["memory_service"].step
        h.log(f"checkpointer: get_tuple on the put thread ({long_thread} checkpoints)")
        long_gets = alternate({name: stream.get_latest for name, stream in streams.items()}, rounds=1,
                              per_round=max(10, calls // 5))
    return {
        "put": {name: percentiles(values) for name, values in puts.items()},
        "get_tuple": {name: percentiles(values) for name, values in gets.items()},
        "get_tuple_long": {name: percentiles(values) for name, values in long_gets.items()},
        "thread_length": thread_length,
        "long_thread_length": long_thread,
    }


SWEEP_CALLS = ("get_tuple latest", "get_tuple by id", "list(limit=5)", "put")


def measure_thread_sweep(
    server: h.WebServer, token: str, langgraph_url: str, *, lengths: list[int], calls: int,
) -> dict[str, Any]:
    """Issue 31's sweep: for each length, one thread per saver grown to it (a put_writes and a put per step, as a
    graph makes them). Then each call is timed on every thread, all lengths and both savers interleaved call by
    call (the order flipped every call), so load changes on a shared machine land on every length alike; the floor
    (an authenticated GET /v1/me of the same client) joins the rotation. ``put`` adds ``calls`` checkpoints to each
    thread, after the reads."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from memory_service.langgraph import MemoryServiceCheckpointSaver

    with MemoryServiceCheckpointSaver(server.base_url, token=token, api_key=API_KEY) as ours, \
            PostgresSaver.from_conn_string(langgraph_url) as floor:
        floor.setup()
        run_id = time.strftime("%H%M%S")
        savers = {"memory_service": ours, "postgres_saver": floor}
        streams: dict[tuple[int, str], CheckpointStream] = {}
        for length in lengths:
            grown = time.monotonic()
            for name, saver in savers.items():
                stream = streams[(length, name)] = CheckpointStream(saver, f"sweep-{length}-{run_id}")
                while stream.step < length:
                    stream.advance()
            h.log(f"sweep: threads of {length} checkpoints grown in {time.monotonic() - grown:.0f} s")
        middle = {key: stream.stored[len(stream.stored) // 2] for key, stream in streams.items()}
        timed = {
            "get_tuple latest": {key: stream.get_latest for key, stream in streams.items()},
            "get_tuple by id": {key: (lambda s=stream, c=middle[key]: s.get_by_id(c)) for key, stream in streams.items()},
            "list(limit=5)": {key: stream.list_recent for key, stream in streams.items()},
            "put": {key: stream.put for key, stream in streams.items()},
        }
        me = ours._clients.sync.me
        results: dict[str, dict[tuple[int, str], dict[str, float]]] = {}
        for call, callables in timed.items():
            h.log(f"sweep: {call}, {calls} calls on each of {len(callables)} threads, interleaved")
            samples = alternate({**callables, (0, "floor"): me}, rounds=1, per_round=calls, warmup=3)
            results[call] = {key: percentiles(values) for key, values in samples.items()}
    rows = []
    for length in lengths:
        row: dict[str, Any] = {"checkpoints": length}
        for call in timed:
            row[call] = {name: results[call][(length, name)] for name in savers}
        rows.append(row)
    floors = {call: results[call][(0, "floor")] for call in timed}
    return {"rows": rows, "calls": calls, "floor": floors}


def report_sweep(sweep: dict[str, Any]) -> str:
    rows = []
    for row in sweep["rows"]:
        cells = [row["checkpoints"]]
        for call in SWEEP_CALLS:
            ours, floor = row[call]["memory_service"]["p50"], row[call]["postgres_saver"]["p50"]
            cells.append(f"{h.fmt(ours, 2)} / {h.fmt(floor, 2)} (x{ours / floor:.1f})")
        rows.append(cells)
    first, last = sweep["rows"][0], sweep["rows"][-1]
    growth = ", ".join(
        f"{call} x{last[call]['memory_service']['p50'] / first[call]['memory_service']['p50']:.2f}"
        for call in SWEEP_CALLS
    )
    return "\n".join([
        "## Checkpointer cost against thread length (issue 31)",
        "",
        f"p50 ms, MemoryServiceCheckpointSaver / PostgresSaver (ratio), {sweep['calls']} calls each per length, "
        "every length and both savers interleaved call by call; each step of a thread is a put_writes and a put.",
        "",
        h.markdown_table(["checkpoints", *SWEEP_CALLS], rows),
        "",
        "Floor, an authenticated GET /v1/me through the same client in the same rotation, p50 ms: "
        + ", ".join(f"during {call} {h.fmt(sweep['floor'][call]['p50'], 2)}" for call in SWEEP_CALLS) + ".",
        "",
        f"MemoryServiceCheckpointSaver p50 at {last['checkpoints']} against {first['checkpoints']} checkpoints: "
        f"{growth} (goal: within 1.5x).",
    ])


SAVER_LABELS = {
    "memory_service": "MemoryServiceCheckpointSaver",
    "postgres_saver": "PostgresSaver",
    "append_entry": "(Client.append_entry of the same entry)",
}


def report_adapters(store: dict[str, Any], saver: dict[str, Any]) -> str:
    rows = [[f"{name} ({store['ops']} gets)", store[name]["rounds"], h.fmt(store[name]["median_ms"], 1),
             h.fmt(store[name]["min_ms"], 1)] for name in ("batch", "sequential")]
    saver_rows = []
    for label, key in (("put", "put"), (f"get_tuple, thread of {saver['thread_length']}", "get_tuple"),
                       (f"get_tuple, thread of {saver['long_thread_length']}", "get_tuple_long")):
        for name in ("memory_service", "postgres_saver", "append_entry"):
            row = saver[key].get(name)
            if row is None:
                continue
            saver_rows.append([label, SAVER_LABELS[name], row["calls"], h.fmt(row["p50"], 3), h.fmt(row["p95"], 3),
                               h.fmt(row["p99"], 3)])
    ratios = ", ".join(
        f"{key} x{saver[key]['memory_service']['p50'] / saver[key]['postgres_saver']['p50']:.1f}"
        for key in ("put", "get_tuple", "get_tuple_long")
    )
    return "\n".join([
        "## LangGraph store: one batch of gets against sequential gets",
        "",
        h.markdown_table(["caller", "rounds", "median ms", "min ms"], rows),
        "",
        f"batch speedup (median): x{store['speedup']:.1f}",
        "",
        "## LangGraph checkpointer against PostgresSaver on the same PostgreSQL",
        "",
        h.markdown_table(["call", "saver", "calls", "p50 ms", "p95 ms", "p99 ms"], saver_rows),
        "",
        f"MemoryServiceCheckpointSaver p50 against PostgresSaver: {ratios}.",
    ])


def report(result: dict[str, Any], load_before: str, load_after: str) -> str:
    rows = []
    for scope in ("live", "client_side"):
        for name in ("bare", "sdk"):
            row = result[scope][name]
            rows.append([f"{scope.replace('_', ' ')}: {'bare httpx' if name == 'bare' else 'memory_service.Client'}",
                         row["calls"], h.fmt(row["p50"], 3), h.fmt(row["p95"], 3), h.fmt(row["p99"], 3)])
    overhead = result["p50_overhead"]
    verdict = "within" if overhead <= GOAL_OVERHEAD else "OVER"
    return "\n".join([
        "## memory GET: the Python client against bare httpx",
        "",
        h.markdown_table(["caller", "calls", "p50 ms", "p95 ms", "p99 ms"], rows),
        "",
        f"SDK p50 overhead against bare httpx, live: {overhead * 100:+.1f}% ({verdict} the {GOAL_OVERHEAD:.0%} goal); "
        f"client-side work the SDK adds per call: {result['client_side_p50_extra_us']:.1f} µs at p50.",
        f"Load average (1, 5, 15 min) before: {load_before}; after: {load_after} ({os.cpu_count()} CPUs).",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per round per caller")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds")
    parser.add_argument("--batch-rounds", type=int, default=20, help="store: rounds of batch against sequential")
    parser.add_argument("--checkpoint-calls", type=int, default=300, help="checkpointer: calls per saver and call")
    parser.add_argument("--thread-length", type=int, default=20, help="checkpointer: checkpoints of the read thread")
    parser.add_argument("--sweep-lengths", default="10,50,100,200,400,1000,5000",
                        help="checkpointer sweep: thread lengths (comma-separated, ascending; empty: no sweep)")
    parser.add_argument("--sweep-calls", type=int, default=30, help="checkpointer sweep: calls per saver and call")
    parser.add_argument("--only-sweep", action="store_true", help="run the checkpointer sweep only")
    args = parser.parse_args()
    lengths = sorted(int(part) for part in args.sweep_lengths.split(",") if part.strip())
    h.install_sigterm_handler()

    server_url = h.embedded_postgres_url()
    database_url = h.recreate_database(server_url, DB_NAME)
    langgraph_url = h.recreate_database(server_url, LANGGRAPH_DB)
    h.log("migrating the benchmark database")
    h.migrate(database_url)
    log_path = Path(h.RESULTS_DIR) / "clients-web.log"
    load_before = " ".join(f"{value:.2f}" for value in os.getloadavg())
    started = time.monotonic()
    extra_env = {"EMBEDDING_PROVIDER": "hash", "API_KEYS": f"bench:{API_KEY}"}
    with h.web_server(database_url, workers=1, log_path=log_path, extra_env=extra_env) as server:
        token = h.mint_token(server.base_url, USER, PASSWORD)
        result = store = saver = sweep = None
        if not args.only_sweep:
            result = measure_overhead(server, token, rounds=args.rounds, per_round=args.calls)
            store = measure_store_batch(server, token, rounds=args.batch_rounds)
            saver = measure_checkpointer(server, token, langgraph_url, calls=args.checkpoint_calls,
                                         thread_length=args.thread_length)
        if lengths:
            sweep = measure_thread_sweep(server, token, langgraph_url, lengths=lengths, calls=args.sweep_calls)
    load_after = " ".join(f"{value:.2f}" for value in os.getloadavg())
    if result is not None:
        print(report(result, load_before, load_after))
        print()
        print(report_adapters(store, saver))
    if sweep is not None:
        print()
        print(report_sweep(sweep))
        print(f"\nLoad average (1, 5, 15 min) before: {load_before}; after: {load_after} ({os.cpu_count()} CPUs).")
    path = h.write_json("clients", {
        "machine": h.machine_info(database_url, load_avg_at_end=load_after),
        "command": h.command_line(),
        "seconds": round(time.monotonic() - started, 1),
        "memory_get": result,
        "store_batch": store,
        "checkpointer": saver,
        "checkpointer_sweep": sweep,
    })
    h.log(f"results written to {path.relative_to(h.REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
