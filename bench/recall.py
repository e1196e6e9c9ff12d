"""Retrieval quality of memory and conversation search (issue 30): recall@5 and MRR on a labelled set, per search
mode, per query category, with and without attribute filters; search latency per mode against meaning-only search
in the same run.

1. A private database on the embedded PostgreSQL, the web server as the Procfile starts it and the Celery worker,
   with an attributes policy that copies each memory's ``attributes`` (``source``, ``year``) from its value into
   the stored, filterable attributes (the built-in one derives only ``namespace`` and ``sub``).
2. The set of bench/recall_data/ (bench/recall_dataset.py: 2,268 memories and 368 queries; 352 conversations of
   1,408 entries and 92 queries) loaded through the API: ``PUT /v1/memories`` with ``index`` and
   ``POST .../entries`` with ``indexedContent``; then it waits until every indexer's backlog (``/readyz``) is
   empty.
3. Memory search: every query in every mode the server has, without and with its attribute filter, ``limit`` 10:
   recall@5 and MRR@10 per category (paraphrase, exact, mixed) and per token kind. Modes: meaning only
   (``search_type: semantic``, or no ``search_type`` on a server without it: today's search), words only
   (``fulltext``) and hybrid (``auto``); a mode the server lacks (``/openapi.json`` does not declare
   ``search_type``, or a search with it answers 400) is "n/a".
4. Latency: ``POST /v1/memories/search`` with the query texts, each mode at c1 in interleaved rounds (p50, p95,
   and p50 over meaning-only's), then at c16 (searches/s, p95), with the web workers' and PostgreSQL's CPU per
   search.
5. Conversation search (``POST /v1/conversations/search``, ``searchType`` semantic, fulltext, auto): recall@5 and
   MRR@10 of conversations per category.

recall@5 = the share of a query's relevant items in the first 5 results (of at most 5 relevant: min(5, |relevant|)),
averaged over queries; MRR@10 = 1 / rank of the first relevant result within the first 10 (0 when none), averaged.
Under a filter the relevant items are those that pass it.

Run: ``.venv/bin/python bench/recall.py`` (1.5-5 min on 2 cores, most of it loading and indexing); ``--quick`` for a
smoke run (every 4th query, few latency requests); ``--help`` for the rest.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _harness as h
import recall_dataset
import semantic_search as sem

BENCH_DB = "memory_service_recall_bench"
USER, PASSWORD = "bob", "bob"
ROOT = ["user", USER]
REDIS_DB = 12  # a private database number on the embedded Valkey: no other bench's worker takes our indexing tasks
LIMIT = 10
K = 5
CATEGORIES = ("paraphrase", "exact", "mixed")
MEMORY_MODES = ("semantic", "fulltext", "auto")
MODE_NAMES = {"semantic": "meaning only", "fulltext": "words only", "auto": "hybrid"}
CONVERSATION_MODES = ("semantic", "fulltext", "auto")
MAX_429_RETRIES = 20

# Copies the memory value's own "attributes" object (scalars: source, year) next to what the built-in policy
# derives, so that filtered searches have something to filter on. The filter policy still confines bob to
# {"namespace": "user", "sub": "bob"}.
ATTRIBUTES_REGO = """package memories.attributes

import rego.v1

default attributes := {}

