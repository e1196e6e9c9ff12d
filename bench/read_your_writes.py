"""Read your writes (issue 30.2): what a PUT and a search cost with each way of making a new version searchable by
meaning at once, against today's, interleaved in one run.

Two servers (the Procfile's web line, same database, same worker count) differ only in their settings:

* ``today``: MEMORY_INLINE_INDEX_MAX_CHARS=0, MEMORY_SEARCH_PENDING_LIMIT=0: every index text is embedded by the
  background indexer (none runs here, so a pending version stays pending);
* ``new``: the settings under test (``--inline-chars``, ``--pending-limit``).

PUT cases (c1, one request of each case in turn, in shuffled order, so load from other processes falls on all of
them alike): without index, and with a short index text (about 120 characters), on each server.

Search cases (c1, interleaved the same way): a scope of ``--indexed`` indexed memories with 0, 1 and 8 pending
versions in it, on each server. The pending ones were PUT to ``today`` (no inline embedding) and stay pending.

Run: ``.venv/bin/python bench/read_your_writes.py`` (``--rounds`` per case, default 300).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import uuid
from collections.abc import Sequence
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
    parser.add_argument("--inline-chars", type=int, default=200, help="the new server's MEMORY_INLINE_INDEX_MAX_CHARS")
    parser.add_argument("--pending-limit", type=int, default=0, help="the new server's MEMORY_SEARCH_PENDING_LIMIT")
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


def timed(session: h.HttpSession, method: str, path: str, body: Any) -> tuple[float, bytes]:
    started = time.perf_counter()
    _, data = session.request(method, path, body)
    return time.perf_counter() - started, data


def interleave(cases: dict[str, Any], rounds: int, rng: random.Random) -> dict[str, list[float]]:
    """Each case is a function of the round number returning its latency; one call of each per round, in a shuffled
    order."""
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
    settings = {
        "today": {"MEMORY_INLINE_INDEX_MAX_CHARS": "0", "MEMORY_SEARCH_PENDING_LIMIT": "0"},
        "new": {
            "MEMORY_INLINE_INDEX_MAX_CHARS": str(args.inline_chars),
            "MEMORY_SEARCH_PENDING_LIMIT": str(args.pending_limit),
        },
    }
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(h.web_server(
                database_url, workers=args.web_workers, log_path=h.RESULTS_DIR / f"ryw-{name}.log", extra_env=env,
            ))
            for name, env in settings.items()
        }  # fmt: skip
        sessions = {}
        for name, server in servers.items():
            token = h.mint_token(server.base_url, USER, PASSWORD)
            sessions[name] = h.HttpSession(server.host, server.port, {"Authorization": f"Bearer {token}"})
            stack.callback(sessions[name].close)
        indexer = "new" if args.inline_chars > 0 else None

        # Search scopes: --indexed memories each (written through the inline server, or indexed in-process), plus
        # 0, 1 or 8 versions left pending (written through today's server, which has no worker behind it).
        scopes = {pending: [*ROOT, f"scope-{pending}"] for pending in (0, 1, 8)}
        for pending, scope in scopes.items():
            for n in range(args.indexed):
                sessions[indexer or "today"].request("PUT", "/v1/memories", put_body(scope, f"i{n}", short_text(rng, n)))
            for n in range(pending):
                sessions["today"].request("PUT", "/v1/memories", put_body(scope, f"p{n}", short_text(rng, n)))
        if indexer is None:
            h.setup_django(database_url)
            from apps.memories.indexer import run_cycle

            run_cycle()
            for pending, scope in scopes.items():
                for n in range(pending):
                    sessions["today"].request("PUT", "/v1/memories", put_body(scope, f"p{n}", short_text(rng, n)))
        h.log("search scopes loaded")

        # Warm both servers (connections, policy engine, the model's first passes).
        for name in servers:
            for n in range(30):
                sessions[name].request("PUT", "/v1/memories", put_body([*ROOT, "warm"], f"{name}{n}", short_text(rng, n)))
                sessions[name].request("POST", "/v1/memories/search", {"namespace_prefix": scopes[0], "query": "tea"})

        run = uuid.uuid4().hex[:6]

        def put_case(name: str, indexed: bool) -> Any:
            namespace = [*ROOT, "puts", f"{name}-{'index' if indexed else 'plain'}"]
            return lambda i: timed(
                sessions[name], "PUT", "/v1/memories",
                put_body(namespace, f"{run}-{i}", short_text(rng, i) if indexed else None),
            )[0]  # fmt: skip

        puts = interleave(
            {f"PUT {'short index' if indexed else 'no index'} ({name})": put_case(name, indexed)
             for name in servers for indexed in (False, True)},
            args.rounds, rng,
        )  # fmt: skip
        h.log("PUTs measured")

        queries = [f"what did bob say about the {subject}" for subject in SUBJECTS]

        def search_case(name: str, pending: int) -> Any:
            return lambda i: timed(
                sessions[name], "POST", "/v1/memories/search",
                {"namespace_prefix": scopes[pending], "query": queries[i % len(queries)], "limit": 10},
            )[0]  # fmt: skip

        searches = interleave(
            {f"search, {pending} pending ({name})": search_case(name, pending) for name in servers for pending in (0, 1, 8)},
            args.rounds, rng,
        )  # fmt: skip
        h.log("searches measured")

        # Read your writes, checked: a PUT to the new server, then a search for its words, finds it at once.
        found = 0
        for n in range(20):
            text = f"bob's locker code is {rng.randint(1000, 9999)} at the {rng.choice(SUBJECTS)} club"
            key = f"{run}-check-{n}"
            sessions["new"].request("PUT", "/v1/memories", put_body([*ROOT, "check"], key, text))
            hits = sessions["new"].json(
                "POST", "/v1/memories/search", {"namespace_prefix": [*ROOT, "check"], "query": text, "limit": 3}
            )["items"]
            found += any(hit["key"] == key for hit in hits)

    rows = [[name, f"{s['p50_ms']:.2f}", f"{s['p95_ms']:.2f}", s["n"]]
            for name, s in ((name, summary(values)) for name, values in {**puts, **searches}.items())]  # fmt: skip
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    text = "\n".join([
        f"Read your writes: today vs new ({settings['new']}), c1, interleaved; load average at end {load}",
        "",
        h.markdown_table(["case", "p50 ms", "p95 ms", "n"], rows),
        "",
        f"new server: PUT then search at once found the version {found}/20 times",
    ])  # fmt: skip
    print(text)
    h.write_json("read_your_writes", {
        "command": h.command_line(), "settings": settings, "load_avg_at_end": load,
        "cases": {name: summary(values) for name, values in {**puts, **searches}.items()}, "found_at_once": found,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    h.run_main(main)
