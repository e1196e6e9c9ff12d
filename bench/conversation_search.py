"""Benchmark of conversation search (issue 9) at 10k and 100k entries, next to a psycopg floor measured in the same run.

For each size (``--sizes``), on a private database of the embedded PostgreSQL:

* load: size/10 conversations of 10 history entries each, owned by alice; bob is a reader of 1% of them, charlie of
  50%. Entries are sealed with the service's key ring exactly as the write path seals them, their index text is
  plaintext (D5) and each has one vector, all written with COPY (what the indexer would have produced); then the
  HNSW index is built the way the service builds it (build time reported).
* latency p50 / p95 / p99 and throughput at concurrency 1 and 16, for bob (1%) and charlie (50%):
  - HTTP ``POST /v1/conversations/search`` on the real server (gunicorn as the Procfile starts it), ``fulltext``,
    ``semantic`` and ``auto`` (both embed the query in the server: query embedding included);
  - in-process ``semantic`` with precomputed query vectors (query embedding excluded): the ranked SQL (exact or
    HNSW by scope size), then the page's entries fetched, decrypted and highlighted;
  - floor: a primary-key lookup of an entry through psycopg alone, same concurrency, same database.
* recall@20 of the semantic path (the plan the service picks) against exact search with the same membership
  filter, for bob and charlie.
* index lag at the largest size: append an entry over HTTP (no indexedContent: the service derives the text) and
  poll full-text search until it is returned, with the real Celery worker (on_commit request, broker, worker,
  decrypt, local model, vectors).

Vectors are not random: the local model's embeddings of ~1000 memory-like sentences (bench/semantic_search.py's)
are centroids and each entry is a noisy mix of two, its index text those two sentences.

Run: ``.venv/bin/python bench/conversation_search.py`` (``make bench-conversation-search``); ``--quick`` for a
smoke run (1k entries).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import _harness as h
import semantic_search as sem

BENCH_DB = "memory_service_conversation_search_bench"
OWNER = "alice"
READERS = {"bob": 100, "charlie": 2}  # reader of every Nth conversation: 1% and 50%
ENTRIES_PER_CONVERSATION = 10
LIMIT = 20
METHODS = ("fulltext", "semantic", "auto")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="entries per data set, comma-separated")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--requests", default="100,400", help="requests per run, one per --concurrency")
    parser.add_argument("--max-seconds", type=float, default=15.0, help="cap per run")
    parser.add_argument("--recall-queries", type=int, default=40)
    parser.add_argument("--lag-writes", type=int, default=20)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="1k entries, few requests")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.requests, args.max_seconds, args.recall_queries, args.lag_writes = "1000", "20,40", 5.0, 10, 5
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.requests = [int(r) for r in args.requests.split(",")]
    return args


# --- Data -----------------------------------------------------------------------------------------------------------


def fulltext_queries(count: int, seed: int) -> list[str]:
    """Two content words of a fact, as a user types them in a search box ("allergic peanuts")."""
    import numpy as np

    rng = np.random.default_rng(seed)
    queries = []
    for _ in range(count):
        words = [w.strip("?,.") for w in sem.FACTS[int(rng.integers(len(sem.FACTS)))].split() if len(w) > 3]
        start = int(rng.integers(max(1, len(words) - 1)))
        queries.append(" ".join(words[start:start + 2]) or words[0])
    return queries


def load(database_url: str, size: int, sentences: list[str], centroids: Any, model: str, seed: int) -> dict[str, Any]:
    import numpy as np
    import psycopg

    from apps.conversations import selectors
    from apps.encryption import crypto

    rng = np.random.default_rng(seed)
    vectors, primary, secondary = sem.make_vectors(centroids, size, sem.NOISE_SIGMA, rng)
    conversations = max(1, size // ENTRIES_PER_CONVERSATION)
    conv_ids = [uuid.uuid4() for _ in range(conversations)]
    now = datetime.now(UTC)
    started = time.monotonic()
    in_scope = {user: 0 for user in READERS}
    with psycopg.connect(database_url) as conn:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        with conn.cursor() as cur:
            with cur.copy("COPY conversations (id, root_id, owner_user_id, title, metadata, created_at, updated_at) "
                          "FROM STDIN") as copy:
                for n, cid in enumerate(conv_ids):
                    stamp = now - timedelta(seconds=conversations - n)
                    copy.write_row([cid, cid, OWNER, sentences[int(primary[n * ENTRIES_PER_CONVERSATION % size])][:40],
                                    "{}", stamp, stamp])
            with cur.copy("COPY conversation_memberships (id, root_id, user_id, access_level, created_at) "
                          "FROM STDIN") as copy:
                for n, cid in enumerate(conv_ids):
                    copy.write_row([uuid.uuid4(), cid, OWNER, "owner", now])
                    for user, every in READERS.items():
                        if n % every == 0:
                            copy.write_row([uuid.uuid4(), cid, user, "reader", now])
                            in_scope[user] += ENTRIES_PER_CONVERSATION
            entry_ids = [uuid.uuid4() for _ in range(size)]
            with cur.copy("COPY conversation_entries (id, conversation_id, user_id, channel, content_type, content, "
                          "indexed_content, embedding_pending, created_at) FROM STDIN") as copy:
                for i in range(size):
                    cid = conv_ids[i // ENTRIES_PER_CONVERSATION % conversations]
                    text = f"{sentences[int(primary[i])]} {sentences[int(secondary[i])]}"
                    sealed = crypto.encrypt_json([{"role": "USER" if i % 2 == 0 else "AI", "text": text}],
                                                 purpose=selectors.CONTENT_PURPOSE,
                                                 row_id=selectors.content_row_id(cid, entry_ids[i]))
                    copy.write_row([entry_ids[i], cid, OWNER, "history", "history", sealed, text, False,
                                    now - timedelta(seconds=size - i)])
            with cur.copy("COPY conversation_entry_vectors (entry_id, conversation_id, root_id, chunk, model, embedding) "
                          "FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["uuid", "uuid", "uuid", "int4", "text", "vector"])
                for i in range(size):
                    cid = conv_ids[i // ENTRIES_PER_CONVERSATION % conversations]
                    copy.write_row([entry_ids[i], cid, cid, 0, model, vectors[i]])
        conn.commit()
        conn.autocommit = True
        for table in ("conversations", "conversation_memberships", "conversation_entries",
                      "conversation_entry_vectors"):
            conn.execute(f"VACUUM ANALYZE {table}")
    return {"load_seconds": round(time.monotonic() - started, 1), "conversations": conversations,
            "entries_in_scope": in_scope, "entry_ids": entry_ids}


def build_index(dimension: int) -> float:
    from django.db import connection

    from apps.conversations import vector_index

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '1GB'")
    vector_index.create_index(dimension)
    return round(time.monotonic() - started, 1)


# --- Measurements ---------------------------------------------------------------------------------------------------


class CallWorker:
    """An in-process load thread: Django gives each thread its own database connection."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def call(self, i: int) -> None:
        self.fn(i)

    def close(self) -> None:
        pass