attributes := object.union(object.get(input.value, "attributes", {}), {"namespace": input.namespace[0], "sub": input.namespace[1]}) if {
	count(input.namespace) >= 2
}
"""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--sample", type=int, default=1, help="keep every Nth query (default 1: all)")
    parser.add_argument("--skip", default="",
                        help="comma-separated parts to skip: filters, latency, conversations, memories (memories:\n"
                        "no memory is loaded, so memory recall and latency are skipped too)")
    parser.add_argument("--latency-requests", type=int, default=300, help="searches per mode at c1, over all rounds")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved c1 rounds (default 3)")
    parser.add_argument("--c16-requests", type=int, default=800, help="searches per mode at c16 (default 800)")
    parser.add_argument("--max-seconds", type=float, default=30, help="time cap per measured run (default 30)")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn --workers (default 2)")
    parser.add_argument("--load-concurrency", type=int, default=8, help="clients loading the set (default 8)")
    parser.add_argument("--recall-concurrency", type=int, default=4, help="clients running the labelled queries")
    parser.add_argument("--index-timeout", type=float, default=1200, help="seconds to wait for the indexers")
    parser.add_argument("--data", type=Path, default=recall_dataset.DATA_DIR, help="the labelled set's directory")
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE",
        help="an environment variable of the web server and worker (repeatable), e.g. a rate limit or\n"
        "MEMORY_SEARCH_SEMANTIC_WEIGHT=0.6; the harness keeps rate limits and quotas out of reach by default",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smoke run: every 4th query, 60 + 160 latency searches")
    args = parser.parse_args(argv)
    if args.quick:
        args.sample, args.latency_requests, args.rounds, args.c16_requests, args.max_seconds = 4, 60, 2, 160, 10
    args.skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    unknown = args.skip - {"filters", "latency", "conversations", "memories"}
    if unknown:
        parser.error(f"--skip: unknown part(s) {sorted(unknown)}")
    env = {}
    for pair in args.server_env:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            parser.error(f"--server-env takes NAME=VALUE, not {pair!r}")
        env[name] = value
    args.server_env = env
    return args


# --- Set-up ----------------------------------------------------------------------------------------------------------


def bench_redis_url() -> str:
    from apps.runtime import embedded_services

    parts = urllib.parse.urlsplit(embedded_services.redis_url())
    return urllib.parse.urlunsplit(parts._replace(path=f"/{REDIS_DB}"))


@dataclass
class Features:
    """What the server under test offers, from its /openapi.json (a 400 later can still turn a mode off)."""

    search_type: bool
    queries: bool
    conversation_search_type: bool
    notes: list[str] = field(default_factory=list)


def resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with ``$ref`` followed (local references only), and ``allOf`` members' properties merged."""
    for _ in range(20):
        ref = node.get("$ref")
        if not ref:
            break
        target: Any = spec
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        node = target
    if "allOf" in node:
        merged: dict[str, Any] = {"properties": dict(node.get("properties", {}))}
        for member in node["allOf"]:
            merged["properties"].update(resolve(spec, member).get("properties", {}))
        return merged
    return node


def request_properties(spec: dict[str, Any], path: str) -> set[str]:
    operation = spec.get("paths", {}).get(path, {}).get("post", {})
    content = operation.get("requestBody", {}).get("content", {})
    schema = (content.get("application/json") or next(iter(content.values()), {})).get("schema", {})
    return set(resolve(spec, schema).get("properties", {}))


def detect_features(session: h.HttpSession) -> Features:
    status, body = session.request("GET", "/openapi.json", expect_2xx=False)
    if status != 200:
        return Features(False, False, False, [f"/openapi.json answered {status}: no optional feature assumed"])
    spec = json.loads(body)
    memory = request_properties(spec, "/v1/memories/search")
    conversation = request_properties(spec, "/v1/conversations/search")
    return Features("search_type" in memory, "queries" in memory, "searchType" in conversation)


def write_policy_dir() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="recall-bench-policy-"))
    (directory / "attributes.rego").write_text(ATTRIBUTES_REGO)
    return directory


# --- HTTP with 429 handling ------------------------------------------------------------------------------------------


