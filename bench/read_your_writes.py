"""Read your writes (issue 30.2): what a PUT and a semantic search cost when a search also scores the versions the
indexer has not embedded yet (apps.memories.fresh), against today's, interleaved in one run.

Two servers (the Procfile's web line, same database, same worker count) differ only in one setting:

* ``today``: MEMORY_SEARCH_PENDING_LIMIT=0, a version is found by meaning once the indexer has embedded it;
* ``new``: MEMORY_SEARCH_PENDING_LIMIT=``--pending-limit`` (default 16, the setting's default).

No indexer runs while anything is timed, so a version written during the run stays pending. The search scopes'
``--indexed`` memories are embedded by this process's indexer first.

PUT cases, c1: without index and with a short index text (about 120 characters), on each server. Search cases, c1:
a scope with nothing pending; a scope with 8 pending versions the server has embedded before (its cache); a search
right after a PUT of one new version into its scope (an agent that remembers, then recalls: one version the server
has not seen); and right after 8 such PUTs (a burst). The untimed PUTs go to ``today``'s server, so ``new``'s has
never seen them. Each round runs every case once, in a shuffled order, so load from other processes on the machine
falls on all of them alike.

Run: ``.venv/bin/python bench/read_your_writes.py`` (``--rounds`` per case, default 300).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import _harness as h

BENCH_DB = "memory_service_bench_ryw"
USER, PASSWORD = "bob", "bob"
ROOT = ["user", USER, "ryw"]
SUBJECTS = "tea coffee lisbon kyoto router laptop budget deadline standup roadmap garden piano".split()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300, help="requests per case (default 300)")
    parser.add_argument("--indexed", type=int, default=100, help="indexed memories per search scope (default 100)")
    parser.add_argument("--pending-limit", type=int, default=16, help="the new server's MEMORY_SEARCH_PENDING_LIMIT")
    parser.add_argument("--web-workers", type=int, default=1, help="gunicorn --workers per server (default 1)")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def short_text(rng: random.Random, n: int) -> str:
    subject = rng.choice(SUBJECTS)
    text = f"bob noted something about the {subject} on day {n}; reference SW{rng.randint(1000, 9999)}, keep it"
    return (text + " in mind for the next conversation")[:120]


def put_body(namespace: list[str], key: str, text: str | None) -> bytes:
    body: dict[str, Any] = {"namespace": namespace, "key": key, "value": {"text": text or key, "n": key}}
    if text is not None:
        body["index"] = {"text": text}
    return json.dumps(body).encode()


def send(session: h.HttpSession, method: str, path: str, body: Any) -> bytes:
    """One request; once more on a connection the server closed while it sat idle (its keep-alive timeout)."""
    try:
        return session.request(method, path, body)[1]
    except OSError:
        return session.request(method, path, body)[1]


def timed(session: h.HttpSession, method: str, path: str, body: Any) -> float:
    started = time.perf_counter()
    send(session, method, path, body)
    return time.perf_counter() - started


def interleave(cases: dict[str, Callable[[int], float]], rounds: int, rng: random.Random) -> dict[str, list[float]]:
    """Each case is a function of the round number returning its latency; one call of each per round, shuffled."""
    latencies: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for i in range(rounds):
        rng.shuffle(names)
        for name in names:
            latencies[name].append(cases[name](i))
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"p50_ms": h.percentile(ordered, 50) * 1000, "p95_ms": h.percentile(ordered, 95) * 1000, "n": len(ordered)}


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    h.install_sigterm_handler()
    rng = random.Random(args.seed)
    server_url = h.embedded_postgres_url()
    database_url = h.recreate_database(server_url, BENCH_DB)
    h.migrate(database_url)
    h.setup_django(database_url)
    settings = {
        "today": {"MEMORY_SEARCH_PENDING_LIMIT": "0"},
        "new": {"MEMORY_SEARCH_PENDING_LIMIT": str(args.pending_limit)},
    }
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(h.web_server(
                database_url, workers=args.web_workers, log_path=h.RESULTS_DIR / f"read-your-writes-{name}.log",
                extra_env=env,
            ))
            for name, env in settings.items()
        }  # fmt: skip
        sessions = {}
        for name, server in servers.items():
            token = h.mint_token(server.base_url, USER, PASSWORD)
            sessions[name] = h.HttpSession(server.host, server.port, {"Authorization": f"Bearer {token}"})
            stack.callback(sessions[name].close)

        def put(namespace: list[str], key: str, text: str | None, server: str = "today") -> None:
            send(sessions[server], "PUT", "/v1/memories", put_body(namespace, key, text))

        # Each server searches scopes of its own, so the versions written for one case never show in another's.
        scopes = {
            (scope, server): [*ROOT, server, scope]
            for scope in ("none-pending", "eight-pending", "after-put", "after-burst") for server in servers
        }  # fmt: skip
        for scope in scopes.values():
            for n in range(args.indexed):
                put(scope, f"i{n}", short_text(rng, n))
        from apps.memories.indexer import run_cycle

        run_cycle()
        for server in servers:
            for n in range(8):
                put(scopes["eight-pending", server], f"p{n}", short_text(rng, n))
        h.log("search scopes loaded and indexed")

        queries = [f"what did bob say about the {subject}" for subject in SUBJECTS]
        for name in servers:  # connections, the policy engine, the model's first passes, the cache of eight-pending
            for n in range(20):
                put([*ROOT, "warm"], f"{name}{n}", short_text(rng, n), server=name)
                for (_scope, server), prefix in scopes.items():
                    if server == name:
                        body = {"namespace_prefix": prefix, "query": queries[n % len(queries)]}
                        send(sessions[name], "POST", "/v1/memories/search", body)

        run = uuid.uuid4().hex[:6]

        def put_case(name: str, indexed: bool) -> Callable[[int], float]:
            namespace = [*ROOT, "puts", f"{name}-{'index' if indexed else 'plain'}"]
            return lambda i: timed(
                sessions[name], "PUT", "/v1/memories",
                put_body(namespace, f"{run}-{i}", short_text(rng, i) if indexed else None),
            )  # fmt: skip

        puts = interleave(
            {f"PUT {'short index' if indexed else 'no index'} ({name})": put_case(name, indexed)
             for name in servers for indexed in (False, True)},
            args.rounds, rng,
        )  # fmt: skip
        h.log("PUTs measured")

        def search_case(name: str, scope: str, writes_before: int) -> Callable[[int], float]:
            def call(i: int) -> float:
                for n in range(writes_before):  # untimed, through today's server: never seen by `new`
                    put(scopes[scope, name], f"{run}-{i}-{n}", short_text(rng, i))
                body = {"namespace_prefix": scopes[scope, name], "query": queries[i % len(queries)], "limit": 10}
                return timed(sessions[name], "POST", "/v1/memories/search", body)

            return call

        search_cases = {
            "search, nothing pending": ("none-pending", 0),
            "search, 8 pending seen before": ("eight-pending", 0),
            "search right after a PUT": ("after-put", 1),
            "search right after 8 PUTs": ("after-burst", 8),
        }
        searches = interleave(
            {f"{label} ({name})": search_case(name, scope, writes)
             for name in servers for label, (scope, writes) in search_cases.items()},
            args.rounds, rng,
        )  # fmt: skip
        h.log("searches measured")

        # Read your writes, checked: a PUT, then a search for its words on the other server, finds it at once.
        found = {name: 0 for name in servers}
        for name in servers:
            for n in range(20):
                text = f"bob's locker code is {rng.randint(1000, 9999)} at the {rng.choice(SUBJECTS)} club"
                key = f"{run}-check-{name}-{n}"
                put([*ROOT, "check", name], key, text)
                body = {"namespace_prefix": [*ROOT, "check", name], "query": text, "limit": 3}
                hits = json.loads(send(sessions[name], "POST", "/v1/memories/search", body))["items"]
                found[name] += any(hit["key"] == key for hit in hits)

    cases = {name: summary(values) for name, values in {**puts, **searches}.items()}
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    rows = [[name, f"{s['p50_ms']:.2f}", f"{s['p95_ms']:.2f}", s["n"]] for name, s in cases.items()]
    text = "\n".join([
        f"Read your writes: today (pending limit 0) vs new (pending limit {args.pending_limit}), c1, interleaved, "
        f"{args.web_workers} web worker(s) each; load average at end {load}",
        "",
        h.markdown_table(["case", "p50 ms", "p95 ms", "n"], rows),
        "",
        "PUT then an immediate search for its text found it: "
        + ", ".join(f"{name} {count}/20" for name, count in found.items()),
    ])  # fmt: skip
    print(text)
    h.write_json("read_your_writes", {
        "command": h.command_line(), "settings": settings, "load_avg_at_end": load, "cases": cases,
        "found_at_once": found,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    h.run_main(main)