def row(results: list[dict], size: int, user: str, what: str, embedding: str, run: h.RunResult,
        floor: dict[int, h.RunResult]) -> None:
    if run.errors:
        raise h.BenchError(f"{what} ({user}): {run.errors} failed, e.g. {run.error_samples}")
    base = floor[run.concurrency]
    results.append({
        "size": size, "user": user, "what": what, "query_embedding": embedding, **run.summary(),
        "floor_p50_ms": round(base.ms(50), 3), "p50_over_floor": round(run.ms(50) / base.ms(50), 1),
    })
    h.log(f"{size:>7} {user:<8} {what:<22} c={run.concurrency:<3} p50={run.ms(50):7.2f} p95={run.ms(95):7.2f} "
          f"p99={run.ms(99):7.2f} ms  {run.throughput:6.1f}/s")


def measure(args, size: int, server: h.WebServer, tokens: dict[str, str], entry_ids: list, database_url: str,
            ft_queries: list[str], sem_queries: list[str], query_vectors: list, provider) -> list[dict]:
    from apps.conversations import search

    results: list[dict] = []
    floor: dict[int, h.RunResult] = {}
    for concurrency, requests in zip(args.concurrency, args.requests, strict=True):
        def lookup(conn, i: int) -> None:
            conn.execute("SELECT id, content FROM conversation_entries WHERE id = %s",
                         [entry_ids[(i * 7919) % len(entry_ids)]]).fetchone()

        floor[concurrency] = h.run_load("floor", lambda _i: h.PgWorker(database_url, lookup),
                                        concurrency=concurrency, requests=requests * 4, max_seconds=args.max_seconds)
        h.log(f"{size:>7} floor (pk lookup, psycopg) c={concurrency} p50={floor[concurrency].ms(50):.2f} ms")
    for user in READERS:
        scope = search.SearchScope(user)
        headers = {"Authorization": f"Bearer {tokens[user]}"}
        for concurrency, requests in zip(args.concurrency, args.requests, strict=True):
            for method in METHODS:
                queries = ft_queries if method == "fulltext" else sem_queries

                def call(session: h.HttpSession, i: int, m: str = method, q: list[str] = queries) -> None:
                    session.json("POST", "/v1/conversations/search",
                                 {"query": q[i % len(q)], "searchType": m, "limit": LIMIT})

                h.run_load("warm-up", lambda _i, c=call, hd=headers: h.HttpWorker(server.base_url, hd, c),
                           concurrency=1, requests=5, max_seconds=30)
                run = h.run_load(f"http {method}", lambda _i, c=call, hd=headers: h.HttpWorker(server.base_url, hd, c),
                                 concurrency=concurrency, requests=requests, max_seconds=args.max_seconds)
                row(results, size, user, f"HTTP {method}", "included" if method != "fulltext" else "-", run, floor)

            def semantic_only(i: int, scope: search.SearchScope = scope) -> None:
                j = i % len(query_vectors)
                hits = search.semantic_hits(scope, sem_queries[j], limit=LIMIT + 1, after=None,
                                            query_vector=query_vectors[j], provider=provider)
                search._results(hits[:LIMIT], search.query_terms(sem_queries[j]))  # the highlights' terms

            run = h.run_load("in-process semantic", lambda _i: CallWorker(semantic_only), concurrency=concurrency,
                             requests=requests, max_seconds=args.max_seconds)
            row(results, size, user, "in-process semantic", "excluded", run, floor)
    return results