class Retries:
    """429s met (rate limits are per user; the harness normally keeps them out of reach): counted and reported."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.waited = 0.0

    def add(self, seconds: float) -> None:
        with self.lock:
            self.count += 1
            self.waited += seconds


RETRIES = Retries()


def call_json(session: h.HttpSession, method: str, path: str, body: Any) -> tuple[int, Any]:
    """(status, decoded body); a 429 is waited out (its ``details.retryAfterSeconds``, as its Retry-After header
    says, at most 5 s a time; 1 s without one) and retried."""
    for _ in range(MAX_429_RETRIES):
        status, data = session.request(method, path, body, expect_2xx=False)
        if status != 429:
            return status, (json.loads(data) if data else None)
        wait = 1.0
        try:
            wait = min(5.0, max(0.1, float(json.loads(data)["details"]["retryAfterSeconds"])))
        except (ValueError, KeyError, TypeError):
            pass
        RETRIES.add(wait)
        time.sleep(wait)
    raise h.BenchError(f"{method} {path}: still 429 after {MAX_429_RETRIES} tries; raise the limits (--server-env)")


def expect_ok(status: int, body: Any, what: str) -> Any:
    if not 200 <= status < 300:
        raise h.BenchError(f"{what} -> {status}: {json.dumps(body)[:300]}")
    return body


class Progress:
    """Thread-safe "n of total" lines, every 5 s and at the end."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.lock = label, total, 0, threading.Lock()
        self.started = self.last = time.monotonic()

    def tick(self) -> None:
        with self.lock:
            self.done += 1
            now = time.monotonic()
            if now - self.last >= 5 or self.done == self.total:
                h.log(f"{self.label}: {self.done}/{self.total} ({self.done / max(1e-9, now - self.started):.0f}/s)")
                self.last = now


def parallel(items: Sequence[Any], fn: Callable[[h.HttpSession, Any], Any], *, server: h.WebServer,
             headers: dict[str, str], concurrency: int, progress: Progress | None = None) -> list[Any]:
    """``fn(session, item)`` for every item on ``concurrency`` threads, one keep-alive connection each; results in
    item order. The first exception stops the rest and is raised."""
    local = threading.local()
    sessions: list[h.HttpSession] = []
    lock = threading.Lock()

    def run(item: Any) -> Any:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = h.HttpSession(server.host, server.port, headers, timeout=60)
            with lock:
                sessions.append(session)
        result = fn(session, item)
        if progress:
            progress.tick()
        return result

    try:
        with concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="recall") as pool:
            futures = [pool.submit(run, item) for item in items]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    finally:
        for session in sessions:
            session.close()


# --- Loading ---------------------------------------------------------------------------------------------------------


def load_memories(server: h.WebServer, headers: dict[str, str], memories: list[dict], concurrency: int) -> float:
    def put(session: h.HttpSession, memory: dict) -> None:
        body = {"namespace": [*ROOT, *memory["namespace"]], "key": memory["key"],
                "value": {"text": memory["text"], "attributes": memory["attributes"]}, "index": {"text": memory["text"]}}
        expect_ok(*call_json(session, "PUT", "/v1/memories", body), f"PUT memory {memory['key']}")

    started = time.monotonic()
    parallel(memories, put, server=server, headers=headers, concurrency=concurrency,
             progress=Progress("memories loaded", len(memories)))
    return time.monotonic() - started


def load_conversations(server: h.WebServer, headers: dict[str, str], conversations: list[dict],
                       concurrency: int) -> float:
    def append_all(session: h.HttpSession, conversation: dict) -> None:
        for entry in conversation["entries"]:  # in order: one thread per conversation
            body = {"content": [{"role": entry["role"], "text": entry["text"]}], "indexedContent": entry["text"]}
            expect_ok(*call_json(session, "POST", f"/v1/conversations/{conversation['id']}/entries", body),
                      f"append to conversation {conversation['id']}")

    started = time.monotonic()
    parallel(conversations, append_all, server=server, headers=headers, concurrency=concurrency,
             progress=Progress("conversations loaded", len(conversations)))
    return time.monotonic() - started