def recall(args, query_vectors: list, provider) -> dict[str, float]:
    """recall@20 of the conversations the service's semantic path returns, against exact ranking of the same
    membership scope."""
    from django.conf import settings

    from apps.conversations import vector_index
    from apps.retrieval import vectors

    out = {}
    for user in READERS:
        total, hit = 0, 0
        for vector in query_vectors[: args.recall_queries]:
            got = vector_index.nearest_conversations(provider=provider, query_vector=vector, user_id=user, count=LIMIT)
            scope_sql, params = vector_index._scope(user, provider.dimension, vectors.model_tag(provider))
            exact = vector_index._exact(int(provider.dimension), vectors.vector_literal(vector), scope_sql, params,
                                        LIMIT, None)
            truth = {n.conversation_id for n in exact}
            total += len(truth)
            hit += len(truth & {n.conversation_id for n in got})
        threshold = settings.MEMORY_VECTOR_EXACT_SCAN_THRESHOLD
        out[user] = round(hit / total, 4) if total else float("nan")
        h.log(f"recall@{LIMIT} {user}: {out[user]} (exact plan when scope <= {threshold} vectors)")
    return out


def measure_lag(args, server: h.WebServer, token: str) -> dict[str, Any]:
    session = h.HttpSession(server.host, server.port, {"Authorization": f"Bearer {token}"})
    lags = []
    try:
        for j in range(args.lag_writes + 2):
            word = f"zq{uuid.uuid4().hex[:10]}"
            cid = uuid.uuid4()
            started = time.perf_counter()
            session.json("POST", f"/v1/conversations/{cid}/entries",
                         {"content": [{"role": "USER", "text": f"lag probe {word} about the harbour"}]})
            while True:
                data = session.json("POST", "/v1/conversations/search",
                                    {"query": word, "searchType": "fulltext", "limit": 1})["data"]
                if data:
                    break
                if time.perf_counter() - started > 120:
                    raise h.BenchError("index lag: an appended entry was not searchable after 120 s (worker log?)")
                time.sleep(0.005)
            if j >= 2:  # two unmeasured writes: the worker's model load
                lags.append(time.perf_counter() - started)
    finally:
        session.close()
    ordered = sorted(lags)
    return {"writes": len(lags), "lag_p50_ms": round(h.percentile(ordered, 50) * 1000, 1),
            "lag_p95_ms": round(h.percentile(ordered, 95) * 1000, 1), "lag_max_ms": round(ordered[-1] * 1000, 1)}


# --- Main -----------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    h.install_sigterm_handler()
    server_url = h.embedded_postgres_url()
    database_url = h.recreate_database(server_url, BENCH_DB)
    h.migrate(database_url, hnsw_indexes=False)
    redis_url = sem.bench_redis_url()
    h.setup_django(database_url, EMBEDDING_PROVIDER="local", REDIS_URL=redis_url)
    from django.db import connection

    from apps.retrieval import vectors
    from apps.retrieval.embeddings import get_provider

    provider = get_provider()
    model = vectors.model_tag(provider)
    sentences = sem.base_sentences(1000, args.seed)
    centroids = sem.centroid_embeddings(sentences)
    sem_queries = sem.query_texts(60, args.seed + 1)
    ft_queries = fulltext_queries(60, args.seed + 2)
    query_vectors = [provider.embed_query(q) for q in sem_queries]
    env = {"REDIS_URL": redis_url, "EMBEDDING_PROVIDER": "local"}
    info = h.machine_info(database_url)
    report: dict[str, Any] = {"machine": info, "command": h.command_line(), "sizes": [], "rows": []}
    try:
        for position, size in enumerate(args.sizes):
            if position:
                connection.close()
                database_url = h.recreate_database(server_url, BENCH_DB)
                h.migrate(database_url, hnsw_indexes=False)
                vectors.forget_checked()
            loaded = load(database_url, size, sentences, centroids, model, args.seed + size)
            h.log(f"{size:,} entries in {loaded['conversations']:,} conversations loaded in {loaded['load_seconds']}s")
            build_seconds = build_index(provider.dimension)
            h.log(f"HNSW index built in {build_seconds}s")
            size_info = {"size": size, "conversations": loaded["conversations"], "load_seconds": loaded["load_seconds"],
                         "hnsw_build_seconds": build_seconds, "entries_in_scope": loaded["entries_in_scope"],
                         "load_avg_before": " ".join(f"{v:.2f}" for v in os.getloadavg())}
            size_info["recall_at_20"] = recall(args, query_vectors, provider)
            with h.web_server(database_url, workers=args.web_workers, log_path=h.RESULTS_DIR / "conversation-search-server.log",
                              extra_env=env) as server:
                tokens = {user: h.mint_token(server.base_url, user, user) for user in READERS}
                report["rows"] += measure(args, size, server, tokens, loaded["entry_ids"], database_url, ft_queries,
                                          sem_queries, query_vectors, provider)
                if position == len(args.sizes) - 1 and args.lag_writes:
                    with sem.celery_worker(database_url, env, h.RESULTS_DIR / "conversation-search-worker.log"):
                        size_info["index_lag"] = measure_lag(args, server, tokens["bob"])
                        h.log(f"index lag {size_info['index_lag']}")
            size_info["load_avg_after"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
            report["sizes"].append(size_info)
    except KeyboardInterrupt:
        h.log("interrupted")
        return 130
    finally:
        connection.close()
    path = h.write_json("conversation-search", report)
    print_report(report)
    h.log(f"results in {path}")
    return 0


def print_report(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(f"## Conversation search ({m['date']}, {m['nproc']} CPUs, {m['cpu']}, PostgreSQL {m['postgres']}, "
          f"load average at start {m['load_avg_at_start']})\n")
    print(f"`{report['command']}`\n")
    rows = [[r["size"], r["user"], r["what"], r["query_embedding"], r["concurrency"], r["p50_ms"], r["p95_ms"],
             r["p99_ms"], r["throughput_per_s"], r["floor_p50_ms"], r["p50_over_floor"]] for r in report["rows"]]
    print(h.markdown_table(["entries", "user (scope)", "path", "query embedding", "c", "p50 ms", "p95 ms", "p99 ms",
                            "req/s", "floor p50 ms", "p50/floor"], rows, "lllllrrrrrr"))
    print()
    for s in report["sizes"]:
        print(f"- {s['size']:,} entries ({s['conversations']:,} conversations): load {s['load_seconds']} s, HNSW build "
              f"{s['hnsw_build_seconds']} s, entries in scope {s['entries_in_scope']}, recall@20 {s['recall_at_20']}, "
              f"load average {s['load_avg_before']} -> {s['load_avg_after']}"
              + (f", index lag {json.dumps(s['index_lag'])}" if "index_lag" in s else ""))


if __name__ == "__main__":
    h.run_main(main)