def wait_indexed(server: h.WebServer, timeout: float) -> dict[str, Any]:
    """Until every indexer in /readyz reports no backlog (quarantined rows aside); its figures at the end."""
    session = h.HttpSession(server.host, server.port, timeout=60)
    started = time.monotonic()
    last_log = 0.0
    try:
        while True:
            status, body = session.request("GET", "/readyz", expect_2xx=False)
            info = json.loads(body) if body else {}
            info = info.get("details", info) if status != 200 else info
            backlogs = {name: value for name, value in info.items() if isinstance(value, dict) and "backlog" in value}
            waiting = sum(int(v["backlog"]) - int(v.get("quarantined", 0)) for v in backlogs.values())
            quarantined = sum(int(v.get("quarantined", 0)) for v in backlogs.values())
            now = time.monotonic()
            if status == 200 and waiting <= 0:
                h.log(f"indexed after {now - started:.0f}s (quarantined: {quarantined})")
                return {"seconds": round(now - started, 1), "quarantined": quarantined, "indexers": backlogs}
            if now - last_log >= 10:
                counts = ", ".join(f"{name} {value['backlog']}" for name, value in backlogs.items())
                h.log(f"waiting for the indexers: {waiting} texts to go ({counts})")
                last_log = now
            if now - started > timeout:
                raise h.BenchError(f"indexers not done after {timeout:.0f}s: {backlogs} (see the worker log)")
            time.sleep(1)
    finally:
        session.close()


# --- Scoring ---------------------------------------------------------------------------------------------------------


def passes(attributes: dict[str, Any], condition: dict[str, Any]) -> bool:
    """The service's filter semantics, for the forms the set uses: equality, ``in`` and ranges."""
    for name, wanted in condition.items():
        value = attributes.get(name)
        if isinstance(wanted, dict):
            if "in" in wanted and value not in wanted["in"]:
                return False
            for op, check in (("gt", lambda a, b: a > b), ("gte", lambda a, b: a >= b), ("lt", lambda a, b: a < b),
                              ("lte", lambda a, b: a <= b)):
                if op in wanted and (value is None or not check(value, wanted[op])):
                    return False
        elif value != wanted:
            return False
    return True


def score(ranked: list[str], relevant: Sequence[str]) -> tuple[float, float]:
    """(recall@K over min(K, |relevant|), reciprocal rank within the list)."""
    wanted = set(relevant)
    found = len(wanted & set(ranked[:K]))
    recall = found / min(K, len(wanted))
    rank = next((position for position, key in enumerate(ranked, 1) if key in wanted), None)
    return recall, (1 / rank if rank else 0.0)


@dataclass
class Outcome:
    """One labelled query run in one mode: what came back and how it scored."""

    query: str
    category: str
    kind: str
    recall: float
    rr: float
    ranked: list[str]


def summarize(outcomes: list[Outcome], group: Callable[[Outcome], str]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault(group(outcome), []).append(outcome)
        groups.setdefault("all", []).append(outcome)
    return {
        name: {"n": len(items), "recall_at_5": round(statistics.fmean(o.recall for o in items), 4),
               "mrr": round(statistics.fmean(o.rr for o in items), 4)}
        for name, items in groups.items()
    }


# --- Memory search ---------------------------------------------------------------------------------------------------


def memory_body(text: str, mode: str, features: Features, filter: dict | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"namespace_prefix": ROOT, "query": text, "limit": LIMIT}
    if features.search_type:
        body["search_type"] = mode
    if filter is not None:
        body["filter"] = filter
    return body


def memory_modes(features: Features) -> list[str]:
    return list(MEMORY_MODES) if features.search_type else ["semantic"]


def run_memory_recall(args: argparse.Namespace, server: h.WebServer, headers: dict[str, str], features: Features,
                      queries: list[dict], attributes: dict[str, dict]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    variants = [False] if "filters" in args.skip else [False, True]
    for mode in memory_modes(features):
        for filtered in variants:
            label = f"{MODE_NAMES[mode]}{', filtered' if filtered else ''}"
            runnable = []
            for query in queries:
                relevant = query["relevant"]
                if filtered:
                    relevant = [key for key in relevant if passes(attributes[key], query["filter"])]
                if relevant:
                    runnable.append((query, relevant))

            def one(session: h.HttpSession, pair: tuple[dict, list[str]], mode: str = mode,
                    filtered: bool = filtered, label: str = label) -> Outcome | None:
                query, relevant = pair
                body = memory_body(query["text"], mode, features, query["filter"] if filtered else None)
                status, answer = call_json(session, "POST", "/v1/memories/search", body)
                if status == 400 and "search_type" in body:
                    return None  # the server does not take search_type after all: reported as n/a
                items = expect_ok(status, answer, f"memory search ({label}) {query['id']}")["items"]
                ranked = [item["key"] for item in items]
                recall, rr = score(ranked, relevant)
                return Outcome(query["id"], query["category"], query["kind"], recall, rr, ranked)

            outcomes = parallel(runnable, one, server=server, headers=headers, concurrency=args.recall_concurrency,
                                progress=Progress(f"memory search, {label}", len(runnable)))
            if any(outcome is None for outcome in outcomes):
                features.notes.append(f"search_type={mode} answered 400: reported as n/a")
                features.search_type = False
                return run_memory_recall(args, server, headers, features, queries, attributes)
            kept = [outcome for outcome in outcomes if outcome is not None]
            results[f"{mode}{':filtered' if filtered else ''}"] = {
                "mode": mode, "filtered": filtered,
                "by_category": summarize(kept, lambda o: o.category),
                "by_kind": summarize([o for o in kept if o.category != "paraphrase"], lambda o: o.kind),
                "misses": [{"query": o.query, "rr": round(o.rr, 3), "top": o.ranked[:3]} for o in kept if o.rr < 1],
            }
            overall = results[f"{mode}{':filtered' if filtered else ''}"]["by_category"]["all"]
            h.log(f"{label}: recall@5 {overall['recall_at_5']:.3f}, MRR {overall['mrr']:.3f}")
    return results


def run_latency(args: argparse.Namespace, server: h.WebServer, headers: dict[str, str], features: Features,
                texts: list[str]) -> dict[str, Any]:
    meter = h.CpuMeter({"web": server.process.pid, "postgres": h.postmaster_pid()})
    modes = memory_modes(features)

    def worker(mode: str, offset: int) -> Callable[[int], h.HttpWorker]:
        def call(session: h.HttpSession, i: int) -> None:
            body = memory_body(texts[(offset + i) % len(texts)], mode, features)
            expect_ok(*call_json(session, "POST", "/v1/memories/search", body), f"search ({mode})")

        return lambda _i: h.HttpWorker(server.base_url, headers, call)

    for mode in modes:  # warm-up: each mode's code paths and caches, unmeasured
        h.run_load("warm-up", worker(mode, 0), concurrency=1, requests=10, max_seconds=30)
    c1: dict[str, list[h.RunResult]] = {mode: [] for mode in modes}
    per_round = max(1, args.latency_requests // max(1, args.rounds))
    for round_number in range(args.rounds):
        order = modes if round_number % 2 == 0 else list(reversed(modes))  # no mode always first
        for mode in order:
            run = h.run_load(f"c1 {mode}", worker(mode, round_number * per_round), concurrency=1,
                             requests=per_round, max_seconds=args.max_seconds, cpu=meter)
            c1[mode].append(run)
            h.log(f"latency round {round_number + 1}/{args.rounds} {MODE_NAMES[mode]}: c1 p50 {run.ms(50):.1f} ms, "
                  f"p95 {run.ms(95):.1f} ms ({run.completed} searches)")
    out: dict[str, Any] = {}
    for mode in modes:
        latencies = sorted(value for run in c1[mode] for value in run.latencies)
        errors = sum(run.errors for run in c1[mode])
        if errors:
            raise h.BenchError(f"latency c1 {mode}: {errors} errors, e.g. {c1[mode][0].error_samples}")
        wall = sum(run.wall for run in c1[mode])
        cpu = {name: sum(run.cpu_percent.get(name, 0) * run.wall for run in c1[mode]) / 100 for name in ("web", "postgres")}
        out[mode] = {
            "c1": {"searches": len(latencies), "p50_ms": round(h.percentile(latencies, 50) * 1000, 2),
                   "p95_ms": round(h.percentile(latencies, 95) * 1000, 2),
                   "cpu_ms_per_search": {name: round(1000 * seconds / max(1, len(latencies)), 2)
                                         for name, seconds in cpu.items()},
                   "timed_out": any(run.timed_out for run in c1[mode]), "wall_s": round(wall, 1)},
        }
    for mode in modes:
        run = h.run_load(f"c16 {mode}", worker(mode, 7), concurrency=16, requests=args.c16_requests,
                         max_seconds=args.max_seconds, cpu=meter)
        if run.errors:
            raise h.BenchError(f"latency c16 {mode}: {run.errors} errors, e.g. {run.error_samples}")
        out[mode]["c16"] = {"searches": run.completed, "throughput_per_s": round(run.throughput, 1),
                            "p50_ms": round(run.ms(50), 2), "p95_ms": round(run.ms(95), 2),
                            "cpu_percent": {k: round(v, 1) for k, v in run.cpu_percent.items()},
                            "timed_out": run.timed_out}
        h.log(f"latency {MODE_NAMES[mode]}: c16 {run.throughput:.1f} searches/s, p95 {run.ms(95):.1f} ms")
    base = out.get("semantic", {}).get("c1", {}).get("p50_ms")
    for mode in modes:
        out[mode]["c1"]["p50_over_meaning_only"] = round(out[mode]["c1"]["p50_ms"] / base, 2) if base else None
    return out


# --- Conversation search ---------------------------------------------------------------------------------------------


def run_conversation_recall(args: argparse.Namespace, server: h.WebServer, headers: dict[str, str],
                            features: Features, queries: list[dict]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    modes = CONVERSATION_MODES if features.conversation_search_type else ("auto",)
    for mode in modes:
        def one(session: h.HttpSession, query: dict, mode: str = mode) -> Outcome:
            body: dict[str, Any] = {"query": query["text"], "limit": LIMIT}
            if features.conversation_search_type:
                body["searchType"] = mode
            data = expect_ok(*call_json(session, "POST", "/v1/conversations/search", body),
                             f"conversation search ({mode}) {query['id']}")["data"]
            ranked = list(dict.fromkeys(item["conversationId"] for item in data))
            recall, rr = score(ranked, query["relevant"])
            return Outcome(query["id"], query["category"], query["kind"], recall, rr, ranked)

        outcomes = parallel(queries, one, server=server, headers=headers, concurrency=args.recall_concurrency,
                            progress=Progress(f"conversation search, {mode}", len(queries)))
        results[mode] = {"mode": mode, "by_category": summarize(outcomes, lambda o: o.category),
                         "misses": [{"query": o.query, "rr": round(o.rr, 3)} for o in outcomes if o.rr < 1]}
        overall = results[mode]["by_category"]["all"]
        h.log(f"conversation search {mode}: recall@5 {overall['recall_at_5']:.3f}, MRR {overall['mrr']:.3f}")
    return results


# --- Main ------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    h.install_sigterm_handler()
    data = recall_dataset.load(args.data)
    memories, conversations = data["memories"], data["conversations"]
    memory_queries = data["memory_queries"][:: args.sample]
    conversation_queries = data["conversation_queries"][:: args.sample]
    attributes = {memory["key"]: memory["attributes"] for memory in memories}

    server_url = h.embedded_postgres_url()
    database_url = h.recreate_database(server_url, BENCH_DB)
    h.migrate(database_url)
    policy_dir = write_policy_dir()
    h.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    env = {"REDIS_URL": bench_redis_url(), "EMBEDDING_PROVIDER": "local", "SERVICE_POLICY_DIR": str(policy_dir),
           **args.server_env}
    info = h.machine_info(database_url)
    report: dict[str, Any] = {
        "command": h.command_line(), "machine": info, "args": {k: (sorted(v) if isinstance(v, set) else str(v))
                                                               for k, v in vars(args).items()},
        "data": {"memories": len(memories), "memory_queries": len(memory_queries),
                 "conversations": len(conversations),
                 "entries": sum(len(c["entries"]) for c in conversations),
                 "conversation_queries": len(conversation_queries),
                 "sha256": recall_dataset.digest({name: (args.data / name).read_bytes() for name in recall_dataset.FILES})},
    }
    try:
        with sem.celery_worker(database_url, env, h.RESULTS_DIR / "recall-worker.log"), \
                h.web_server(database_url, workers=args.web_workers, log_path=h.RESULTS_DIR / "recall-server.log",
                             extra_env=env) as server:
            token = h.mint_token(server.base_url, USER, PASSWORD)
            headers = {"Authorization": f"Bearer {token}"}
            probe = h.HttpSession(server.host, server.port)
            try:
                features = detect_features(probe)
            finally:
                probe.close()
            h.log(f"server features: search_type {features.search_type}, queries {features.queries}, "
                  f"conversation searchType {features.conversation_search_type}")
            report["load"] = {}
            if "memories" not in args.skip:
                report["load"]["memories_s"] = round(load_memories(server, headers, memories, args.load_concurrency), 1)
            if "conversations" not in args.skip:
                report["load"]["conversations_s"] = round(
                    load_conversations(server, headers, conversations, args.load_concurrency), 1)
            report["indexing"] = wait_indexed(server, args.index_timeout)
            if "memories" not in args.skip:
                report["memory_recall"] = run_memory_recall(args, server, headers, features, memory_queries,
                                                            attributes)
            if not args.skip & {"latency", "memories"}:
                texts = [query["text"] for query in data["memory_queries"]]
                report["latency"] = run_latency(args, server, headers, features, texts)
            if "conversations" not in args.skip:
                report["conversation_recall"] = run_conversation_recall(args, server, headers, features,
                                                                        conversation_queries)
            report["features"] = vars(features)
    except KeyboardInterrupt:
        h.log("interrupted")
        return 130
    finally:
        report["machine"]["load_avg_at_end"] = " ".join(f"{value:.2f}" for value in os.getloadavg())
        report["retries_429"] = {"count": RETRIES.count, "waited_s": round(RETRIES.waited, 1)}
    path = h.write_json("recall", report)
    print_report(report)
    h.log(f"results in {path}")
    return 0


# --- Report ----------------------------------------------------------------------------------------------------------


def _cell(block: dict[str, Any] | None, group: str, metric: str) -> str:
    if block is None:
        return "n/a"
    value = block.get(group, {}).get(metric)
    return "-" if value is None else f"{value:.3f}"


def print_report(report: dict[str, Any]) -> None:
    m, d = report["machine"], report["data"]
    features = report.get("features", {})
    print(f"## Recall of memory and conversation search ({m['date']}, {m['nproc']} CPUs, {m['cpu']}, PostgreSQL "
          f"{m['postgres']}, load average {m['load_avg_at_start']} -> {m['load_avg_at_end']})\n")
    print(f"`{report['command']}`\n")
    print(f"Data: {d['memories']:,} memories, {d['memory_queries']} queries; {d['conversations']} conversations "
          f"({d['entries']:,} entries), {d['conversation_queries']} queries (bench/recall_data, sha256 "
          f"{d['sha256'][:16]}). Load: {report.get('load')}; indexing waited {report.get('indexing', {}).get('seconds')} s. "
          f"Server: search_type {'yes' if features.get('search_type') else 'no (meaning only)'}, queries "
          f"{'yes' if features.get('queries') else 'no'}. 429s met: {report['retries_429']['count']}.\n")
    for note in features.get("notes", []):
        print(f"- note: {note}")
    recall = report.get("memory_recall", {})
    headers = ["category", "filter", "n"]
    titles = () if not recall else (("by query category", "by_category", (*CATEGORIES, "all")),
                                     ("exact and mixed queries by token kind", "by_kind",
                                      ("code", "id", "name", "number", "all")))
    for mode in MEMORY_MODES:
        headers += [f"{MODE_NAMES[mode]} R@5", "MRR"]
    for title, group_key, groups in titles:
        rows = []
        for filtered in (False, True):
            suffix = ":filtered" if filtered else ""
            if not any(key.endswith(suffix) and key.count(":") == int(filtered) for key in recall):
                continue
            for group in groups:
                blocks = {mode: recall.get(f"{mode}{suffix}", {}).get(group_key) for mode in MEMORY_MODES}
                n = next((b[group]["n"] for b in blocks.values() if b and group in b), None)
                if n is None:
                    continue
                row = [group, "source + year" if filtered else "-", n]
                for mode in MEMORY_MODES:
                    row += [_cell(blocks[mode], group, "recall_at_5"), _cell(blocks[mode], group, "mrr")]
                rows.append(row)
        print(f"### Memory search: recall@5 and MRR@10, {title}\n")
        print(h.markdown_table(headers, rows, "llr" + "r" * 6))
        print()
    latency = report.get("latency")
    if latency:
        rows = []
        for mode in MEMORY_MODES:
            entry = latency.get(mode)
            if entry is None:
                rows.append([MODE_NAMES[mode], *["n/a"] * 8])
                continue
            c1, c16 = entry["c1"], entry["c16"]
            cpu = c1["cpu_ms_per_search"]
            rows.append([MODE_NAMES[mode], c1["searches"], c1["p50_ms"], c1["p95_ms"],
                         c1["p50_over_meaning_only"], f"{cpu.get('web', 0)} / {cpu.get('postgres', 0)}",
                         c16["searches"], c16["throughput_per_s"], c16["p95_ms"]])
        print("### Memory search latency (same run, same query texts, unfiltered, limit 10)\n")
        print(h.markdown_table(["mode", "c1 n", "c1 p50 ms", "c1 p95 ms", "p50 / meaning only",
                                "CPU ms/search web / pg (c1)", "c16 n", "c16 searches/s", "c16 p95 ms"], rows))
        print()
    conversations = report.get("conversation_recall")
    if conversations:
        rows = []
        for group in (*CATEGORIES, "all"):
            blocks = {mode: conversations.get(mode, {}).get("by_category") for mode in CONVERSATION_MODES}
            n = next((b[group]["n"] for b in blocks.values() if b and group in b), None)
            if n is None:
                continue
            row = [group, n]
            for mode in CONVERSATION_MODES:
                row += [_cell(blocks[mode], group, "recall_at_5"), _cell(blocks[mode], group, "mrr")]
            rows.append(row)
        print("### Conversation search: recall@5 and MRR@10 of conversations, by query category\n")
        print(h.markdown_table(["category", "n", "semantic R@5", "MRR", "fulltext R@5", "MRR", "auto R@5", "MRR"], rows))
        print()
    if report.get("memory_recall"):
        print_goals(report)


def print_goals(report: dict[str, Any]) -> None:
    recall = report.get("memory_recall", {})
    hybrid, meaning = recall.get("auto", {}).get("by_category"), recall.get("semantic", {}).get("by_category")
    rows = []
    exact = hybrid.get("exact", {}).get("recall_at_5") if hybrid else None
    rows.append(["hybrid recall@5, exact-token queries", _fmt(exact), ">= 0.95", _met(exact, lambda v: v >= 0.95)])
    mixed = hybrid.get("mixed", {}).get("recall_at_5") if hybrid else None
    rows.append(["hybrid recall@5, mixed queries (for information)", _fmt(mixed), "-", "-"])
    para_h = hybrid.get("paraphrase", {}).get("recall_at_5") if hybrid else None
    para_m = meaning.get("paraphrase", {}).get("recall_at_5") if meaning else None
    rows.append(["hybrid recall@5 on paraphrases vs meaning only", f"{_fmt(para_h)} vs {_fmt(para_m)}", ">=",
                 _met(para_h, lambda v: para_m is not None and v >= para_m)])
    latency = report.get("latency", {})
    ratio = latency.get("auto", {}).get("c1", {}).get("p50_over_meaning_only")
    rows.append(["hybrid c1 p50 / meaning-only c1 p50", _fmt(ratio, 2), "<= 1.25", _met(ratio, lambda v: v <= 1.25)])
    print("### Issue 30 goals measured here\n")
    print(h.markdown_table(["goal", "value", "target", "met?"], rows, "lrrl"))


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _met(value: float | None, test: Callable[[float], bool]) -> str:
    return "n/a" if value is None else ("yes" if test(value) else "**no**")


if __name__ == "__main__":
    h.run_main(main)
